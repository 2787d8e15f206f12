//! The standing rule for every change to the CQL schema or to what a
//! replica writes: the previous release and this one serve ONE keyspace at
//! the same time, as they do during every rolling update, and the fleet
//! loses nothing when the last old replica is replaced.
//!
//! The steps are a `helm upgrade`'s: the previous release migrated the
//! keyspace and serves it; this release's `idemd migrate` runs (the chart's
//! pre-upgrade Job) while it serves; a replica of this release joins; both
//! take claims for the same keys under load, and each leaves claims stale
//! (a holder that died); then the old replica stops and another new one
//! takes its place. Checked: one winner per key across both releases (0
//! double), every completed key replayed with its winner's response by the
//! new fleet (0 lost), and every stale claim, whichever release wrote it,
//! listed by the new fleet's ListPending with no second `idemd migrate`.
//!
//! The previous release's binary is named by `IDEMD_PREVIOUS_BIN` (`make
//! cql-test` sets it from `scripts/previous-release.sh`); without it the
//! test prints why and passes. Any older binary with the same flags can be
//! named: the release before migration 3, for one, fails here without the
//! sealers' copy of its `pending_index` (`store::cql::pending::legacy`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::process::{Process, release_command, sigterm, spawn_command, this_idemd};
use crate::common::*;
use crate::cql_support::{Seen, contend};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use tonic::transport::Channel;

/// The variable naming the previous release's `idemd` binary.
const PREVIOUS_BIN: &str = "IDEMD_PREVIOUS_BIN";
/// Keys both releases contend for.
const KEYS: usize = 60;
/// Contenders per key on each replica.
const CONTENDERS: usize = 3;
/// Claims each release leaves stale.
const STALE: usize = 4;
/// The stale claims' lease.
const STALE_LEASE: Duration = Duration::from_secs(1);

fn previous_release() -> Option<PathBuf> {
    let Some(path) = std::env::var_os(PREVIOUS_BIN) else {
        eprintln!(
            "mixed fleet: skipped: {PREVIOUS_BIN} is not set (`make cql-test` sets it to the \
             output of scripts/previous-release.sh)"
        );
        return None;
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "{PREVIOUS_BIN}={} is not a file",
        path.display()
    );
    Some(path)
}

