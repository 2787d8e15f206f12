//! `cutover`: the move from the embedded store to the cluster while careful
//! clients keep calling (docs/deploy.md, "Moving from the embedded store to
//! ScyllaDB").
//!
//! The operator's steps, with the binary under test, as the docs give
//! them: `idemd backup` of the serving embedded idemd, `idemd copy-to-cql
//! --from-backup` while it serves, a second backup and the catch-up to it
//! (`--from-backup LATER --since-backup FIRST`, still serving), its SIGTERM,
//! `idemd copy-to-cql --since-backup LATER`, then `idemd --store cql`. The workers call the embedded
//! replica and the cluster's replica (not started before the cut-over: a
//! refused connection moves them to the other, as a load balancer would),
//! retrying through the stop; their history is judged by the suite's
//! checker, with the final reads from the cluster: every acknowledged key
//! replays there, no key has two holders.
//!
//! Beside them, holders claim keys with a 30 s lease under `on_expired_lease
//! = "takeover"` on the embedded replica just before the stop, and the stop is
//! held past [`STOP`] (longer than the lease): once the cluster serves,
//! contenders claim the same keys there (each must be told `in_progress`:
//! a takeover now would run the key twice), then the holders complete with
//! the tokens they had. Also checked: a replica on the cluster refuses to
//! start between the bulk copy and the last step, and an embedded idemd
//! started on the moved store refuses.

use std::path::Path;
use std::time::{Duration, Instant};

use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;

use crate::harness::history::response_body;
use crate::harness::report::Report;
use crate::harness::run::{Run, Setup};
use crate::harness::workload::{Load, claim_request};
use crate::plumbing::cluster::Cluster;
use crate::plumbing::grpc::{ENDPOINT, channel, request};
use crate::plumbing::server::{Server, tail};

/// The holders' lease: shorter than the stop.
const LEASE: Duration = Duration::from_secs(30);
/// How long the stop lasts at least (old replica's SIGTERM to the start on
/// the cluster): longer than [`LEASE`].
const STOP: Duration = Duration::from_secs(35);
/// Keys held across the stop.
const HOLDERS: usize = 4;

