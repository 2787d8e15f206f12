//! The `idemd keys` suite: the operator CLI, run as the real binary, against
//! a live server. Backend-generic: each backend's test binary instantiates
//! it with `keys_suite!(start_fn)` (a [`Starter`]).
//!
//! The server's clock is manual: a claim goes stale by moving it past the
//! lease, no sleeping.

use std::process::{Command, Output};
use std::time::Duration;

use idemd::proto::v1 as pb;
use serde_json::Value;

use crate::common::*;

/// Instantiates every test of the suite for one backend.
#[macro_export]
macro_rules! keys_suite {
    ($start:path) => {
        $crate::keys_suite!(@tests $start;
            stale_claims_are_found_inspected_and_resolved_with_each_verdict,
            refusals_and_not_found_have_their_exit_codes,
            a_service_token_cannot_reconcile,
        );
    };
    (@tests $start:path; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                fn starter(
                    hook: $crate::common::SettingsHook,
                ) -> std::pin::Pin<Box<dyn std::future::Future<Output = $crate::common::TestServer> + Send>> {
                    Box::pin($start(hook))
                }
                $crate::keys_suite::$name(starter).await;
            }
        )*
    };
}

const TENANT: &str = "ops-tenant";

/// Runs `idemd keys ARGS` against `server` as [`TENANT`] (auth off).
async fn keys(server: &TestServer, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idemd"));
    command
        .arg("keys")
        .args(["--target", &format!("http://{}", server.addr)])
        .args(["--tenant", TENANT])
        .args(args)
        .env_remove("IDEMD_TOKEN");
    tokio::task::spawn_blocking(move || command.output().expect("idemd keys runs"))
        .await
        .expect("join")
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exit code")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn json_lines(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// Claims `key` with a 1 s lease as [`TENANT`].
async fn claim_key(server: &TestServer, key: &str) -> pb::Claimed {
    let mut client = server.client.clone();
    let mut request = claim(PAYMENTS, key, 7);
    request.lease = Some(dur(Duration::from_secs(1)));
    let response = client
        .claim(as_tenant(TENANT, request))
        .await
        .expect("claim")
        .into_inner();
    claimed(&response)
}

pub async fn stale_claims_are_found_inspected_and_resolved_with_each_verdict(start: Starter) {
    let server = start(Box::new(|_| {})).await;
    for key in ["k-commit", "k-release", "k-fail", "k-takeover"] {
        claim_key(&server, key).await;
    }
    server.clock.advance(Duration::from_secs(5));

    let pending = keys(&server, &["pending", "--older-than", "2s"]).await;
    assert_eq!(code(&pending), 0, "{pending:?}");
    let table = stdout(&pending);
    assert!(table.starts_with("ENDPOINT"), "{table}");
    for key in ["k-commit", "k-release", "k-fail", "k-takeover"] {
        assert!(table.contains(key), "{key} missing from:\n{table}");
    }
    let json = keys(
        &server,
        &["--output", "json", "pending", "--endpoint", PAYMENTS],
    )
    .await;
    let records = json_lines(&json);
    assert_eq!(records.len(), 4, "{}", stdout(&json));
    assert!(records.iter().all(|r| r["state"] == "STATE_IN_PROGRESS"));
    let none = keys(
        &server,
        &["--output", "json", "pending", "--older-than", "1h"],
    )
    .await;
    assert_eq!(json_lines(&none).len(), 0);

    let get = keys(
        &server,
        &["get", "--endpoint", PAYMENTS, "--key", "k-commit"],
    )
    .await;
    assert_eq!(code(&get), 0);
    assert!(stdout(&get).contains("IN_PROGRESS"), "{}", stdout(&get));

    // Committed: the response a retry will get, from a file, with a header.
    let dir = tempfile::tempdir().expect("temp dir");
    let body = dir.path().join("charge.json");
    std::fs::write(&body, "{\"id\":\"ch_1\"}").expect("write body");
    let body_arg = body.to_str().expect("utf-8 path");
    let committed = keys(
        &server,
        &[
            "reconcile",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-commit",
            "--committed-status",
            "201",
            "--committed-body-file",
            body_arg,
            "--header",
            "content-type: application/json",
            "--yes",
        ],
    )
    .await;
    assert_eq!(code(&committed), 0, "{committed:?}");
    let mut client = server.client.clone();
    let retry = client
        .claim(as_tenant(TENANT, claim(PAYMENTS, "k-commit", 7)))
        .await
        .expect("claim")
        .into_inner();
    let stored = replayed(&retry).response.expect("response");
    assert_eq!(
        (stored.status, &stored.body[..]),
        (201, &b"{\"id\":\"ch_1\"}"[..])
    );
    let shown = keys(
        &server,
        &[
            "--output",
            "json",
            "get",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-commit",
            "--with-response",
        ],
    )
    .await;
    let record = &json_lines(&shown)[0];
    assert_eq!(record["state"], "STATE_COMPLETED");
    assert_eq!(record["response"]["status"], 201);
    assert_eq!(record["response"]["headers"][0]["name"], "content-type");

    // Released: the record is gone, a retry runs the operation.
    let released = keys(
        &server,
        &[
            "release",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-release",
            "--yes",
        ],
    )
    .await;
    assert_eq!(code(&released), 0, "{released:?}");
    let gone = keys(
        &server,
        &["get", "--endpoint", PAYMENTS, "--key", "k-release"],
    )
    .await;
    assert_eq!(code(&gone), 1, "not found");

    // Failed, with its reason.
    let failed = keys(
        &server,
        &[
            "reconcile",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-fail",
            "--failed",
            "card declined",
            "--yes",
        ],
    )
    .await;
    assert_eq!(code(&failed), 0, "{failed:?}");
    let shown = stdout(&keys(&server, &["get", "--endpoint", PAYMENTS, "--key", "k-fail"]).await);
    assert!(
        shown.contains("FAILED") && shown.contains("card declined"),
        "{shown}"
    );

    // Takeover: the operator gets a lease, extends it, and completes.
    let takeover = keys(
        &server,
        &[
            "--output",
            "json",
            "reconcile",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-takeover",
            "--takeover",
            "--lease",
            "30s",
            "--yes",
        ],
    )
    .await;
    assert_eq!(code(&takeover), 0, "{takeover:?}");
    let token = json_lines(&takeover)[0]["takeover"]["leaseToken"]
        .as_str()
        .expect("lease token")
        .to_string();
    let extended = keys(
        &server,
        &[
            "extend",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-takeover",
            "--lease-token",
            &token,
            "--lease",
            "40s",
        ],
    )
    .await;
    assert_eq!(code(&extended), 0, "{extended:?}");
    assert!(stdout(&extended).contains("LEASE_EXPIRES_AT"));
    client
        .complete(as_tenant(
            TENANT,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "k-takeover".into(),
                lease_token: token,
                response: Some(sample_response("k-takeover")),
            },
        ))
        .await
        .expect("the operator's lease completes");
    // What is left to look at: only the FAILED key (ListPending keeps
    // failed outcomes listed until they expire).
    let left = keys(&server, &["--output", "json", "pending"]).await;
    let keys_left: Vec<Value> = json_lines(&left).iter().map(|r| r["key"].clone()).collect();
    assert_eq!(keys_left, vec![Value::from("k-fail")], "{}", stdout(&left));
    server.stop().await;
}

