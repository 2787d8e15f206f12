//! Tests of the `idemd` binary as a process: crash durability (`kill -9`),
//! exclusive ownership of the data directory, configuration errors, and
//! graceful shutdown on SIGTERM.

mod common;

use std::time::Duration;

use common::process::{idemd_command, kill9, sigterm, spawn};
use common::*;
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
        assert_eq!(&claimed(&again), lease);
    }
    kill9(process);
}

#[test]
fn a_second_process_on_the_same_data_dir_refuses_to_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = spawn(dir.path(), &[]);
    let output = idemd_command(dir.path(), &[]).output().expect("run second");
    assert!(!output.status.success(), "second owner must fail");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already open"), "says why: {stderr}");
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
    let status = tokio::task::spawn_blocking(move || process.child.wait().expect("wait"))
        .await
        .expect("join");
    assert_eq!(status.code(), Some(0), "graceful exit");
    let _ = process.lines.try_iter().count();
}