/// The scenario (see the module docs).
pub async fn cutover(cluster: &Cluster, setup: &Setup<'_>) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("idemd.toml");
    std::fs::write(
        &config,
        format!("[endpoints.\"{ENDPOINT}\"]\non_expired_lease = \"takeover\"\n"),
    )?;
    let config_flags = vec!["--config".to_string(), config.display().to_string()];
    let (data, backup) = (dir.path().join("data"), dir.path().join("backup"));
    let later = dir.path().join("later");
    let mut cql_flags = cluster.flags();
    cql_flags.extend(config_flags.clone());
    let new = Server::new(setup.bin, &dir.path().join("cql"), setup.log_dir, cql_flags)?;
    let old = Server::new(setup.bin, &data, setup.log_dir, config_flags)?;
    // The workers retry through the whole stop.
    let load = Load {
        heal_budget: STOP * 3,
        ..setup.load.clone()
    };
    // servers[0], the cluster's replica, is where the final reads go.
    let mut run = Run::start_some(vec![new, old], &[1], &load, dir).await?;
    let old_address = run.servers[1].address.clone();
    tokio::time::sleep(Duration::from_secs(2)).await;

    run.history.phase("bulk");
    // The copies take the cluster's flags, not the server's `--store`, and
    // run as an operator runs a batch job beside live traffic on a small
    // cluster: fewer writes in flight, a longer timeout than the replicas'.
    let mut cluster_args = Vec::new();
    let mut flags = cluster.flags().into_iter();
    while let Some(flag) = flags.next() {
        if flag == "--store" || flag == "--cql-request-timeout" {
            flags.next();
        } else {
            cluster_args.push(flag);
        }
    }
    cluster_args.extend(["--cql-request-timeout", "10s", "--in-flight", "32"].map(String::from));
    let operator = Operator {
        bin: setup.bin,
        data: &data,
        cluster: &cluster_args,
    };
    let mut notes = Vec::new();
    operator.run(&["backup", "--to", &backup.display().to_string()], true)?;
    let bulk = operator.copy("--from-backup", &backup)?;
    notes.push(format!("bulk copied while serving: {}", bulk.trim()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Between the bulk and the last step, no replica starts on the
    // keyspace.
    match run.servers[0]
        .start_expecting_exit(Duration::from_secs(20))
        .await?
    {
        Some(status) if !status.success() && run.servers[0].log().contains("is being filled") => {
            notes.push("a replica started between the bulk and the last step: refused".into());
        }
        other => {
            let _ = run.servers[0].kill9().await;
            run.history.unexpected(format!(
                "a replica started on the keyspace before the copy's last step: {other:?}: {}",
                tail(&run.servers[0].log())
            ));
        }
    }

    // What the workers changed during the bulk, copied while serving.
    run.history.phase("catch-up");
    operator.run(&["backup", "--to", &later.display().to_string()], true)?;
    let catchup = operator.run(
        &[
            "copy-to-cql",
            "--from-backup",
            &later.display().to_string(),
            "--since-backup",
            &backup.display().to_string(),
        ],
        false,
    )?;
    notes.push(format!("caught up while serving: {}", catchup.trim()));

    // Claimed just before the stop, so that their leases are live when it
    // begins (the bulk and the catch-up take longer than a lease under
    // load): the stop alone is longer than them.
    let mut held = Vec::new();
    let run_id = format!("{:08x}", rand::random::<u32>());
    for holder in 0..HOLDERS {
        let key = format!("cutover-{run_id}-held-{holder}");
        let token = claim_held(&old_address, &key).await?;
        run.history.claimed(&key, &token);
        held.push((key, token));
    }

    run.history.phase("stop");
    let stopped = Instant::now();
    run.servers[1].stop().await?;
    let delta = operator.copy("--since-backup", &later)?;
    let copied_in = stopped.elapsed();
    notes.push(format!(
        "changes copied {:.1} s after the SIGTERM: {}",
        copied_in.as_secs_f64(),
        delta.trim()
    ));
    match run.servers[1]
        .start_expecting_exit(Duration::from_secs(20))
        .await?
    {
        Some(status)
            if !status.success() && run.servers[1].log().contains("moved to the CQL keyspace") =>
        {
            notes.push("an embedded idemd on the moved store: refused".into());
        }
        other => {
            let _ = run.servers[1].kill9().await;
            run.history.unexpected(format!(
                "an embedded idemd started on the moved store: {other:?}: {}",
                tail(&run.servers[1].log())
            ));
        }
    }
    tokio::time::sleep(STOP.saturating_sub(stopped.elapsed())).await;
    let start = run.servers[0].start().await?;
    let stop = stopped.elapsed();
    notes.push(format!(
        "the stop: {:.1} s from the SIGTERM to the cluster's replica serving (held past the {} s leases on purpose)",
        stop.as_secs_f64(),
        LEASE.as_secs()
    ));

    run.history.phase("after");
    let new_address = run.servers[0].address.clone();
    let mut taken_over = 0;
    for (key, token) in &held {
        match contend(&new_address, key).await? {
            Some(other) => {
                taken_over += 1;
                run.history.claimed(key, &other);
            }
            None => run.history.status("contender in_progress"),
        }
        let body = response_body(key, token);
        if complete(&new_address, key, token, &body).await? {
            run.history.acked(key, &body);
        } else {
            run.history.unexpected(format!(
                "the holder of {key} could not complete after the move"
            ));
        }
    }
    notes.push(format!(
        "{HOLDERS} keys held across the stop: {taken_over} taken over by a contender on the cluster"
    ));
    run.finish(
        "cutover",
        format!(
            "the move to the cluster under load: backup and bulk copy while serving, SIGTERM, the changes copied, the cluster's replica started {:.0} s after the SIGTERM; {HOLDERS} keys held with {} s leases and takeover across the stop",
            stop.as_secs_f64(),
            LEASE.as_secs()
        ),
        vec![u64::try_from(start.as_millis()).unwrap_or(u64::MAX)],
        notes,
    )
    .await
}

/// The operator's commands: the binary under test on the old data
/// directory, with the cluster's flags for the copies.
struct Operator<'a> {
    /// The binary under test.
    bin: &'a Path,
    /// The embedded store's data directory.
    data: &'a Path,
    /// `idemd` flags naming the cluster and keyspace.
    cluster: &'a [String],
}

impl Operator<'_> {
    /// Runs `idemd ARGS --data-dir DATA` (and the cluster's flags unless
    /// `local`); its stdout, or an error with its stderr.
    fn run(&self, args: &[&str], local: bool) -> anyhow::Result<String> {
        let mut command = std::process::Command::new(self.bin);
        command.args(args).arg("--data-dir").arg(self.data);
        if !local {
            command.args(self.cluster);
        }
        let output = command.env("IDEMD_METRICS_LISTEN", "off").output()?;
        if !output.status.success() {
            anyhow::bail!(
                "idemd {} failed ({}): {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `idemd copy-to-cql STEP BACKUP`.
    fn copy(&self, step: &str, backup: &Path) -> anyhow::Result<String> {
        self.run(&["copy-to-cql", step, &backup.display().to_string()], false)
    }
}

/// Claims `key` with [`LEASE`] on `address`; its token.
async fn claim_held(address: &str, key: &str) -> anyhow::Result<String> {
    let mut client = IdempotencyClient::new(channel(address, Duration::from_secs(3))?);
    let mut claim = claim_request(key, "holder");
    claim.lease = Some(prost_types::Duration {
        seconds: i64::try_from(LEASE.as_secs())?,
        nanos: 0,
    });
    match client.claim(request(claim)).await?.into_inner().outcome {
        Some(pb::claim_response::Outcome::Claimed(lease)) => Ok(lease.lease_token),
        other => anyhow::bail!("a fresh key to hold was not granted: {other:?}"),
    }
}

/// A contender's Claim of a held key on `address`: the token it was
/// granted (a takeover), or `None` when told the key is in progress.
async fn contend(address: &str, key: &str) -> anyhow::Result<Option<String>> {
    let mut client = IdempotencyClient::new(channel(address, Duration::from_secs(3))?);
    let claim = claim_request(key, "contender");
    match client.claim(request(claim)).await?.into_inner().outcome {
        Some(pb::claim_response::Outcome::Claimed(lease)) => Ok(Some(lease.lease_token)),
        Some(pb::claim_response::Outcome::InProgress(_)) => Ok(None),
        other => anyhow::bail!("a contender for a held key got {other:?}"),
    }
}

/// The holder's Complete on `address`, retried for a while (the replica
/// has just started); whether it was acknowledged.
async fn complete(address: &str, key: &str, token: &str, body: &[u8]) -> anyhow::Result<bool> {
    let mut client = IdempotencyClient::new(channel(address, Duration::from_secs(3))?);
    let complete = pb::CompleteRequest {
        endpoint: ENDPOINT.to_string(),
        key: key.to_string(),
        lease_token: token.to_string(),
        response: Some(pb::StoredResponse {
            status: 201,
            headers: Vec::new(),
            body: body.to_vec(),
            ..Default::default()
        }),
    };
    for _ in 0..10 {
        match client.complete(request(complete.clone())).await {
            Ok(_) => return Ok(true),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(_) => return Ok(false),
        }
    }
    Ok(false)
}