/// `idemd migrate` of `program` on `keyspace`.
fn migrate(program: &std::path::Path, keyspace: &str) {
    let output = std::process::Command::new(program)
        .args(["migrate", "--cql-nodes"])
        .arg(crate::cql_support::nodes().join(","))
        .args(["--keyspace", keyspace])
        .output()
        .expect("run migrate");
    assert!(
        output.status.success(),
        "{} migrate failed: {}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A replica of `program` on the keyspace (new replicas seal with a short
/// grace, so the test waits seconds, not the default 15).
fn replica(program: &std::path::Path, keyspace: &str, dir: &std::path::Path) -> Process {
    let mut flags = crate::cql_support::cql_flags(keyspace);
    if program == this_idemd() {
        flags.extend(["--cql-seal-grace".into(), "6s".into()]);
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    spawn_command(release_command(program, dir, &flags))
}

/// Leaves `STALE` claims with a short lease that nobody completes.
async fn leave_stale(client: &mut IdempotencyClient<Channel>, tenant: &str, prefix: &str) {
    for i in 0..STALE {
        let mut request = claim(PAYMENTS, &format!("{prefix}-{i}"), 7);
        request.lease = Some(dur(STALE_LEASE));
        let answer = client
            .claim(as_tenant(tenant, request))
            .await
            .expect("stale claim")
            .into_inner();
        claimed(&answer);
    }
}

async fn pending_keys(client: &mut IdempotencyClient<Channel>, tenant: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_pending(as_tenant(
                tenant,
                pb::ListPendingRequest {
                    page_token: page_token.clone(),
                    ..Default::default()
                },
            ))
            .await
            .expect("list pending")
            .into_inner();
        keys.extend(page.records.into_iter().map(|r| r.key));
        if page.next_page_token.is_empty() {
            return keys;
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_previous_release_and_this_one_serve_one_keyspace_through_a_rolling_update() {
    let Some(previous) = previous_release() else {
        return;
    };
    let keyspace = format!("idemd_fleet_{}", std::process::id());
    let tenant = "fleet";

    // The previous release's deployment, then this release's pre-upgrade Job.
    migrate(&previous, &keyspace);
    let old_dir = tempfile::tempdir().expect("temp dir");
    let old = replica(&previous, &keyspace, old_dir.path());
    migrate(this_idemd(), &keyspace);
    let new_dir = tempfile::tempdir().expect("temp dir");
    let new = replica(this_idemd(), &keyspace, new_dir.path());

    let clients = [
        ("old", connect(old.addr).await),
        ("new", connect(new.addr).await),
    ];
    // Each release writes records the other must replay, whatever the race
    // below decides: a key completed through one, claimed through the other.
    for (writer, reader) in [(0, 1), (1, 0)] {
        let key = format!("written-by-{}", clients[writer].0);
        let (name, client) = &clients[writer];
        let Seen::Won(id) =
            contend(client.clone(), tenant.into(), key.clone(), name.to_string()).await
        else {
            panic!("{key}: the first claim did not win");
        };
        let (name, client) = &clients[reader];
        match contend(client.clone(), tenant.into(), key.clone(), name.to_string()).await {
            Seen::Replayed(body) => assert_eq!(body, sample_response(&id).body, "{key}"),
            Seen::Won(again) => panic!("{key}: granted twice ({id}, then {again})"),
        }
    }

    let mut tasks = Vec::new();
    for key in 0..KEYS {
        for contender in 0..CONTENDERS {
            // Which release sends first alternates by key: under load the
            // first sender tends to win, and both should win some.
            let order = if key % 2 == 0 { [0, 1] } else { [1, 0] };
            for (release, client) in order.map(|i| &clients[i]) {
                tasks.push(tokio::spawn(contend(
                    client.clone(),
                    tenant.to_string(),
                    format!("k{key}"),
                    format!("{release}{contender}"),
                )));
            }
        }
    }
    for (release, client) in &clients {
        leave_stale(&mut client.clone(), tenant, &format!("stale-{release}")).await;
    }
    let mut winners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut replays: BTreeMap<String, BTreeSet<Vec<u8>>> = BTreeMap::new();
    for (index, task) in tasks.into_iter().enumerate() {
        let key = format!("k{}", index / (CONTENDERS * clients.len()));
        match task.await.expect("contender") {
            Seen::Won(id) => winners.entry(key).or_default().push(id),
            Seen::Replayed(body) => {
                replays.entry(key).or_default().insert(body);
            }
        }
    }
    let won_by: BTreeMap<&str, usize> =
        winners
            .values()
            .flatten()
            .fold(BTreeMap::new(), |mut by, id| {
                let release = if id.contains("-old") { "old" } else { "new" };
                *by.entry(release).or_default() += 1;
                by
            });
    eprintln!("mixed fleet: winners by release {won_by:?}");
    for key in (0..KEYS).map(|k| format!("k{k}")) {
        let won = winners.get(&key).map_or(&[][..], Vec::as_slice);
        assert_eq!(won.len(), 1, "{key}: winners {won:?} (0 double, 0 lost)");
        let expected = sample_response(&won[0]).body;
        for body in replays.get(&key).into_iter().flatten() {
            assert_eq!(body, &expected, "{key}: a replay differs from the winner's");
        }
    }

    // The rest of the rollout: the old replica leaves, a new one replaces it.
    sigterm(&old);
    drop(old);
    let last_dir = tempfile::tempdir().expect("temp dir");
    let last = replica(this_idemd(), &keyspace, last_dir.path());
    let mut fleet = [connect(new.addr).await, connect(last.addr).await];
    for key in (0..KEYS).map(|k| format!("k{k}")) {
        let expected = sample_response(&winners[&key][0]).body;
        for client in &mut fleet {
            let answer = client
                .claim(as_tenant(tenant, claim(PAYMENTS, &key, 7)))
                .await
                .expect("claim after the rollout")
                .into_inner();
            let body = replayed(&answer).response.map(|r| r.body);
            assert_eq!(body.as_ref(), Some(&expected), "{key} after the rollout");
        }
    }
    let stale: BTreeSet<String> = ["old", "new"]
        .iter()
        .flat_map(|release| (0..STALE).map(move |i| format!("stale-{release}-{i}")))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut listed = Vec::new();
        for client in &mut fleet {
            listed.push(pending_keys(client, tenant).await);
        }
        if listed.iter().all(|keys| keys == &stale) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s the new fleet lists {listed:?}, not every stale claim {stale:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_nodes(crate::cql_support::nodes())
        .build()
        .await
        .expect("connect");
    idemd::store::cql::migrate::execute_ddl(&session, format!("DROP KEYSPACE {keyspace}"))
        .await
        .expect("drop");
}
