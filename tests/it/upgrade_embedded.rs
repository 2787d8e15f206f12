//! The previous release and this one taking turns on one embedded store, as
//! real processes: an upgrade, a rollback, and the upgrade again.
//!
//! The project ships no change to a file format without a test where both
//! releases run on the same data. Issue 36 changed the embedded store's
//! files: the block checksums (`idemd.redb.sums`) beside `idemd.redb`, redb's
//! allocator state recorded by every durable commit, and an open that trusts
//! the checksums instead of reading the whole file. So: the previous release
//! writes; this one must serve every key it acknowledged (exact replays,
//! leases still held and completable) and write more; the previous one,
//! rolled back onto the file this one wrote (after a clean stop, and after a
//! `kill -9` under writes), must serve everything; and this one again must
//! notice the older release's commits (it checks the whole file) and serve
//! every key, including those written during the rollback.
//!
//! The previous release's binary is named by `IDEMD_PREVIOUS_BIN`
//! (`make cargo-test` sets it from `scripts/previous-release.sh`, which builds
//! the commit in `tests/previous-release`); without it these tests print why
//! and pass.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use idemd::store::embedded::SUMS_FILE;
use tonic::transport::Channel;

use crate::common::process::{Process, kill9, release_command, sigterm, spawn_command, this_idemd};
use crate::common::*;

/// The variable naming the previous release's `idemd` binary.
const PREVIOUS_BIN: &str = "IDEMD_PREVIOUS_BIN";
/// The tenant every key belongs to.
const TENANT: &str = "upgrade";
/// Leases that outlive every step of a test.
const LEASE: Duration = Duration::from_secs(600);
/// What this release logs when the checksums cannot vouch for the file.
const FULL_CHECK: &str = "checking the whole database file";

