//! The `idemd proxy` suite: the article's contract through the HTTP
//! sidecar, against a real upstream HTTP service started by the test
//! (`common::http::Upstream`, which counts executions) and a real HTTP
//! client. Backend-generic: each backend's test binary instantiates it with
//! `proxy_suite!(start_fn)`, where `start_fn` takes a settings hook and
//! returns a fresh [`TestServer`] (gRPC on too, for Lookup and Reconcile).

use std::net::SocketAddr;
use std::time::Duration;

use idemd::config::Settings;
use idemd::config::routes::{ProxySettings, Routes};
use idemd::proto::v1 as pb;
use tonic::Code;

use crate::common::TestServer;
use crate::common::http::{Upstream, send};

use crate::common::Starter;

mod http_scenarios;
pub use http_scenarios::http_scenarios_hold_for_the_proxy;

/// Instantiates every test of the suite for one backend.
#[macro_export]
macro_rules! proxy_suite {
    ($start:path) => {
        $crate::proxy_suite!(@tests $start;
            payment_scenario_runs_once_and_replays_byte_identical,
            keys_are_required_and_checked_before_anything_runs,
            concurrent_duplicates_execute_once,
            a_duplicate_waits_up_to_max_wait_for_the_replay,
            upstream_crash_mid_response_is_unknown_until_reconciled,
            upstream_5xx_releases_the_key_by_default,
            upstream_5xx_is_replayed_when_the_route_stores_it,
            upstream_refusing_connections_is_502_and_releases_the_key,
            oversized_bodies_are_refused_before_any_claim,
            oversized_answers_are_returned_and_the_key_is_unknown,
            a_client_that_disconnects_still_gets_its_answer_recorded,
            http_scenarios_hold_for_the_proxy,
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
                $crate::proxy_suite::$name(starter).await;
            }
        )*
    };
}

const ROUTES: &str = r#"
[[routes]]
path = "/v1/payments/{id}"
ignore_fields = ["/request_time"]

[[routes]]
path = "/optional/*"
key = "optional"

[[routes]]
path = "/stored/*"
on_5xx = "store"

[[routes]]
path = "/waiting/*"
max_wait = "5s"

[[routes]]
path = "/small/*"
max_request_bytes = 64

[[routes]]
path = "/big/*"
max_response_bytes = 1024

[[routes]]
path = "/crash/*"
upstream_timeout = "5s"
"#;

/// A proxied server in front of a fresh upstream (or `upstream` when
/// given), with the routes above.
pub struct Proxied {
    /// The server (gRPC client included).
    pub server: TestServer,
    /// The upstream.
    pub upstream: Upstream,
    /// The proxy's address.
    pub proxy: SocketAddr,
}

/// Starts the upstream and a proxy in front of `upstream_addr` (the
/// upstream's own address unless given).
pub async fn proxied(start: Starter, upstream_addr: Option<SocketAddr>) -> Proxied {
    let upstream = Upstream::start().await;
    let target = upstream_addr.unwrap_or(upstream.addr);
    let server = start(Box::new(move |settings: &mut Settings| {
        settings.proxy = Some(ProxySettings {
            listen: "127.0.0.1:0".parse().expect("addr"),
            upstream: format!("http://{target}"),
            routes: Routes::parse(ROUTES).expect("routes"),
            token_header: http::header::AUTHORIZATION,
        });
    }))
    .await;
    let proxy = server
        .server
        .as_ref()
        .and_then(|s| s.proxy_addr)
        .expect("proxy address");
    Proxied {
        server,
        upstream,
        proxy,
    }
}

/// `Lookup` of a proxied key (tenant `default`: auth is off).
async fn lookup(p: &Proxied, endpoint: &str, key: &str) -> Result<pb::Record, tonic::Status> {
    let mut client = p.server.client.clone();
    client
        .lookup(pb::LookupRequest {
            endpoint: endpoint.into(),
            key: key.into(),
            include_response: true,
        })
        .await
        .map(|r| r.into_inner().record.expect("record"))
}

fn state(record: &pb::Record) -> pb::State {
    pb::State::try_from(record.state).expect("state")
}

