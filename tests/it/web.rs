//! The HTTP front doors beyond the proxy suite: the HTTP/JSON API (every
//! RPC, problem details, auth) and TLS with client certificates through
//! curl, a client nobody here wrote.

use std::net::SocketAddr;
use std::process::Command;

use idemd::config::TlsSettings;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::certs::Ca;
use crate::common::http::send;
use crate::common::{TestServer, test_settings};

async fn api_server(tokens: Option<&str>) -> (TestServer, SocketAddr) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(&dir.path().join("data"));
    settings.http_listen = Some("127.0.0.1:0".parse().expect("addr"));
    if let Some(tokens) = tokens {
        let path = dir.path().join("tokens");
        std::fs::write(&path, tokens).expect("write tokens");
        settings.auth_tokens = Some(path);
    }
    let server = TestServer::start(dir, settings, None).await;
    let http = server
        .server
        .as_ref()
        .and_then(|s| s.http_addr)
        .expect("http address");
    (server, http)
}

async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let answer = send(addr, "POST", path, &all, body.to_string().as_bytes()).await;
    let json = if answer.body.is_empty() {
        Value::Null
    } else {
        answer.json()
    };
    (answer.status, json)
}

const ENDPOINT: &str = "POST /v1/payments";

fn payment(amount: u64) -> Value {
    json!({
        "endpoint": ENDPOINT,
        "key": "json-1",
        "request": {
            "method": "POST",
            "path": "/v1/payments",
            "body": base64(format!("{{\"amount\":{amount}}}").as_bytes()),
            "contentType": "application/json",
        },
        "lease": "30s",
    })
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_in_proto3_json() {
    let (server, http) = api_server(None).await;
    let (status, claimed) = post(http, "/v1/claim", &[], payment(100)).await;
    assert_eq!(status, 200, "{claimed}");
    let token = claimed["claimed"]["leaseToken"]
        .as_str()
        .expect("leaseToken")
        .to_string();
    assert!(
        claimed["claimed"]["leaseExpiresAt"]
            .as_str()
            .expect("RFC 3339")
            .ends_with('Z')
    );

    let (status, extended) = post(
        http,
        "/v1/extend-lease",
        &[],
        json!({"endpoint": ENDPOINT, "key": "json-1", "leaseToken": token, "lease": "20s"}),
    )
    .await;
    assert_eq!(status, 200, "{extended}");

    let body = base64(b"{\"id\":\"pay_1\"}");
    let (status, completed) = post(
        http,
        "/v1/complete",
        &[],
        json!({"endpoint": ENDPOINT, "key": "json-1", "lease_token": token,
               "response": {"status": 201, "headers": [{"name": "content-type", "value": "application/json"}], "body": body}}),
    )
    .await;
    assert_eq!(status, 200, "{completed}");
    assert!(completed["expiresAt"].is_string());

    let (status, replayed) = post(http, "/v1/claim", &[], payment(100)).await;
    assert_eq!(status, 200);
    assert_eq!(replayed["httpStatus"], 201);
    assert_eq!(replayed["replayed"]["response"]["body"], body.as_str());

    let (status, mismatch) = post(http, "/v1/claim", &[], payment(999)).await;
    assert_eq!(status, 200);
    assert_eq!(mismatch["httpStatus"], 422);
    assert_eq!(mismatch["errorCode"], "idempotency_key_reuse");

    let (status, looked_up) = post(
        http,
        "/v1/lookup",
        &[],
        json!({"endpoint": ENDPOINT, "key": "json-1", "includeResponse": true}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(looked_up["record"]["state"], "STATE_COMPLETED");

    // A claim left unknown, found by list-pending, settled by reconcile.
    let mut other = payment(5);
    other["key"] = json!("json-2");
    let (_, claimed) = post(http, "/v1/claim", &[], other).await;
    let token = claimed["claimed"]["leaseToken"]
        .as_str()
        .expect("token")
        .to_string();
    let (status, _) = post(
        http,
        "/v1/fail",
        &[],
        json!({"endpoint": ENDPOINT, "key": "json-2", "leaseToken": token,
               "disposition": "DISPOSITION_UNKNOWN", "reason": "timeout"}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, pending) =
        post(http, "/v1/list-pending", &[], json!({"endpoint": ENDPOINT})).await;
    assert_eq!(status, 200);
    let keys: Vec<&Value> = pending["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| &r["key"])
        .collect();
    assert_eq!(keys, vec![&json!("json-2")]);
    let (status, reconciled) = post(
        http,
        "/v1/reconcile",
        &[],
        json!({"endpoint": ENDPOINT, "key": "json-2", "released": {}}),
    )
    .await;
    assert_eq!(status, 200, "{reconciled}");

    let (status, events) = post(http, "/v1/audit-events", &[], json!({})).await;
    assert_eq!(status, 200, "{events}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_problem_details_with_the_grpc_code() {
    let (server, http) = api_server(None).await;
    let mut bad = payment(1);
    bad["key"] = json!("");
    let answer = send(
        http,
        "POST",
        "/v1/claim",
        &[("content-type", "application/json")],
        bad.to_string().as_bytes(),
    )
    .await;
    assert_eq!(answer.status, 400);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    let problem = answer.json();
    assert_eq!(problem["grpc_code"], "INVALID_ARGUMENT");
    assert_eq!(problem["status"], 400);
    assert_eq!(
        problem["details"][0]["@type"],
        "type.googleapis.com/google.rpc.BadRequest"
    );
    assert_eq!(problem["details"][0]["fieldViolations"][0]["field"], "key");

    let (status, problem) = post(
        http,
        "/v1/complete",
        &[],
        json!({"endpoint": ENDPOINT, "key": "nope", "leaseToken": "abc", "response": {"status": 200}}),
    )
    .await;
    assert_eq!(status, 404, "{problem}");
    assert_eq!(problem["grpc_code"], "NOT_FOUND");

    let (status, problem) = post(
        http,
        "/v1/claim",
        &[],
        json!({"endpoint": ENDPOINT, "unknownField": 1}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(problem["type"], "https://idemd.dev/problems/invalid_json");

    let answer = send(http, "GET", "/v1/claim", &[], b"").await;
    assert_eq!(answer.status, 405);
    let answer = send(http, "POST", "/v1/nothing", &[], b"{}").await;
    assert_eq!(answer.status, 404);
    let answer = send(
        http,
        "POST",
        "/v1/claim",
        &[("content-type", "text/plain")],
        b"{}",
    )
    .await;
    assert_eq!(answer.status, 415);
    server.stop().await;
}

fn token_line(tenant: &str, token: &str) -> String {
    format!(
        "{tenant} {}\n",
        hex::encode(Sha256::digest(token.as_bytes()))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_comes_from_the_token() {
    let tokens = format!(
        "{}{}",
        token_line("acme", "acme-secret"),
        token_line("globex", "globex-secret")
    );
    let (server, http) = api_server(Some(&tokens)).await;
    let (status, problem) = post(http, "/v1/claim", &[], payment(1)).await;
    assert_eq!(status, 401, "{problem}");
    assert_eq!(problem["grpc_code"], "UNAUTHENTICATED");
    // x-tenant-id is ignored whenever auth is on.
    let (status, _) = post(http, "/v1/claim", &[("x-tenant-id", "acme")], payment(1)).await;
    assert_eq!(status, 401);
    let (status, claimed) = post(
        http,
        "/v1/claim",
        &[("authorization", "Bearer acme-secret")],
        payment(1),
    )
    .await;
    assert_eq!(status, 200);
    assert!(claimed["claimed"].is_object());
    // Another tenant neither sees nor collides with acme's key.
    let lookup = json!({"endpoint": ENDPOINT, "key": "json-1"});
    let (status, _) = post(
        http,
        "/v1/lookup",
        &[("authorization", "Bearer globex-secret")],
        lookup.clone(),
    )
    .await;
    assert_eq!(status, 404);
    let (status, claimed) = post(
        http,
        "/v1/claim",
        &[("authorization", "Bearer globex-secret")],
        payment(2),
    )
    .await;
    assert_eq!(status, 200);
    assert!(claimed["claimed"].is_object(), "{claimed}");
    server.stop().await;
}

/// curl over mTLS, to the JSON API and the proxy: the tenant is the
/// client certificate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_callers_are_mapped_to_tenants_by_curl() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let path = |name: &str| dir.path().join(name);
    let write = |name: &str, text: &str| std::fs::write(path(name), text).expect("write");
    let (cert, key) = server_ca.server();
    write("tls.crt", &cert);
    write("tls.key", &key);
    write("ca.crt", &server_ca.pem);
    write("client-ca.crt", &client_ca.pem);
    write(
        "client-tenants",
        "spiffe://test.idemd/a tenant-a admin\nspiffe://test.idemd/b tenant-b admin\n",
    );
    for (name, uri) in [
        ("a", "spiffe://test.idemd/a"),
        ("b", "spiffe://test.idemd/b"),
    ] {
        let (cert, key) = client_ca.client_uri(uri);
        write(&format!("{name}.crt"), &cert);
        write(&format!("{name}.key"), &key);
    }
    let upstream = crate::common::http::Upstream::start().await;
    let mut settings = test_settings(&path("data"));
    settings.listen = None;
    settings.http_listen = Some("127.0.0.1:0".parse().expect("addr"));
    settings.proxy = Some(idemd::config::routes::ProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        upstream: format!("http://{}", upstream.addr),
        routes: idemd::config::routes::Routes::default(),
        token_header: http::header::AUTHORIZATION,
    });
    settings.tls = Some(TlsSettings {
        cert: path("tls.crt"),
        key: path("tls.key"),
        client_ca: Some(path("client-ca.crt")),
        client_tenants: Some(path("client-tenants")),
    });
    let clock: std::sync::Arc<dyn idemd::clock::Clock> =
        std::sync::Arc::new(idemd::clock::ManualClock::starting_now());
    let server = idemd::server::start(settings, clock).await.expect("starts");
    let http = server.http_addr.expect("http");
    let proxy = server.proxy_addr.expect("proxy");

    let curl = |client: Option<&str>, url: String, body: &str, extra: &[&str]| {
        let mut command = Command::new("curl");
        command
            .args(["--silent", "--show-error", "--cacert"])
            .arg(path("ca.crt"))
            .args(["-H", "content-type: application/json", "--data", body])
            .args(["--write-out", "\n%{http_code}"]);
        if let Some(client) = client {
            command
                .arg("--cert")
                .arg(path(&format!("{client}.crt")))
                .arg("--key")
                .arg(path(&format!("{client}.key")));
        }
        command.args(extra).arg(url);
        let output = command.output().expect("curl runs");
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        (output.status.success(), text)
    };
    let claim_url = format!("https://localhost:{}/v1/claim", http.port());
    let (ok, text) = curl(Some("a"), claim_url.clone(), &payment(1).to_string(), &[]);
    assert!(ok, "{text}");
    assert!(
        text.ends_with("\n200") && text.contains("leaseToken"),
        "{text}"
    );
    // Tenant b does not see tenant a's key.
    let lookup_url = format!("https://localhost:{}/v1/lookup", http.port());
    let lookup = json!({"endpoint": ENDPOINT, "key": "json-1"}).to_string();
    let (_, text) = curl(Some("b"), lookup_url.clone(), &lookup, &[]);
    assert!(text.ends_with("\n404"), "{text}");
    let (_, text) = curl(Some("a"), lookup_url, &lookup, &[]);
    assert!(text.ends_with("\n200"), "{text}");
    // Without a client certificate the handshake is refused.
    let (ok, _) = curl(None, claim_url, &payment(1).to_string(), &[]);
    assert!(!ok, "a caller without a certificate got through");

    // The proxy over mTLS: one execution, then a replay.
    let proxied = format!("https://localhost:{}/v1/orders", proxy.port());
    for replay in [false, true] {
        let (ok, text) = curl(
            Some("a"),
            proxied.clone(),
            "{\"sku\":1}",
            &["-H", "Idempotency-Key: \"order-1\"", "--include"],
        );
        assert!(ok && text.ends_with("\n201"), "{text}");
        assert_eq!(
            text.to_ascii_lowercase()
                .contains("idempotent-replayed: true"),
            replay,
            "{text}"
        );
    }
    assert_eq!(upstream.executions("/v1/orders"), 1);
    server.shutdown().await.expect("clean shutdown");
}

/// The README's proxy example runs as written against a live proxy: one
/// upstream execution, a marked replay, a 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_proxy_example_runs_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let block = readme
        .split("<!-- readme-proxy-example -->")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the marked example block")
        .to_string();
    let upstream = crate::common::http::Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    settings.proxy = Some(idemd::config::routes::ProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        upstream: format!("http://{}", upstream.addr),
        routes: idemd::config::routes::Routes::default(),
        token_header: http::header::AUTHORIZATION,
    });
    let server = TestServer::start(dir, settings, None).await;
    let proxy = server
        .server
        .as_ref()
        .and_then(|s| s.proxy_addr)
        .expect("proxy");
    let output = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block])
            .env("PROXY", proxy.to_string())
            .output()
            .expect("bash runs")
    })
    .await
    .expect("task");
    let text = String::from_utf8_lossy(&output.stdout).to_ascii_lowercase();
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // curl prints each status line right after the previous body.
    let statuses: Vec<&str> = text
        .split("http/1.1 ")
        .skip(1)
        .map(|rest| rest.get(..3).unwrap_or(rest))
        .collect();
    assert_eq!(statuses, ["201", "201", "422"], "{text}");
    assert_eq!(
        text.matches("idempotent-replayed: true").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("content-type: application/problem+json"),
        "{text}"
    );
    assert_eq!(upstream.executions("/v1/payments"), 1);
    server.stop().await;
}

/// `idemd proxy` as a process: configured by flags and `IDEMD_*`
/// variables, no gRPC port unless asked, and its outcomes counted in
/// `idemd_proxy_requests_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_command_counts_its_outcomes_in_metrics() {
    let upstream = crate::common::http::Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let metrics = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let mut command = crate::common::process::proxy_command(dir.path(), upstream.addr);
    command.args(["--metrics-listen", &metrics.to_string()]);
    let mut process = crate::common::process::spawn_command(command);
    assert_eq!(process.serving["grpc"], "off", "{}", process.serving);
    assert_eq!(process.serving["proxy"], process.addr.to_string());
    let proxy = process.addr;
    let key = ("idempotency-key", "m-1");
    for _ in 0..2 {
        let answer = send(proxy, "POST", "/v1/orders", &[key], b"{}").await;
        assert_eq!(answer.status, 201);
    }
    let missing = send(proxy, "POST", "/v1/orders", &[], b"{}").await;
    assert_eq!(missing.status, 400);
    let text =
        String::from_utf8_lossy(&send(metrics, "GET", "/metrics", &[], b"").await.body).to_string();
    for (outcome, count) in [("executed", 1), ("replayed", 1), ("rejected", 1)] {
        let line = format!("idemd_proxy_requests_total{{outcome=\"{outcome}\"}} {count}");
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    assert!(
        text.contains("idemd_proxy_upstream_duration_seconds_count 1"),
        "{text}"
    );
    process.child.kill().expect("kill");
    process.child.wait().expect("reaped");
}

/// With `--token-header`, the proxy's tenant comes from that header's
/// bearer token; the header is not forwarded upstream while the
/// application's own `Authorization` is; tenants never share keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_takes_the_tenant_from_its_own_token_header() {
    let upstream = crate::common::http::Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "{}{}",
            token_line("acme", "acme-secret"),
            token_line("globex", "globex-secret")
        ),
    )
    .expect("write tokens");
    let mut settings = test_settings(&dir.path().join("data"));
    settings.auth_tokens = Some(tokens);
    settings.proxy = Some(idemd::config::routes::ProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        upstream: format!("http://{}", upstream.addr),
        routes: idemd::config::routes::Routes::default(),
        token_header: http::HeaderName::from_static("x-idemd-token"),
    });
    let server = TestServer::start(dir, settings, None).await;
    let proxy = server
        .server
        .as_ref()
        .and_then(|s| s.proxy_addr)
        .expect("proxy");
    let path = "/v1/orders";
    let key = ("idempotency-key", "shared-key");
    let app_auth = ("authorization", "Bearer app-user-token");

    let anonymous = send(proxy, "POST", path, &[key, app_auth], b"{}").await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.json()["grpc_code"], "UNAUTHENTICATED");
    assert_eq!(upstream.executions(path), 0);

    let acme = ("x-idemd-token", "Bearer acme-secret");
    let first = send(proxy, "POST", path, &[key, app_auth, acme], b"{}").await;
    assert_eq!(first.status, 201);
    let seen = upstream.last_headers(path);
    assert_eq!(
        seen.get("x-idemd-token"),
        None,
        "the proxy's credential stays in the proxy"
    );
    assert_eq!(
        seen.get("authorization").map(String::as_str),
        Some("Bearer app-user-token")
    );
    let replay = send(proxy, "POST", path, &[key, acme], b"{}").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    // The same key for another tenant is another key: it runs.
    let globex = ("x-idemd-token", "Bearer globex-secret");
    let other = send(proxy, "POST", path, &[key, globex], b"{}").await;
    assert_eq!(other.status, 201);
    assert_eq!(other.header("idempotent-replayed"), None);
    assert_eq!(upstream.executions(path), 2);
    server.stop().await;
}