/// The previous release's binary, or `None` (and the reason printed) when
/// the variable is unset.
fn previous_release(test: &str) -> Option<PathBuf> {
    let Some(path) = std::env::var_os(PREVIOUS_BIN) else {
        eprintln!(
            "{test}: skipped: {PREVIOUS_BIN} is not set (`make cargo-test` sets it to \
             the output of scripts/previous-release.sh)"
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

/// Which release runs a step.
#[derive(Clone, Copy)]
enum Release<'a> {
    /// The binary of the release before this one.
    Previous(&'a Path),
    /// This build's binary.
    New,
}

impl Release<'_> {
    /// Starts it on `dir` and waits until it serves.
    fn start(self, dir: &Path) -> Process {
        let program = match self {
            Release::Previous(path) => path,
            Release::New => this_idemd(),
        };
        spawn_command(release_command(program, dir, &[]))
    }
}

/// Whether this release checked the whole file before it served; prints
/// the reason it gave.
fn checked_whole_file(process: &Process, step: &str) -> bool {
    let Some(line) = process
        .startup
        .iter()
        .find(|line| line.contains(FULL_CHECK))
    else {
        return false;
    };
    let reason = serde_json::from_str::<serde_json::Value>(line)
        .map(|event| event["reason"].to_string())
        .unwrap_or_else(|_| line.clone());
    eprintln!("{step}: the new release checked the whole file: {reason}");
    true
}

/// SIGTERM, then waits for a clean exit.
async fn stop(mut process: Process) {
    sigterm(&process);
    let (status, log) = tokio::task::spawn_blocking(move || {
        let status = process.child.wait().expect("wait");
        let log: Vec<String> = process.lines.try_iter().collect();
        (status, log)
    })
    .await
    .expect("join");
    assert_eq!(
        status.code(),
        Some(0),
        "clean exit on SIGTERM; log:\n{}",
        log.join("\n")
    );
}

/// A response whose body names the key and whose length varies (up to
/// 20 KiB: some span several pages of the file).
fn response_for(key: &str, n: u64) -> pb::StoredResponse {
    let mut response = sample_response(key);
    let filler = (n % 5) * 5000;
    response
        .body
        .extend((0..filler).map(|i| (i as u8) ^ (n as u8)));
    response
}

/// A Claim of `key` (payment `n`) with an attempt id and a long lease.
fn claim_of(key: &str, n: u64) -> pb::ClaimRequest {
    let mut request = claim(PAYMENTS, key, n);
    request.attempt_id = format!("attempt-{key}");
    request.lease = Some(dur(LEASE));
    request
}

/// Completes `key` with `response` under `lease_token`.
async fn complete(
    client: &mut IdempotencyClient<Channel>,
    key: &str,
    lease_token: &str,
    response: &pb::StoredResponse,
) -> Result<(), tonic::Status> {
    client
        .complete(as_tenant(
            TENANT,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: key.into(),
                lease_token: lease_token.into(),
                response: Some(response.clone()),
            },
        ))
        .await
        .map(|_| ())
}

/// Asserts that `answer` replays exactly `expected`; on a difference, says
/// where instead of printing kilobytes of body.
fn assert_replays(answer: &pb::ClaimResponse, expected: &pb::StoredResponse, what: &str) {
    let got = replayed(answer).response.unwrap_or_default();
    if &got == expected {
        return;
    }
    let body = if got.body == expected.body {
        "the same body".to_string()
    } else {
        let first_difference = got
            .body
            .iter()
            .zip(&expected.body)
            .position(|(a, b)| a != b)
            .unwrap_or(got.body.len().min(expected.body.len()));
        format!(
            "a body of {} bytes (stored {}) differing from byte {first_difference}",
            got.body.len(),
            expected.body.len()
        )
    };
    panic!(
        "{what}: the replay differs from the stored response: status {} (stored {}), \
         headers {:?} (stored {:?}), {body}",
        got.status, expected.status, got.headers, expected.headers
    );
}

/// Every write acknowledged so far: what the store must answer, whichever
/// release serves it.
#[derive(Default)]
struct Ledger {
    /// Completed keys: the Claim and the response it must replay.
    completed: Vec<(pb::ClaimRequest, pb::StoredResponse)>,
    /// Keys left IN_PROGRESS: the Claim, its lease, the response to store.
    held: Vec<(pb::ClaimRequest, pb::Claimed, pb::StoredResponse)>,
    /// Number of the next key.
    next: u64,
}

impl Ledger {
    /// Claims `count` new keys named after `step`; completes them but every
    /// `hold_every`-th, which stays IN_PROGRESS.
    async fn write(
        &mut self,
        client: &mut IdempotencyClient<Channel>,
        step: &str,
        count: u64,
        hold_every: u64,
    ) {
        for _ in 0..count {
            let n = self.next;
            self.next += 1;
            let key = format!("{step}-{n}");
            let request = claim_of(&key, n);
            let lease = claimed(
                &client
                    .claim(as_tenant(TENANT, request.clone()))
                    .await
                    .unwrap_or_else(|e| panic!("{step}: claim {key}: {e}"))
                    .into_inner(),
            );
            let response = response_for(&key, n);
            if n.is_multiple_of(hold_every) {
                self.held.push((request, lease, response));
            } else {
                complete(client, &key, &lease.lease_token, &response)
                    .await
                    .unwrap_or_else(|e| panic!("{step}: complete {key}: {e}"));
                self.completed.push((request, response));
            }
        }
    }

    /// Completes the `count` oldest held keys with their lease tokens.
    async fn complete_held(
        &mut self,
        client: &mut IdempotencyClient<Channel>,
        step: &str,
        count: usize,
    ) {
        assert!(self.held.len() > count, "{step}: keep some keys held");
        for (request, lease, response) in self.held.drain(..count) {
            complete(client, &request.key, &lease.lease_token, &response)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{step}: complete {} under a lease granted earlier: {e}",
                        request.key
                    )
                });
            self.completed.push((request, response));
        }
    }

    /// Checks every key: completed ones replay their exact response (and
    /// refuse another request: the fingerprint survived), held ones refuse
    /// another caller and give their holder its own lease back.
    async fn verify(&self, client: &mut IdempotencyClient<Channel>, step: &str) {
        for (request, response) in &self.completed {
            let answer = client
                .claim(as_tenant(TENANT, request.clone()))
                .await
                .unwrap_or_else(|e| panic!("{step}: claim {}: {e}", request.key))
                .into_inner();
            assert_eq!(
                outcome_name(&answer),
                "replayed",
                "{step}: {} was completed: {answer:?}",
                request.key
            );
            assert_replays(&answer, response, &format!("{step}: {}", request.key));
            let mut other = request.clone();
            other.attempt_id.clear();
            other.fingerprint = claim(PAYMENTS, &request.key, 1_000_000).fingerprint;
            let answer = client
                .claim(as_tenant(TENANT, other))
                .await
                .unwrap_or_else(|e| panic!("{step}: claim {}: {e}", request.key))
                .into_inner();
            assert_eq!(
                outcome_name(&answer),
                "mismatch",
                "{step}: {} with another request",
                request.key
            );
        }
        for (request, lease, _) in &self.held {
            let mut other = request.clone();
            other.attempt_id.clear();
            let answer = client
                .claim(as_tenant(TENANT, other))
                .await
                .unwrap_or_else(|e| panic!("{step}: claim {}: {e}", request.key))
                .into_inner();
            assert_eq!(
                outcome_name(&answer),
                "in_progress",
                "{step}: {} is held: {answer:?}",
                request.key
            );
            let again = client
                .claim(as_tenant(TENANT, request.clone()))
                .await
                .unwrap_or_else(|e| panic!("{step}: claim {}: {e}", request.key))
                .into_inner();
            assert_lease_back(
                &claimed(&again),
                lease,
                &format!("{step}: the holder of {}", request.key),
            );
        }
    }
}