const JSON: (&str, &str) = ("content-type", "application/json");

pub async fn payment_scenario_runs_once_and_replays_byte_identical(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/v1/payments/p1";
    let key = ("idempotency-key", "\"pay-1\"");
    let body = br#"{"amount": 100, "currency": "usd", "request_time": "10:00:00"}"#;
    let first = send(p.proxy, "POST", path, &[key, JSON], body).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(first.header("idempotent-replayed"), None);
    assert_eq!(p.upstream.executions(path), 1);
    // The key reaches the upstream, for its own downstream calls.
    assert_eq!(
        p.upstream
            .last_headers(path)
            .get("idempotency-key")
            .map(String::as_str),
        Some("\"pay-1\"")
    );

    // A retry, with the key as a bare token, the JSON reformatted and a
    // field the route leaves out of the fingerprint (`ignore_fields`)
    // changed.
    let retry = send(
        p.proxy,
        "POST",
        path,
        &[("idempotency-key", "pay-1"), JSON],
        br#"{"currency":"usd","amount":100,"request_time":"10:00:07"}"#,
    )
    .await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.body, first.body, "replay is byte-identical");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.header("location"), Some(path));
    assert_eq!(retry.header("content-type"), Some("application/json"));
    assert_eq!(
        retry.header("set-cookie"),
        None,
        "cookies are never replayed"
    );
    assert_eq!(p.upstream.executions(path), 1, "one execution");

    // The same key for another amount: 422, nothing runs.
    let changed = send(
        p.proxy,
        "POST",
        path,
        &[key, JSON],
        br#"{"amount": 200, "currency": "usd"}"#,
    )
    .await;
    assert_eq!(changed.status, 422);
    assert_eq!(
        changed.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        changed.json()["type"],
        "https://idemd.dev/problems/idempotency_key_reuse"
    );
    assert_eq!(p.upstream.executions(path), 1);

    // Every payment shares the route's endpoint.
    let record = lookup(&p, "POST /v1/payments/{id}", "pay-1")
        .await
        .expect("record");
    assert_eq!(state(&record), pb::State::Completed);
    assert_eq!(record.response.expect("response").status, 201);
    p.server.stop().await;
}

pub async fn keys_are_required_and_checked_before_anything_runs(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/v1/payments/p2";
    let missing = send(p.proxy, "POST", path, &[JSON], b"{}").await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.json()["type"],
        "https://idemd.dev/problems/idempotency_key_missing"
    );
    for bad in ["\"unterminated", "has space", "\"a\";param=1", "\"\""] {
        let answer = send(
            p.proxy,
            "POST",
            path,
            &[("idempotency-key", bad), JSON],
            b"{}",
        )
        .await;
        assert_eq!(answer.status, 400, "{bad}");
        assert_eq!(
            answer.json()["type"],
            "https://idemd.dev/problems/idempotency_key_malformed",
            "{bad}"
        );
    }
    let long = "k".repeat(256);
    let answer = send(
        p.proxy,
        "POST",
        path,
        &[("idempotency-key", &long), JSON],
        b"{}",
    )
    .await;
    assert_eq!(answer.status, 400);
    assert_eq!(p.upstream.executions(path), 0, "nothing ran");
    // Methods the route does not mark pass through, key or not.
    let get = send(p.proxy, "GET", path, &[], b"").await;
    assert_eq!(get.status, 201);
    assert_eq!(p.upstream.executions(path), 1);
    // On a route with `key = "optional"` a request without a key passes
    // through; with a key it is idempotent.
    let optional = "/optional/o1";
    for _ in 0..2 {
        let answer = send(p.proxy, "POST", optional, &[JSON], b"{}").await;
        assert_eq!(answer.status, 201);
        assert_eq!(answer.header("idempotent-replayed"), None);
    }
    assert_eq!(p.upstream.executions(optional), 2);
    for replayed in [None, Some("true")] {
        let answer = send(
            p.proxy,
            "POST",
            optional,
            &[("idempotency-key", "opt-1"), JSON],
            b"{}",
        )
        .await;
        assert_eq!(answer.status, 201);
        assert_eq!(answer.header("idempotent-replayed"), replayed);
    }
    assert_eq!(p.upstream.executions(optional), 3);
    p.server.stop().await;
}

