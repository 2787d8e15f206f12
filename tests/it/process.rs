//! Tests of the `idemd` binary as a process: crash durability (`kill -9`),
//! exclusive ownership of the data directory, configuration errors, and
//! graceful shutdown on SIGTERM.

use std::time::Duration;

use crate::common::process::{idemd_command, kill9, sigterm, spawn};
use crate::common::*;
use idemd::proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().expect("temp dir");
    let process = spawn(dir.path(), &[]);
    let mut client = connect(process.addr).await;
    let mut completed = Vec::new();
    let mut held = Vec::new();
    for i in 0..200 {
        let key = format!("crash-{i}");
        let mut request = claim(PAYMENTS, &key, i);
        request.attempt_id = format!("attempt-{i}");
        let lease = claimed(
            &client
                .claim(as_tenant("t", request.clone()))
                .await
                .expect("claim")
                .into_inner(),
        );
        if i % 2 == 0 {
            let response = sample_response(&key);
            client
                .complete(as_tenant(
                    "t",
                    pb::CompleteRequest {
                        endpoint: PAYMENTS.into(),
                        key: key.clone(),
                        lease_token: lease.lease_token.clone(),
                        response: Some(response.clone()),
                    },
                ))
                .await
                .expect("complete acknowledged");
            completed.push((request, response));
        } else {
            held.push((request, lease));
        }
    }
    // No graceful anything: the process dies right after the last ack.
    kill9(process);

    let process = spawn(dir.path(), &[]);
    let mut client = connect(process.addr).await;
    for (request, response) in &completed {
        let replay = client
            .claim(as_tenant("t", request.clone()))
            .await
            .expect("claim")
            .into_inner();
        assert_eq!(
            replayed(&replay).response.as_ref(),
            Some(response),
            "byte-identical replay of {}",
            request.key
        );
    }
    for (request, lease) in &held {
        // Another caller finds the claim held...
        let mut other = request.clone();
        other.attempt_id = String::new();
        let response = client
            .claim(as_tenant("t", other))
            .await
            .expect("claim")
            .into_inner();
        assert_eq!(
            outcome_name(&response),
            "in_progress",
            "{} still held",
            request.key
        );
        // ...and the holder's retried Claim gets its own lease back.
        let again = client
            .claim(as_tenant("t", request.clone()))
            .await
            .expect("claim")
            .into_inner();
        assert_lease_back(&claimed(&again), lease, &request.key);
    }
    kill9(process);
}

/// After `kill -9` (the log replayed at open, the pending index with it),
/// ListPending lists every claim whose holder never finished, and nothing
/// it did finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pending_after_kill_9_lists_exactly_the_unfinished_claims() {
    let dir = tempfile::tempdir().expect("temp dir");
    let process = spawn(dir.path(), &[]);
    let mut client = connect(process.addr).await;
    let lease = Duration::from_millis(800);
    let mut unfinished = Vec::new();
    for i in 0..40 {
        let key = format!("stuck-{i}");
        let mut request = claim(PAYMENTS, &key, i);
        request.lease = Some(dur(lease));
        let granted = claimed(
            &client
                .claim(as_tenant("t", request))
                .await
                .expect("claim")
                .into_inner(),
        );
        if i % 2 == 0 {
            client
                .complete(as_tenant(
                    "t",
                    pb::CompleteRequest {
                        endpoint: PAYMENTS.into(),
                        key,
                        lease_token: granted.lease_token,
                        response: Some(sample_response("done")),
                    },
                ))
                .await
                .expect("complete");
        } else {
            unfinished.push(key);
        }
    }
    kill9(process);
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let process = spawn(dir.path(), &[]);
    // The leases get the time idemd was down (docs/design.md, "Leases
    // across a stop"): they end at most a lease and one heartbeat after
    // the restart.
    tokio::time::sleep(lease + Duration::from_millis(1500)).await;
    let pending = connect(process.addr)
        .await
        .list_pending(as_tenant(
            "t",
            pb::ListPendingRequest {
                page_size: 100,
                ..Default::default()
            },
        ))
        .await
        .expect("list pending")
        .into_inner();
    let mut listed: Vec<String> = pending.records.into_iter().map(|r| r.key).collect();
    listed.sort();
    unfinished.sort();
    assert_eq!(listed, unfinished);
    kill9(process);
}

#[test]
fn a_second_process_on_the_same_data_dir_refuses_to_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = spawn(dir.path(), &[]);
    let output = idemd_command(dir.path(), &[]).output().expect("run second");
    assert!(!output.status.success(), "second owner must fail");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let pid = first.child.id();
    assert!(
        stderr.contains(&format!("in use by idemd serve (pid {pid},")),
        "says why, naming the first: {stderr}"
    );
    kill9(first);
}

#[test]
fn invalid_configuration_exits_non_zero_naming_the_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("idemd.toml");
    std::fs::write(
        &config,
        "[endpoints.\"POST /v1/payments\"]\nttl = \"1h\"\nlease = \"2h\"\n",
    )
    .expect("write");
    let output = idemd_command(
        dir.path(),
        &["--config", config.to_str().expect("utf8 path")],
    )
    .output()
    .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("endpoints.\"POST /v1/payments\".lease"),
        "{stderr}"
    );

    let output = idemd_command(dir.path(), &[])
        .env("IDEMD_DRAIN_TIMEOUT", "soon")
        .output()
        .expect("run");
    assert_eq!(
        output.status.code(),
        Some(2),
        "bad env var is a usage error"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("drain-timeout"));
}