/// Step a of each test: the previous release's binary and a store it
/// wrote (`count` keys, every sixth left IN_PROGRESS), stopped with
/// SIGTERM; `None` when [`PREVIOUS_BIN`] is unset.
async fn written_by_previous_release(
    test: &str,
    count: u64,
) -> Option<(PathBuf, tempfile::TempDir, Ledger)> {
    let previous = previous_release(test)?;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut ledger = Ledger::default();
    let process = Release::Previous(&previous).start(dir.path());
    let mut client = connect(process.addr).await;
    ledger.write(&mut client, "a", count, 6).await;
    ledger.verify(&mut client, "a (previous release)").await;
    stop(process).await;
    assert!(
        !dir.path().join(SUMS_FILE).exists(),
        "the previous release keeps no {SUMS_FILE}: is {PREVIOUS_BIN} really the previous release?"
    );
    Some((previous, dir, ledger))
}

/// Starts this release on a store an older release wrote last: it must
/// check the whole file before it serves, then serve every key.
async fn new_release_on_older_store(
    dir: &Path,
    ledger: &Ledger,
    step: &str,
) -> (Process, IdempotencyClient<Channel>) {
    let process = Release::New.start(dir);
    assert!(
        checked_whole_file(&process, step),
        "{step}: on a store an older release wrote last, the new release checks the whole \
         file first; startup log:\n{}",
        process.startup.join("\n")
    );
    let mut client = connect(process.addr).await;
    ledger.verify(&mut client, step).await;
    (process, client)
}

/// Upgrade, rollback, upgrade again, each release stopped with SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_and_new_release_take_turns_on_one_store() {
    let Some((previous, dir, mut ledger)) =
        written_by_previous_release("previous_and_new_release_take_turns_on_one_store", 120).await
    else {
        return;
    };
    let previous = Release::Previous(&previous);

    // b. The upgrade: every key served, leases granted before it complete.
    let (process, mut client) =
        new_release_on_older_store(dir.path(), &ledger, "b (upgrade)").await;
    ledger.complete_held(&mut client, "b (upgrade)", 8).await;
    ledger.write(&mut client, "b", 120, 7).await;
    ledger.verify(&mut client, "b (upgrade)").await;
    stop(process).await;
    assert!(
        dir.path().join(SUMS_FILE).is_file(),
        "b: the new release keeps {SUMS_FILE}"
    );

    // c. The rollback, onto a file with this release's commits.
    let process = previous.start(dir.path());
    let mut client = connect(process.addr).await;
    ledger.verify(&mut client, "c (rollback)").await;
    ledger.complete_held(&mut client, "c (rollback)", 8).await;
    ledger.write(&mut client, "c", 120, 8).await;
    ledger.verify(&mut client, "c (rollback)").await;
    stop(process).await;

    // d. The upgrade again: the older release's commits are noticed.
    let (process, mut client) =
        new_release_on_older_store(dir.path(), &ledger, "d (upgrade again)").await;
    ledger
        .complete_held(&mut client, "d (upgrade again)", 8)
        .await;
    ledger.write(&mut client, "d", 60, 5).await;
    stop(process).await;

    // e. This release after its own clean stop trusts its sums.
    let process = Release::New.start(dir.path());
    assert!(
        !checked_whole_file(&process, "e"),
        "e: after its own clean stop the new release does not check the whole file; \
         startup log:\n{}",
        process.startup.join("\n")
    );
    let mut client = connect(process.addr).await;
    ledger.verify(&mut client, "e (restart)").await;
    stop(process).await;
    eprintln!(
        "{} keys completed and {} held, each checked after every step",
        ledger.completed.len(),
        ledger.held.len()
    );
}

/// What one writer of [`write_until_killed`] saw acknowledged, and the key
/// it had in flight when the server died.
#[derive(Default)]
struct Written {
    /// Claimed and completed, both acknowledged.
    completed: Vec<(pb::ClaimRequest, pb::StoredResponse)>,
    /// The key in flight: its Claim, its lease if the Claim was
    /// acknowledged, the response it was completing with.
    in_flight: Option<(pb::ClaimRequest, Option<pb::Claimed>, pb::StoredResponse)>,
}

