//! `idemd-bench cutover`: the downtime of the move from the embedded store
//! to a CQL cluster (docs/deploy.md, "Moving from the embedded store to
//! ScyllaDB"). Fills an embedded store with `--records` live records
//! written through the store itself (no server: the fill is set-up, not
//! the measurement), a mix of what a busy node holds (COMPLETED with a
//! response, IN_PROGRESS, FAILED, UNKNOWN), then runs the short cut-over
//! as an operator does, with the release binary:
//!
//! 1. `idemd serve` on the store (the old node, serving throughout 2-3
//!    Claim + Complete pairs of fresh keys at `--change-rate` per second:
//!    the changes the stop has to carry);
//! 2. `idemd backup` (timed), `idemd copy-to-cql --from-backup` (timed:
//!    the bulk, while serving);
//! 3. catch-ups while more than `--catchup-above` pairs were served since
//!    the last backup (at most [`MAX_CATCHUPS`]): a new backup and
//!    `copy-to-cql --from-backup NEW --since-backup LAST` (timed);
//! 4. the old node stopped (SIGTERM), `idemd copy-to-cql --since-backup
//!    LAST`, `idemd --store cql` started until it answers its first
//!    Claim: the stop, timed from the SIGTERM (issue 50: ≤ 10 s at 10^6
//!    records).
//!
//! `--whole` times the long stop instead (one `copy-to-cql` of the whole
//! store while nothing serves), the baseline the short one replaces.
//!
//! The keyspace must be reachable at `--cql-nodes`; it is migrated first
//! (`idemd migrate`, idempotent, not timed). Each run writes tenants of its
//! own, so runs never meet.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use idemd::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idemd::store::{Record, RecordKey, RecordState, Store, StoredResponse};

use crate::servers;

/// `idemd-bench cutover`.
#[derive(Debug, Args)]
pub struct CutoverArgs {
    /// The idemd binary (default: `idemd` next to this binary).
    #[arg(long)]
    pub idemd_bin: Option<PathBuf>,
    /// Live records in the embedded store.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: usize,
    /// CQL contact points of the target.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:9042")]
    pub cql_nodes: Vec<String>,
    /// `--in-flight` of `idemd copy-to-cql`.
    #[arg(long, default_value_t = idemd::store::transfer::DEFAULT_IN_FLIGHT)]
    pub in_flight: usize,
    /// Keep the filled store here (and reuse it when it exists) instead of
    /// a scratch directory removed at the end.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Only fill the store (with `--data-dir`): to run the copy by hand.
    #[arg(long, requires = "data_dir")]
    pub fill_only: bool,
    /// Claim + Complete pairs of fresh keys per second the old node serves
    /// from its start to its stop: the changes the catch-ups and the
    /// stop's copy carry. The default is what a node holding 10^6 live
    /// keys of a 24 h window receives on average (10^6 / 86,400 s).
    #[arg(long, default_value_t = 12.0)]
    pub change_rate: f64,
    /// Catch up (a new backup, the changes since the last one copied
    /// while serving) while more pairs than this were served since the
    /// last backup; then stop.
    #[arg(long, default_value_t = 1_000)]
    pub catchup_above: u64,
    /// Time the long stop instead: one copy of the whole store while
    /// nothing serves.
    #[arg(long)]
    pub whole: bool,
}

/// Writes in flight while filling: enough to fill the writer's batches.
const FILL_IN_FLIGHT: usize = 512;

/// Tenants the records are spread over.
const TENANTS: usize = 4;

/// Catch-ups at most: each carries the changes made during the one before,
/// so a rate the copy keeps up with converges in a few.
const MAX_CATCHUPS: usize = 4;

/// Pairs of the change load in flight at most.
const CHANGES_IN_FLIGHT: usize = 64;

/// Runs the cut-over measurement; false when the copy failed.
pub async fn run(args: CutoverArgs) -> Result<bool> {
    let bin = crate::embedded::idemd_bin(args.idemd_bin.as_deref())?;
    let scratch = servers::scratch_dir("cutover")?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| scratch.join("data"));
    let outcome = measure(&args, &bin, &data_dir, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    outcome
}