pub async fn concurrent_duplicates_execute_once(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/slow/c1";
    let mut calls = Vec::new();
    for _ in 0..6 {
        let proxy = p.proxy;
        calls.push(tokio::spawn(async move {
            send(
                proxy,
                "POST",
                path,
                &[("idempotency-key", "dup-1"), JSON],
                b"{\"n\":1}",
            )
            .await
        }));
    }
    let mut statuses = Vec::new();
    for call in calls {
        let answer = call.await.expect("task");
        if answer.status == 409 {
            assert!(
                answer.header("retry-after").is_some(),
                "409 says when to retry"
            );
            assert_eq!(
                answer.json()["type"],
                "https://idemd.dev/problems/request_in_progress"
            );
        }
        statuses.push(answer.status);
    }
    assert_eq!(
        p.upstream.executions(path),
        1,
        "one upstream execution: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 409),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&409),
        "duplicates during the first are 409: {statuses:?}"
    );
    p.server.stop().await;
}

pub async fn a_duplicate_waits_up_to_max_wait_for_the_replay(start: Starter) {
    let p = proxied(start, None).await;
    // `/waiting/*` has max_wait = 5s, and the upstream takes
    // `Upstream::SLOW` on any path with a `/slow/` segment.
    let path = "/waiting/slow/w1";
    let first = {
        let proxy = p.proxy;
        tokio::spawn(async move {
            send(
                proxy,
                "POST",
                path,
                &[("idempotency-key", "wait-1"), JSON],
                b"{}",
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = send(
        p.proxy,
        "POST",
        path,
        &[("idempotency-key", "wait-1"), JSON],
        b"{}",
    )
    .await;
    let first = first.await.expect("task");
    assert_eq!(first.status, 201);
    assert_eq!(p.upstream.executions(path), 1);
    // The duplicate either waited and got the replay, or came after the
    // first finished (also a replay): never a 409 within max_wait.
    assert_eq!(second.status, 201, "{:?}", second.body);
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(second.body, first.body);
    p.server.stop().await;
}

pub async fn upstream_crash_mid_response_is_unknown_until_reconciled(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/crash/x1";
    let key = ("idempotency-key", "crash-1");
    let answer = send(p.proxy, "POST", path, &[key, JSON], b"{}").await;
    assert_eq!(answer.status, 504);
    assert_eq!(
        answer.json()["type"],
        "https://idemd.dev/problems/outcome_pending"
    );
    let endpoint = format!("POST {path}");
    let record = lookup(&p, &endpoint, "crash-1").await.expect("record");
    assert_eq!(state(&record), pb::State::Unknown);
    // A retry does not run it again: the outcome is unknown.
    let retry = send(p.proxy, "POST", path, &[key, JSON], b"{}").await;
    assert_eq!(retry.status, 409);
    assert_eq!(
        retry.json()["type"],
        "https://idemd.dev/problems/outcome_pending"
    );
    assert_eq!(p.upstream.executions(path), 1);
    // An operator finds the charge went through and records the answer.
    let mut client = p.server.client.clone();
    client
        .reconcile(pb::ReconcileRequest {
            endpoint: endpoint.clone(),
            key: "crash-1".into(),
            verdict: Some(pb::reconcile_request::Verdict::Committed(
                pb::StoredResponse {
                    status: 200,
                    headers: vec![],
                    body: b"{\"reconciled\":true}".to_vec(),
                    body_ref: String::new(),
                },
            )),
        })
        .await
        .expect("reconcile");
    let replay = send(p.proxy, "POST", path, &[key, JSON], b"{}").await;
    assert_eq!(replay.status, 200);
    assert_eq!(&replay.body[..], b"{\"reconciled\":true}");
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(p.upstream.executions(path), 1);
    p.server.stop().await;
}

pub async fn upstream_5xx_releases_the_key_by_default(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/fail/f1";
    for expected_executions in 1..=2 {
        let answer = send(
            p.proxy,
            "POST",
            path,
            &[("idempotency-key", "fail-1"), JSON],
            b"{}",
        )
        .await;
        assert_eq!(answer.status, 500);
        assert_eq!(&answer.body[..], b"{\"error\":\"boom\"}");
        assert_eq!(p.upstream.executions(path), expected_executions);
    }
    let status = lookup(&p, &format!("POST {path}"), "fail-1")
        .await
        .expect_err("released");
    assert_eq!(status.code(), Code::NotFound);
    p.server.stop().await;
}

pub async fn upstream_5xx_is_replayed_when_the_route_stores_it(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/stored/fail/s1";
    for replayed in [None, Some("true")] {
        let answer = send(
            p.proxy,
            "POST",
            path,
            &[("idempotency-key", "stored-1"), JSON],
            b"{}",
        )
        .await;
        assert_eq!(answer.status, 500);
        assert_eq!(&answer.body[..], b"{\"error\":\"boom\"}");
        assert_eq!(answer.header("idempotent-replayed"), replayed);
    }
    assert_eq!(p.upstream.executions(path), 1);
    p.server.stop().await;
}

pub async fn upstream_refusing_connections_is_502_and_releases_the_key(start: Starter) {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let p = proxied(start, Some(closed)).await;
    let path = "/v1/payments/r1";
    let answer = send(
        p.proxy,
        "POST",
        path,
        &[("idempotency-key", "refused-1"), JSON],
        b"{}",
    )
    .await;
    assert_eq!(answer.status, 502);
    assert_eq!(
        answer.json()["type"],
        "https://idemd.dev/problems/upstream_unavailable"
    );
    let status = lookup(&p, "POST /v1/payments/{id}", "refused-1")
        .await
        .expect_err("released");
    assert_eq!(
        status.code(),
        Code::NotFound,
        "nothing ran: the key is free"
    );
    p.server.stop().await;
}

pub async fn oversized_bodies_are_refused_before_any_claim(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/small/s1";
    let body = vec![b' '; 65];
    let answer = send(
        p.proxy,
        "POST",
        path,
        &[("idempotency-key", "small-1"), JSON],
        &body,
    )
    .await;
    assert_eq!(answer.status, 413);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(p.upstream.executions(path), 0);
    let status = lookup(&p, &format!("POST {path}"), "small-1")
        .await
        .expect_err("no claim");
    assert_eq!(status.code(), Code::NotFound);
    p.server.stop().await;
}

pub async fn oversized_answers_are_returned_and_the_key_is_unknown(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/big/b1";
    let answer = send(
        p.proxy,
        "POST",
        path,
        &[("idempotency-key", "big-1"), JSON],
        b"{}",
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.body.len(),
        64 * 1024,
        "the whole answer reaches the caller"
    );
    let record = lookup(&p, &format!("POST {path}"), "big-1")
        .await
        .expect("record");
    assert_eq!(state(&record), pb::State::Unknown);
    assert!(
        record.reason.contains("max_response_bytes"),
        "{}",
        record.reason
    );
    assert!(record.response.is_none(), "never half-stored");
    p.server.stop().await;
}

pub async fn a_client_that_disconnects_still_gets_its_answer_recorded(start: Starter) {
    let p = proxied(start, None).await;
    let path = "/slow/d1";
    let proxy = p.proxy;
    let call = tokio::spawn(async move {
        send(
            proxy,
            "POST",
            path,
            &[("idempotency-key", "gone-1"), JSON],
            b"{}",
        )
        .await
    });
    tokio::time::sleep(Upstream::SLOW / 3).await;
    call.abort();
    // The upstream call finishes and its answer is stored.
    let endpoint = format!("POST {path}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let record = lookup(&p, &endpoint, "gone-1").await.expect("record");
        if state(&record) == pb::State::Completed {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never completed: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let retry = send(
        p.proxy,
        "POST",
        path,
        &[("idempotency-key", "gone-1"), JSON],
        b"{}",
    )
    .await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(p.upstream.executions(path), 1);
    p.server.stop().await;
}