/// Claims and completes keys `writer`, `writer + writers`, ... from `first`
/// until a call fails (the server was killed), recording what was
/// acknowledged; `acked` counts completions across writers.
async fn write_until_killed(
    mut client: IdempotencyClient<Channel>,
    first: u64,
    writer: u64,
    writers: u64,
    acked: Arc<Mutex<u64>>,
) -> Written {
    let mut written = Written::default();
    for n in (first + writer..).step_by(writers as usize) {
        let key = format!("b-killed-{n}");
        let request = claim_of(&key, n);
        let response = response_for(&key, n);
        written.in_flight = Some((request.clone(), None, response.clone()));
        let Ok(answer) = client.claim(as_tenant(TENANT, request.clone())).await else {
            break;
        };
        let lease = claimed(&answer.into_inner());
        written.in_flight = Some((request.clone(), Some(lease.clone()), response.clone()));
        if complete(&mut client, &key, &lease.lease_token, &response)
            .await
            .is_err()
        {
            break;
        }
        written.in_flight = None;
        written.completed.push((request, response));
        *acked.lock().expect("lock") += 1;
    }
    written
}

/// The new release killed with `kill -9` under writes; the previous release
/// opens the file it left, then the new release again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_opens_a_store_the_new_one_was_killed_on() {
    let Some((previous, dir, mut ledger)) = written_by_previous_release(
        "previous_release_opens_a_store_the_new_one_was_killed_on",
        80,
    )
    .await
    else {
        return;
    };
    let previous = Release::Previous(&previous);

    // b. The new release, killed while four writers are busy.
    let (process, mut client) =
        new_release_on_older_store(dir.path(), &ledger, "b (upgrade)").await;
    ledger.complete_held(&mut client, "b (upgrade)", 4).await;
    ledger.write(&mut client, "b", 60, 7).await;
    let acked = Arc::new(Mutex::new(0u64));
    let writers = 4;
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            tokio::spawn(write_until_killed(
                client.clone(),
                ledger.next,
                writer,
                writers,
                Arc::clone(&acked),
            ))
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while *acked.lock().expect("lock") < 300 {
        assert!(tokio::time::Instant::now() < deadline, "b: writers stalled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    kill9(process);
    let mut in_flight = Vec::new();
    for task in tasks {
        let written = task.await.expect("writer");
        ledger.completed.extend(written.completed);
        in_flight.extend(written.in_flight);
    }
    assert!(
        dir.path().join(SUMS_FILE).is_file(),
        "b: the new release keeps {SUMS_FILE}"
    );

    // c. The rollback onto the file the new release was killed on.
    let process = previous.start(dir.path());
    let mut client = connect(process.addr).await;
    ledger
        .verify(&mut client, "c (rollback after kill -9)")
        .await;
    // A key in flight at the kill was written in full, in part or not at
    // all: its holder's retry finds which, and never another response.
    let killed_under = (ledger.completed.len(), in_flight.len());
    let mut found = Vec::new();
    for (request, lease, response) in in_flight {
        let answer = client
            .claim(as_tenant(TENANT, request.clone()))
            .await
            .expect("claim")
            .into_inner();
        found.push(outcome_name(&answer));
        match outcome_name(&answer) {
            "replayed" => assert_replays(
                &answer,
                &response,
                &format!("c: {}, in flight at the kill", request.key),
            ),
            "claimed" => {
                let granted = claimed(&answer);
                if let Some(lease) = &lease {
                    assert_eq!(
                        &granted, lease,
                        "c: {}: the acknowledged lease",
                        request.key
                    );
                }
                complete(&mut client, &request.key, &granted.lease_token, &response)
                    .await
                    .expect("complete");
            }
            other => panic!("c: {} in flight at the kill: {other}", request.key),
        }
        ledger.completed.push((request, response));
    }
    ledger.complete_held(&mut client, "c (rollback)", 4).await;
    ledger.write(&mut client, "c", 60, 8).await;
    stop(process).await;

    // d. The new release again.
    let (process, _) = new_release_on_older_store(dir.path(), &ledger, "d (upgrade again)").await;
    stop(process).await;
    eprintln!(
        "killed with {} keys completed and {} in flight (found after the kill: {found:?}); \
         {} keys completed and {} held at the end",
        killed_under.0,
        killed_under.1,
        ledger.completed.len(),
        ledger.held.len()
    );
}
