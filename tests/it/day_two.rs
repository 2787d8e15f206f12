//! Day-two commands at the wrong moment, against the real binary: the data
//! directory's owner lock (`store::embedded::owner`) refuses a restore, a
//! copy and a second server while idemd serves, and a restore killed at
//! each step of its swap (`store::embedded::swap`, the `IDEMD_CRASH_AT`
//! points) leaves a store that starts with every key acknowledged before
//! the backup: the old one before the swap's journal, the restored one
//! after it, never an empty one.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::process::{kill9, spawn, this_idemd};
use crate::common::*;
use idemd::proto::v1 as pb;

const TENANT: &str = "day-two";

/// Claims `key` (amount 7); its outcome's name.
async fn claim_outcome(addr: std::net::SocketAddr, key: &str) -> (&'static str, String) {
    let mut client = connect(addr).await;
    let response = client
        .claim(as_tenant(TENANT, claim(PAYMENTS, key, 7)))
        .await
        .expect("claim")
        .into_inner();
    let token = match &response.outcome {
        Some(pb::claim_response::Outcome::Claimed(claimed)) => claimed.lease_token.clone(),
        _ => String::new(),
    };
    (outcome_name(&response), token)
}

/// Claims and completes `key`: acknowledged.
async fn acknowledge(addr: std::net::SocketAddr, key: &str) {
    let (outcome, token) = claim_outcome(addr, key).await;
    assert_eq!(outcome, "claimed", "{key} is fresh");
    connect(addr)
        .await
        .complete(as_tenant(
            TENANT,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: key.into(),
                lease_token: token,
                response: Some(sample_response(key)),
            },
        ))
        .await
        .expect("complete");
}

fn idemd(args: &[&str], dir_args: &[(&str, &Path)], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(this_idemd());
    command.args(args);
    for (flag, path) in dir_args {
        command.arg(flag).arg(path);
    }
    command
        .envs(env.iter().copied())
        .env("IDEMD_METRICS_LISTEN", "off")
        .stdin(Stdio::null());
    command.output().expect("run idemd")
}

fn restore(from: &Path, data_dir: &Path, env: &[(&str, &str)]) -> Output {
    idemd(
        &["restore", "--replace"],
        &[("--from", from), ("--data-dir", data_dir)],
        env,
    )
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Copies the stopped data directory `from` to `to` (a new directory).
fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success());
}

/// A server on `data` in a new scratch directory, key "a" acknowledged,
/// `idemd backup` into `backup` beside it, then key "b" acknowledged.
async fn served_and_backed_up() -> (tempfile::TempDir, crate::common::process::Process) {
    let scratch = tempfile::tempdir().expect("temp dir");
    let (data, backup) = (scratch.path().join("data"), scratch.path().join("backup"));
    let server = spawn(&data, &[]);
    acknowledge(server.addr, "a").await;
    let backed_up = idemd(
        &["backup"],
        &[("--data-dir", &data), ("--to", &backup)],
        &[],
    );
    assert!(backed_up.status.success(), "{}", stderr(&backed_up));
    acknowledge(server.addr, "b").await;
    (scratch, server)
}

/// A restore, a copy-to-cql and a second server pointed at a serving
/// idemd's data directory are each refused, naming the server's pid, and
/// the server's keys are untouched. Fails without the owner lock: the
/// restore exits 0 and moves the live files away (issue 50).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_directory_refuses_restore_copy_and_a_second_server() {
    let (scratch, server) = served_and_backed_up().await;
    let (data, backup) = (scratch.path().join("data"), scratch.path().join("backup"));
    let pid = server.child.id().to_string();

    let refused = restore(&backup, &data, &[]);
    assert!(!refused.status.success(), "restore over a serving idemd");
    let said = stderr(&refused);
    assert!(
        said.contains("in use by idemd serve") && said.contains(&format!("pid {pid}")),
        "{said}"
    );

    let copy = idemd(
        &[
            "copy-to-cql",
            "--cql-nodes",
            "127.0.0.1:1",
            "--keyspace",
            "never_reached",
        ],
        &[("--data-dir", &data)],
        &[],
    );
    assert!(!copy.status.success(), "copy-to-cql of a serving store");
    assert!(
        stderr(&copy).contains(&format!("pid {pid}")),
        "{}",
        stderr(&copy)
    );

    let second = idemd(
        &["--listen", "127.0.0.1:0", "--log-format", "json"],
        &[("--data-dir", &data)],
        &[],
    );
    assert!(!second.status.success(), "a second server on one directory");
    assert!(
        stderr(&second).contains(&format!("pid {pid}")),
        "{}",
        stderr(&second)
    );

    // Nothing moved: both keys replay on the serving process.
    for key in ["a", "b"] {
        assert_eq!(claim_outcome(server.addr, key).await.0, "replayed", "{key}");
    }
    kill9(server);
}

/// The restore's steps, in order, and whether a kill there leaves the old
/// store (before the swap's journal) or the restored one (after it).
const STEPS: [(&str, bool); 7] = [
    ("restore-staged", true),
    ("restore-checked", true),
    ("restore-journaled", false),
    ("restore-aside-first", false),
    ("restore-aside", false),
    ("restore-in-first", false),
    ("restore-in", false),
];