pub async fn refusals_and_not_found_have_their_exit_codes(start: Starter) {
    let server = start(Box::new(|_| {})).await;
    let unknown = keys(&server, &["get", "--endpoint", PAYMENTS, "--key", "nope"]).await;
    assert_eq!(code(&unknown), 1, "{unknown:?}");

    // A completed key is not pending: the verdict is refused.
    let lease = claim_key(&server, "k-done").await;
    let mut client = server.client.clone();
    client
        .complete(as_tenant(
            TENANT,
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "k-done".into(),
                lease_token: lease.lease_token,
                response: Some(sample_response("k-done")),
            },
        ))
        .await
        .expect("complete");
    let refused = keys(
        &server,
        &[
            "release",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-done",
            "--yes",
        ],
    )
    .await;
    assert_eq!(code(&refused), 3, "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("FailedPrecondition"));
    let wrong_token = keys(
        &server,
        &[
            "extend",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-done",
            "--lease-token",
            "not-the-token",
        ],
    )
    .await;
    assert_eq!(code(&wrong_token), 3, "{wrong_token:?}");

    let missing_file = keys(
        &server,
        &[
            "reconcile",
            "--endpoint",
            PAYMENTS,
            "--key",
            "k-done",
            "--committed-status",
            "200",
            "--committed-body-file",
            "/nonexistent/body.json",
            "--yes",
        ],
    )
    .await;
    assert_eq!(code(&missing_file), 2, "{missing_file:?}");
    server.stop().await;

    // No server at all.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_idemd"))
            .args(["keys", "--target", &format!("http://{closed}"), "pending"])
            .output()
            .expect("runs")
    })
    .await
    .expect("join");
    assert_eq!(code(&output), 4, "{output:?}");
}

pub async fn a_service_token_cannot_reconcile(start: Starter) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens");
    let line = |tenant: &str, token: &str, role: &str| {
        use sha2::Digest;
        format!(
            "{tenant} {} {role}\n",
            hex::encode(sha2::Sha256::digest(token.as_bytes()))
        )
    };
    std::fs::write(
        &tokens,
        format!(
            "{}{}",
            line("acme", "svc-secret", "service"),
            line("acme", "ops-secret", "reconciler")
        ),
    )
    .expect("write tokens");
    let server = start(Box::new(move |settings| {
        settings.auth_tokens = Some(tokens)
    }))
    .await;
    let run = |token: &'static str, args: &'static [&'static str]| {
        let addr = server.addr;
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_idemd"))
                .arg("keys")
                .args(["--target", &format!("http://{addr}")])
                .args(args)
                .env("IDEMD_TOKEN", token)
                .output()
                .expect("runs")
        })
    };
    let denied = run("svc-secret", &["pending"]).await.expect("join");
    assert_eq!(code(&denied), 3, "{denied:?}");
    assert!(String::from_utf8_lossy(&denied.stderr).contains("PermissionDenied"));
    let allowed = run("ops-secret", &["pending"]).await.expect("join");
    assert_eq!(code(&allowed), 0, "{allowed:?}");
    server.stop().await;
    drop(dir);
}