/// Files named by flags are configuration too: a tokens file, a client
/// tenants mapping, a keyring or TLS files that cannot be used exit 2 like a
/// bad flag (the README promises it), naming the file; so do combinations
/// that `Settings::validate` refuses.
#[test]
fn unusable_files_and_bad_combinations_exit_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).to_string_lossy().to_string();
    std::fs::write(path("tokens"), "acme not-a-sha256-digest\n").expect("write");
    std::fs::write(path("keys"), "k1 AQEB\n").expect("write");
    std::fs::write(path("cert.pem"), "not a certificate").expect("write");
    for (flags, names) in [
        (
            vec!["--auth-tokens", &path("tokens")][..].to_vec(),
            path("tokens"),
        ),
        (vec!["--encryption-keys", &path("keys")], path("keys")),
        (
            vec![
                "--tls-cert",
                &path("cert.pem"),
                "--tls-key",
                &path("cert.pem"),
            ],
            path("cert.pem"),
        ),
        (
            vec![
                "--tls-cert",
                &path("cert.pem"),
                "--tls-key",
                &path("cert.pem"),
                "--tls-client-ca",
                &path("cert.pem"),
            ],
            "tls_client_ca".to_string(),
        ),
        (
            vec!["--reload-interval", "0s"],
            "reload_interval".to_string(),
        ),
    ] {
        let output = idemd_command(&dir.path().join("data"), &flags)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains("invalid configuration"), "{stderr}");
        assert!(stderr.contains(&names), "{flags:?} names {names}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_exits_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut process = spawn(dir.path(), &[]);
    let mut client = connect(process.addr).await;
    let lease = claimed(
        &client
            .claim(as_tenant("t", claim(PAYMENTS, "drain", 1)))
            .await
            .expect("claim")
            .into_inner(),
    );
    // A Claim waiting on the in-flight holder is in flight when SIGTERM lands.
    let mut waiting = claim(PAYMENTS, "drain", 1);
    waiting.wait = Some(dur(Duration::from_secs(3)));
    let mut waiter_client = client.clone();
    let waiter = tokio::spawn(async move { waiter_client.claim(as_tenant("t", waiting)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    sigterm(&process);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The in-flight RPC still completes...
    let _ = client
        .complete(as_tenant(
            "t",
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "drain".into(),
                lease_token: lease.lease_token,
                response: Some(sample_response("drain")),
            },
        ))
        .await;
    let answer = waiter
        .await
        .expect("task")
        .expect("in-flight claim answered, not cut off")
        .into_inner();
    assert!(
        matches!(outcome_name(&answer), "replayed" | "in_progress"),
        "{answer:?}"
    );
    let (status, process) = tokio::task::spawn_blocking(move || {
        let status = process.child.wait().expect("wait");
        (status, process)
    })
    .await
    .expect("join");
    assert_eq!(status.code(), Some(0), "graceful exit");
    let _ = process.lines.try_iter().count();
}

/// `idemd audit` is a client of a running server: it prints one key's
/// history (text or JSON lines) and never the raw key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_subcommand_prints_a_keys_history() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("idemd.toml");
    std::fs::write(
        &config,
        format!("[endpoints.\"{PAYMENTS}\"]\naudit = true\n"),
    )
    .expect("write config");
    let data = dir.path().join("data");
    let config_arg = config.to_string_lossy().to_string();
    let mut process = spawn(&data, &["--config", &config_arg]);
    let mut client = connect(process.addr).await;
    let key = "order-7731-secret-looking-key";
    let lease = claimed(
        &client
            .claim(as_tenant("acme", claim(PAYMENTS, key, 5)))
            .await
            .expect("claim")
            .into_inner(),
    );
    client
        .complete(as_tenant(
            "acme",
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: key.into(),
                lease_token: lease.lease_token,
                response: Some(sample_response("aud")),
            },
        ))
        .await
        .expect("complete");
    assert!(
        data.join("audit.redb").exists(),
        "audit file beside the records"
    );
    let target = format!("http://{}", process.addr);
    let run = move |json: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_idemd"));
        command.args([
            "audit",
            "--target",
            &target,
            "--tenant",
            "acme",
            "--endpoint",
            PAYMENTS,
            "--key",
            key,
            "--since",
            "1h",
        ]);
        if json {
            command.arg("--json");
        }
        command.output().expect("run idemd audit")
    };
    let text = tokio::task::spawn_blocking(move || (run(false), run(true)))
        .await
        .expect("join");
    let (text, json) = text;
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let stdout = String::from_utf8_lossy(&text.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains("none -> claimed"), "{stdout}");
    assert!(lines[1].contains("in_progress -> completed"), "{stdout}");
    assert!(lines[1].contains("status=201"), "{stdout}");
    assert!(!stdout.contains(key), "no raw key in the output");
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&json.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["to"], "completed");
    assert_eq!(events[1]["endpoint"], PAYMENTS);
    // Another tenant's view of the same key is empty.
    let other = std::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args([
            "audit",
            "--target",
            &format!("http://{}", process.addr),
            "--tenant",
            "globex",
            "--endpoint",
            PAYMENTS,
            "--key",
            key,
        ])
        .output()
        .expect("run");
    assert!(other.status.success());
    assert!(other.stdout.is_empty());
    sigterm(&process);
    let status = tokio::task::spawn_blocking(move || process.child.wait().expect("wait"))
        .await
        .expect("join");
    assert_eq!(status.code(), Some(0));
}