/// `idemd restore --replace` killed (abort, as `kill -9`) at each step: the
/// next start serves either the old store (key "b", acknowledged after the
/// backup, replays) or the restored one ("b" is fresh again: that is what
/// a restore means), "a" replays in both, and a second restore then ends
/// with the restored store. Fails without the journal: a kill between the
/// two moves left no database, and the next start created an empty store
/// ("a" granted again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_killed_at_any_step_leaves_the_old_store_or_the_restored_one() {
    let (scratch, server) = served_and_backed_up().await;
    let (data, backup) = (scratch.path().join("data"), scratch.path().join("backup"));
    kill9(server);

    for (step, old_store) in STEPS {
        let dir = scratch.path().join(step);
        copy_dir(&data, &dir);
        let killed = restore(&backup, &dir, &[("IDEMD_CRASH_AT", step)]);
        assert!(
            killed.status.code().is_none(),
            "{step}: the restore was to abort there: {:?} {}",
            killed.status,
            stderr(&killed)
        );
        let server = spawn(&dir, &[]);
        assert_eq!(
            claim_outcome(server.addr, "a").await.0,
            "replayed",
            "{step}: a key acknowledged before the backup"
        );
        let b = claim_outcome(server.addr, "b").await.0;
        let expected = if old_store { "replayed" } else { "claimed" };
        assert_eq!(b, expected, "{step}: the old store={old_store}");
        kill9(server);
        assert!(
            !dir.join(idemd::store::embedded::swap::JOURNAL_FILE)
                .exists(),
            "{step}: the start finished the swap"
        );

        // The operator runs the restore again: it ends with the backup's
        // store ("b" fresh, "a" replays).
        let again = restore(&backup, &dir, &[]);
        assert!(again.status.success(), "{step}: {}", stderr(&again));
        let server = spawn(&dir, &[]);
        assert_eq!(claim_outcome(server.addr, "a").await.0, "replayed");
        kill9(server);
    }
}

/// Day-two output is for pipes too: `idemd restore` refused (stderr a
/// pipe) writes no ANSI escape, nor does the server's human log. Fails
/// with tracing's default (colour whatever the output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_into_a_pipe_carry_no_colour() {
    let scratch = tempfile::tempdir().expect("temp dir");
    let data = scratch.path().join("data");
    let mut command = Command::new(this_idemd());
    command
        .args([
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "human",
            "--data-dir",
        ])
        .arg(&data)
        .env("IDEMD_METRICS_LISTEN", "off")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn");
    // The first lines of its log, then stop it.
    let stderr_pipe = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        use std::io::BufRead as _;
        let mut log = Vec::new();
        for line in std::io::BufReader::new(stderr_pipe)
            .lines()
            .map_while(Result::ok)
        {
            let serving = line.contains("idemd serving");
            log.push(line);
            if serving {
                break;
            }
        }
        log.join("\n")
    });
    let log = reader.join().expect("read the log");
    let _ = child.kill();
    let _ = child.wait();
    assert!(!log.is_empty(), "the server logged");
    assert!(!log.contains('\u{1b}'), "escape codes in a pipe: {log:?}");
}

/// A data directory `idemd copy-to-cql` marked as moved (the mark written
/// by the same code the copy runs) is refused by `idemd serve`, naming the
/// keyspace; `--allow-moved-store` serves it (a rollback), its keys as they
/// were, and removes the mark. Fails without the check: the old store
/// serves and grants keys the cluster completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moved_to_cql_is_refused_unless_allowed() {
    use idemd::store::embedded::moved::{MOVED_FILE, MovedMarker};
    let scratch = tempfile::tempdir().expect("temp dir");
    let data = scratch.path().join("data");
    let server = spawn(&data, &[]);
    acknowledge(server.addr, "a").await;
    kill9(server);
    MovedMarker::now("idemd_prod", &["scylla-1.db.internal:9142".to_string()])
        .write(&data)
        .expect("mark");

    let refused = idemd(
        &["--listen", "127.0.0.1:0", "--log-format", "json"],
        &[("--data-dir", &data)],
        &[],
    );
    assert!(!refused.status.success(), "a moved store served");
    assert!(
        stderr(&refused).contains("moved to the CQL keyspace idemd_prod")
            && stderr(&refused).contains("--allow-moved-store"),
        "{}",
        stderr(&refused)
    );

    let rollback = spawn(&data, &["--allow-moved-store"]);
    assert_eq!(claim_outcome(rollback.addr, "a").await.0, "replayed");
    assert!(!data.join(MOVED_FILE).exists(), "the mark is removed");
    kill9(rollback);
}

/// A lease does not run while idemd is down (docs/design.md): a key claimed
/// with a 3 s lease, idemd killed for 5 s, is still the holder's after the
/// restart: a retry is told `in_progress` (not `pending`, and never granted
/// under `takeover`), and the holder completes it. Fails without the
/// heartbeat's credit (`store::embedded::alive`): the lease ended while
/// nobody could reach idemd to extend it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_does_not_run_while_idemd_is_down() {
    let scratch = tempfile::tempdir().expect("temp dir");
    let data = scratch.path().join("data");
    let server = spawn(&data, &[]);
    let mut request = claim(PAYMENTS, "held", 7);
    request.lease = Some(dur(std::time::Duration::from_secs(3)));
    let claimed = connect(server.addr)
        .await
        .claim(as_tenant(TENANT, request))
        .await
        .expect("claim")
        .into_inner();
    let Some(pb::claim_response::Outcome::Claimed(lease)) = claimed.outcome else {
        panic!("a fresh key is claimed: {claimed:?}");
    };
    kill9(server);
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;

    let server = spawn(&data, &[]);
    assert_eq!(
        claim_outcome(server.addr, "held").await.0,
        "in_progress",
        "a retry after the restart: the holder's lease must not have run while idemd was down"
    );
    connect(server.addr)
        .await
        .complete(as_tenant(
            TENANT,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "held".into(),
                lease_token: lease.lease_token,
                response: Some(sample_response("held")),
            },
        ))
        .await
        .expect("the holder completes after the restart");
    assert_eq!(claim_outcome(server.addr, "held").await.0, "replayed");
    kill9(server);
}