async fn measure(args: &CutoverArgs, bin: &Path, data_dir: &Path, scratch: &Path) -> Result<bool> {
    if EmbeddedStore::database_path(data_dir).exists() {
        println!("reusing the store in {}", data_dir.display());
    } else {
        fill(data_dir, args.records).await?;
    }
    if args.fill_only {
        return Ok(true);
    }
    servers::migrate_cql(bin, &args.cql_nodes).await?;
    if args.whole {
        return whole(args, bin, data_dir, scratch).await;
    }
    let nodes = args.cql_nodes.join(",");

    // The old node serves through the backups, the bulk and the catch-ups.
    let grpc: std::net::SocketAddr = ([127, 0, 0, 1], servers::free_port()?).into();
    let serve = ["--listen", &grpc.to_string(), "--metrics-listen", "off"].map(String::from);
    let started = Instant::now();
    let mut old =
        servers::start_idemd_on(bin, data_dir, &scratch.join("old.log"), &serve, false).await?;
    crate::embedded::wait_ready(&mut old, grpc, started).await?;
    let load = ChangeLoad::start(grpc, args.change_rate).await?;

    let copy = |step: &[&Path]| {
        let mut command = tokio::process::Command::new(bin);
        command
            .arg("copy-to-cql")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--cql-nodes", &nodes])
            .args(["--in-flight", &args.in_flight.to_string()]);
        if let [from, rest @ ..] = step {
            command.arg("--from-backup").arg(from);
            if let [since] = rest {
                command.arg("--since-backup").arg(since);
            }
        }
        command
    };
    // Pass 0 is the bulk, the others catch-ups.
    let mut passes: Vec<Pass> = Vec::new();
    let mut last: Option<PathBuf> = None;
    loop {
        let since_last = load.served() - passes.last().map_or(0, |pass| pass.served_before);
        if passes.len() > MAX_CATCHUPS || (!passes.is_empty() && since_last <= args.catchup_above) {
            break;
        }
        let backup = scratch.join(format!("backup-{}", passes.len()));
        let served_before = load.served();
        let (backup_time, ok) = timed(
            tokio::process::Command::new(bin)
                .arg("backup")
                .arg("--data-dir")
                .arg(data_dir)
                .arg("--to")
                .arg(&backup),
        )
        .await?;
        if !ok {
            println!("idemd backup failed");
            return Ok(false);
        }
        let step: Vec<&Path> = [Some(backup.as_path()), last.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        let (copy_time, ok) = timed(&mut copy(&step)).await?;
        if !ok {
            println!("copy-to-cql {step:?} failed");
            return Ok(false);
        }
        let pass = Pass {
            served_before,
            since_last,
            backup_time,
            copy_time,
        };
        println!("{}", pass.line(passes.len(), args.records));
        passes.push(pass);
        last = Some(backup);
    }
    let last = last.context("no backup was copied")?;
    let since_last = load.served() - passes.last().map_or(0, |pass| pass.served_before);
    let failed_pairs = load.stop().await;

    // The stop: from the old node's SIGTERM to the first Claim on CQL.
    let stop_started = Instant::now();
    old.stop().await?;
    let stopped = stop_started.elapsed();
    let mut since = tokio::process::Command::new(bin);
    since
        .arg("copy-to-cql")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--since-backup")
        .arg(&last)
        .args(["--cql-nodes", &nodes])
        .args(["--in-flight", &args.in_flight.to_string()]);
    let (delta_time, ok) = timed(&mut since).await?;
    if !ok {
        println!("copy-to-cql --since-backup failed");
        return Ok(false);
    }
    let start_time = start_on_cql(bin, &nodes, scratch).await?;
    let stop = stop_started.elapsed();
    let serving: std::time::Duration = passes.iter().map(|p| p.backup_time + p.copy_time).sum();
    println!(
        "short cut-over of {} records: {} catch-ups; {:.1} s of backups and copies while the old node served {:.0} pairs/s ({failed_pairs} failed); the stop: old node stopped in {:.2} s, {since_last} pairs served since the last backup copied in {:.2} s, idemd on the CQL store answered its first Claim after {:.2} s; stop {:.2} s (old node's SIGTERM to the first Claim on CQL)",
        args.records,
        passes.len() - 1,
        serving.as_secs_f64(),
        args.change_rate,
        stopped.as_secs_f64(),
        delta_time.as_secs_f64(),
        start_time.as_secs_f64(),
        stop.as_secs_f64()
    );
    Ok(failed_pairs == 0)
}

/// One backup and its copy while the old node served.
struct Pass {
    /// Pairs served before its backup began.
    served_before: u64,
    /// Pairs served since the backup before it (the bulk: since the start).
    since_last: u64,
    /// `idemd backup`.
    backup_time: std::time::Duration,
    /// `idemd copy-to-cql` of the backup (the bulk) or of what changed
    /// since the one before (a catch-up).
    copy_time: std::time::Duration,
}

impl Pass {
    fn line(&self, index: usize, records: usize) -> String {
        let copy = self.copy_time.as_secs_f64();
        if index == 0 {
            format!(
                "bulk: backup {:.1} s, copy of {records} records {copy:.1} s ({:.0} records/s) while the old node served",
                self.backup_time.as_secs_f64(),
                records as f64 / copy
            )
        } else {
            format!(
                "catch-up {index}: {} pairs served since the backup before; backup {:.1} s, copy of the changes {copy:.1} s while the old node served",
                self.since_last,
                self.backup_time.as_secs_f64()
            )
        }
    }
}

/// Claim + Complete pairs of fresh keys at a steady rate through the old
/// node, from its start to just before its stop: what a serving node
/// changes while it is being copied.
struct ChangeLoad {
    /// Pairs completed so far.
    served: Arc<std::sync::atomic::AtomicU64>,
    /// Pairs that failed (the old node is healthy throughout: a failure is
    /// a finding).
    failed: Arc<std::sync::atomic::AtomicU64>,
    /// Stops the load.
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ChangeLoad {
    async fn start(grpc: std::net::SocketAddr, per_second: f64) -> Result<Self> {
        use futures::StreamExt;
        let client = Arc::new(crate::systems::Client::Grpc(
            crate::systems::Grpc::connect(&format!("http://{grpc}"), 1).await?,
        ));
        let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let run = crate::ids::run_id();
        let period = std::time::Duration::from_secs_f64(1.0 / per_second.max(0.001));
        let (done, fail) = (Arc::clone(&served), Arc::clone(&failed));
        let task = tokio::spawn(async move {
            let ticks = futures::stream::unfold(
                (tokio::time::interval(period), 0u64),
                |(mut ticker, i)| async move {
                    ticker.tick().await;
                    Some((i, (ticker, i + 1)))
                },
            );
            let keys = ticks;
            let mut pairs = std::pin::pin!(
                keys.take_until(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                })
                .map(|i| {
                    let (client, key) = (Arc::clone(&client), format!("change-{run}-{i}"));
                    async move {
                        if let crate::systems::ClaimOutcome::Won(token) =
                            client.claim(&key, 0).await?
                        {
                            client.complete(&key, &token, 0).await?;
                        }
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(CHANGES_IN_FLIGHT)
            );
            while let Some(pair) = pairs.next().await {
                let counter = if pair.is_ok() { &done } else { &fail };
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Ok(Self {
            served,
            failed,
            stop,
            task,
        })
    }

    fn served(&self) -> u64 {
        self.served.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the load once the pairs in flight ended; how many failed.
    async fn stop(self) -> u64 {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Runs `command`; how long it took and whether it succeeded.
async fn timed(command: &mut tokio::process::Command) -> Result<(std::time::Duration, bool)> {
    let started = Instant::now();
    let status = command.status().await.context("running idemd")?;
    Ok((started.elapsed(), status.success()))
}

/// Starts `idemd --store cql` and waits for its first Claim; the time it
/// took. The server is stopped again.
async fn start_on_cql(bin: &Path, nodes: &str, scratch: &Path) -> Result<std::time::Duration> {
    let grpc: std::net::SocketAddr = ([127, 0, 0, 1], servers::free_port()?).into();
    let serve = [
        "--store",
        "cql",
        "--cql-nodes",
        nodes,
        "--listen",
        &grpc.to_string(),
        "--metrics-listen",
        "off",
    ]
    .map(String::from);
    let started = Instant::now();
    let mut server = servers::start_idemd_on(
        bin,
        &scratch.join("cql"),
        &scratch.join("idemd.log"),
        &serve,
        false,
    )
    .await?;
    let start_time = crate::embedded::wait_ready(&mut server, grpc, started).await?;
    server.stop().await?;
    Ok(start_time)
}

/// The long stop: the whole store copied while nothing serves.
async fn whole(args: &CutoverArgs, bin: &Path, data_dir: &Path, scratch: &Path) -> Result<bool> {
    let nodes = args.cql_nodes.join(",");
    let (copy_time, ok) = timed(
        tokio::process::Command::new(bin)
            .arg("copy-to-cql")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--cql-nodes", &nodes])
            .args(["--in-flight", &args.in_flight.to_string()]),
    )
    .await?;
    if !ok {
        println!("copy-to-cql failed");
        return Ok(false);
    }
    let start_time = start_on_cql(bin, &nodes, scratch).await?;
    let per_second = args.records as f64 / copy_time.as_secs_f64();
    println!(
        "cut-over of {} records: copy {:.1} s ({per_second:.0} records/s), idemd on the CQL store answered its first Claim after {:.2} s; downtime without the old server's stop: {:.1} s",
        args.records,
        copy_time.as_secs_f64(),
        start_time.as_secs_f64(),
        (copy_time + start_time).as_secs_f64()
    );
    Ok(true)
}

/// Fills a new embedded store in `data_dir` with `records` live records.
async fn fill(data_dir: &Path, records: usize) -> Result<()> {
    let started = Instant::now();
    let store = Arc::new(EmbeddedStore::open(&EmbeddedOptions::new(data_dir))?);
    let run = crate::ids::run_id();
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    crate::embedded::fill(&store, 0..records as u64, FILL_IN_FLIGHT, |i| {
        record(&run, i as usize, now_ms)
    })
    .await?;
    store.close().await?;
    let bytes: u64 = std::fs::read_dir(data_dir)?
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .map(|meta| meta.len())
        .sum();
    println!(
        "filled {records} records in {:.1} s ({:.0} MiB on disk)",
        started.elapsed().as_secs_f64(),
        bytes as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// Record `i` of the fill: 90 % COMPLETED with a 200-byte response, 8 %
/// IN_PROGRESS, 1 % FAILED, 1 % UNKNOWN; each in its 24 h window, created
/// in the last hour. Of the IN_PROGRESS records, 1 in 125 holds a lease
/// live for 3 h (640 per 10^6: operations in flight when the node stops,
/// still live after the bulk copy, which a cut-over credits with the stop,
/// one conditional write each; a node at 12 pairs/s has far fewer in
/// flight); the others are past their lease (abandoned claims waiting for
/// a decision, what accumulates on a busy node).
fn record(run: &str, i: usize, now_ms: i64) -> Record {
    let state = match i % 100 {
        0..=89 => RecordState::Completed,
        90..=97 => RecordState::InProgress,
        98 => RecordState::Failed,
        _ => RecordState::Unknown,
    };
    // At least a minute old, so a lease of a minute from then has run out.
    let created = now_ms - 60_001 - (i % 3_540_000) as i64;
    let lease_expires = if (i / 100).is_multiple_of(125) {
        now_ms + 3 * 3_600_000
    } else {
        created + 60_000
    };
    let completed = state == RecordState::Completed;
    Record {
        id: RecordKey {
            tenant: format!("cutover-{run}-{}", i % TENANTS),
            endpoint: "POST /v1/payments".into(),
            key: format!("key-{i:010}"),
        },
        state,
        fingerprint: (i as u64).to_be_bytes().repeat(4),
        attempt: 1,
        lease_token: format!("{:032x}", i as u128 * 0x9e37_79b9_7f4a_7c15),
        attempt_id: String::new(),
        created_at_ms: created,
        updated_at_ms: created + 50,
        lease_expires_at_ms: lease_expires,
        completed_at_ms: completed.then_some(created + 50),
        expires_at_ms: created + 24 * 3_600_000,
        response: completed.then(|| StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: format!("{{\"id\":\"pay_{i:010}\",\"status\":\"succeeded\",\"amount\":4200,\"pad\":\"{}\"}}", "x".repeat(120)).into_bytes(),
            body_ref: String::new(),
        }),
        reason: if completed || state == RecordState::InProgress {
            String::new()
        } else {
            "provider timed out".into()
        },
    }
}
