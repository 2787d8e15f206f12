//! Server-level behaviour: authentication and tenant scoping, token reload,
//! health across start-up and shutdown, reflection.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use idemd::proto::v1 as pb;
use idemd::store::Store;
use idemd::store::embedded::{EmbeddedOptions, EmbeddedStore};
use sha2::{Digest, Sha256};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn token_line(tenant: &str, token: &str) -> String {
    format!(
        "{tenant} {}\n",
        hex::encode(Sha256::digest(token.as_bytes()))
    )
}

async fn server_with_tokens(contents: &str) -> (TestServer, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, contents).expect("write tokens");
    let mut settings = test_settings(&dir.path().join("data"));
    settings.auth_tokens = Some(tokens.clone());
    (TestServer::start(dir, settings, None).await, tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_come_from_tokens_and_never_from_headers() {
    let contents = format!(
        "# test tokens\n{}{}",
        token_line("acme", "acme-secret"),
        token_line("globex", "globex-secret")
    );
    let (server, _) = server_with_tokens(&contents).await;
    let mut client = server.new_client().await;

    let status = client
        .claim(tonic::Request::new(claim(PAYMENTS, "k", 1)))
        .await
        .expect_err("no token");
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = client
        .claim(with_token("wrong", claim(PAYMENTS, "k", 1)))
        .await
        .expect_err("bad token");
    assert_eq!(status.code(), Code::Unauthenticated);
    // x-tenant-id is ignored when auth is on.
    let status = client
        .claim(as_tenant("acme", claim(PAYMENTS, "k", 1)))
        .await
        .expect_err("header only");
    assert_eq!(status.code(), Code::Unauthenticated);

    let lease = claimed(
        &client
            .claim(with_token("acme-secret", claim(PAYMENTS, "k", 1)))
            .await
            .expect("acme")
            .into_inner(),
    );
    client
        .complete(with_token(
            "acme-secret",
            pb::CompleteRequest {
                endpoint: PAYMENTS.into(),
                key: "k".into(),
                lease_token: lease.lease_token.clone(),
                response: Some(sample_response("acme")),
            },
        ))
        .await
        .expect("complete");
    // globex cannot see, complete or reuse acme's record, even with the token.
    let status = client
        .lookup(with_token(
            "globex-secret",
            pb::LookupRequest {
                endpoint: PAYMENTS.into(),
                key: "k".into(),
                include_response: true,
            },
        ))
        .await
        .expect_err("isolated");
    assert_eq!(status.code(), Code::NotFound);
    let mut spoofed = with_token("globex-secret", claim(PAYMENTS, "k", 1));
    spoofed
        .metadata_mut()
        .insert("x-tenant-id", "acme".parse().expect("ascii"));
    let response = client
        .claim(spoofed)
        .await
        .expect("globex claim")
        .into_inner();
    assert_eq!(
        outcome_name(&response),
        "claimed",
        "globex gets its own record, not acme's replay"
    );
    let replay = client
        .claim(with_token("acme-secret", claim(PAYMENTS, "k", 1)))
        .await
        .expect("acme")
        .into_inner();
    assert_eq!(replayed(&replay).response, Some(sample_response("acme")));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_file_changes_apply_without_restart() {
    let (server, tokens) = server_with_tokens(&token_line("acme", "old-secret")).await;
    let mut events = server
        .server
        .as_ref()
        .expect("running")
        .reload_events()
        .subscribe();
    let mut client = server.new_client().await;
    client
        .claim(with_token("old-secret", claim(PAYMENTS, "a", 1)))
        .await
        .expect("old token works");
    std::fs::write(
        &tokens,
        format!("# rotated\n{}", token_line("acme", "new-secret-longer")),
    )
    .expect("rotate");
    assert_eq!(
        next_reload(&mut events, "auth tokens").await,
        Ok("1 tokens".to_string())
    );
    client
        .claim(with_token("new-secret-longer", claim(PAYMENTS, "b", 1)))
        .await
        .expect("new token accepted once reloaded");
    let status = client
        .claim(with_token("old-secret", claim(PAYMENTS, "c", 1)))
        .await
        .expect_err("old token revoked");
    assert_eq!(status.code(), Code::Unauthenticated);
    // A broken edit keeps the last good table.
    std::fs::write(
        &tokens,
        "this line is not valid and is long enough to change the size\n",
    )
    .expect("break");
    let refused = next_reload(&mut events, "auth tokens")
        .await
        .expect_err("the broken file is refused");
    assert!(refused.contains(":1:"), "names the line: {refused}");
    client
        .claim(with_token("new-secret-longer", claim(PAYMENTS, "d", 1)))
        .await
        .expect("still valid");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_off_uses_the_tenant_header_and_validates_it() {
    let server = TestServer::embedded().await;
    let mut client = server.new_client().await;
    let status = client
        .claim(as_tenant("bad tenant!", claim(PAYMENTS, "k", 1)))
        .await
        .expect_err("bad header");
    assert_bad_field(&status, Code::InvalidArgument, "x-tenant-id");
    // No header: the `default` tenant.
    claimed(
        &client
            .claim(tonic::Request::new(claim(PAYMENTS, "k", 1)))
            .await
            .expect("default")
            .into_inner(),
    );
    let response = client
        .claim(as_tenant("default", claim(PAYMENTS, "k", 1)))
        .await
        .expect("same tenant")
        .into_inner();
    assert_eq!(outcome_name(&response), "in_progress");
    server.stop().await;
}

async fn health_of(addr: std::net::SocketAddr, service: &str) -> ServingStatus {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check")
        .into_inner();
    ServingStatus::try_from(response.status).expect("known status")
}

/// Starts a server whose store opens only when the returned sender says so,
/// like a remote cluster that takes its time.
fn start_with_slow_store(
    settings: idemd::config::Settings,
    data_dir: &std::path::Path,
) -> (
    std::sync::mpsc::Sender<()>,
    tokio::task::JoinHandle<Result<idemd::server::RunningServer, idemd::server::ServerError>>,
) {
    let data_dir = data_dir.to_path_buf();
    let (release, opened) = std::sync::mpsc::channel::<()>();
    let server_task = tokio::spawn(async move {
        let clock: Arc<dyn idemd::clock::Clock> = Arc::new(idemd::clock::SystemClock);
        idemd::server::start_with_store(settings, clock, async move {
            tokio::task::spawn_blocking(move || {
                let _ = opened.recv_timeout(Duration::from_secs(10));
                let store: Arc<dyn Store> =
                    Arc::new(EmbeddedStore::open(&EmbeddedOptions::new(&data_dir))?);
                Ok(store)
            })
            .await
            .expect("join")
        })
        .await
    });
    (release, server_task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_serving_once_started_and_not_serving_while_draining() {
    let dir = tempfile::tempdir().expect("temp dir");
    let settings = test_settings(dir.path());
    let (release, server_task) = start_with_slow_store(settings, dir.path());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!server_task.is_finished(), "start waits for the store");
    release.send(()).expect("release");
    let server = server_task.await.expect("join").expect("started");
    assert_eq!(
        health_of(server.local_addr, "").await,
        ServingStatus::Serving
    );
    assert_eq!(
        health_of(server.local_addr, "idemd.v1.Idempotency").await,
        ServingStatus::Serving
    );

    // Watch the service's health, then shut down: it turns NOT_SERVING.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.local_addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: "idemd.v1.Idempotency".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = watch.message().await.expect("stream").expect("status");
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let trigger = server.shutdown_trigger();
    let _ = trigger.send(true);
    let update = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("update in time")
        .expect("stream open while draining")
        .expect("a status");
    assert_eq!(update.status, ServingStatus::NotServing as i32);
    // A watch is a long-lived stream: the server drains until it ends.
    drop(watch);
    tokio::time::timeout(Duration::from_secs(5), server.wait())
        .await
        .expect("drains promptly once streams end")
        .expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_not_serving_before_the_store_opens() {
    // Bind a known free port first so the probe can reach the server while
    // its store is still opening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    settings.listen = Some(format!("127.0.0.1:{port}").parse().expect("addr"));
    let (release, server_task) = start_with_slow_store(settings, dir.path());
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut status = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Ok(Ok(channel)) = tokio::time::timeout(
            Duration::from_millis(500),
            tonic::transport::Channel::from_shared(format!("http://{addr}"))
                .expect("uri")
                .connect(),
        )
        .await
        {
            let response = HealthClient::new(channel.clone())
                .check(HealthCheckRequest { service: "".into() })
                .await
                .expect("check");
            status = Some(response.into_inner().status);
            // Idempotency calls are refused while starting.
            let refused = pb::idempotency_client::IdempotencyClient::new(channel)
                .claim(as_tenant("t", claim(PAYMENTS, "early", 1)))
                .await
                .expect_err("not ready");
            assert_eq!(refused.code(), Code::Unavailable);
            break;
        }
    }
    assert_eq!(status, Some(ServingStatus::NotServing as i32));
    release.send(()).expect("release");
    let server = server_task.await.expect("join").expect("started");
    assert_eq!(health_of(addr, "").await, ServingStatus::Serving);
    server.shutdown().await.expect("shutdown");
}

/// Sequential calls over plaintext are not held up by the transport: fresh
/// Claims and replays of 1 KiB and 16 KiB bodies, one request in flight
/// (src/net.rs says why this once took ~44 ms a call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_calls_at_one_in_flight_are_fast() {
    let server = TestServer::embedded().await;
    let mut client = server.new_client().await;
    latency::assert_fast_at_one_in_flight(&mut client, "plaintext", "").await;
    server.stop().await;
}

/// Lists the services of the server at `channel` through the reflection
/// protocol of the given version (`v1` or `v1alpha`; their messages have the
/// same shape, so one body serves both).
macro_rules! list_services {
    ($version:ident, $channel:expr) => {{
        use tonic_reflection::pb::$version::ServerReflectionRequest;
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = ServerReflectionClient::new($channel)
            .server_reflection_info(tokio_stream::once(request))
            .await
            .expect(concat!("reflection ", stringify!($version)))
            .into_inner();
        let response = stream.message().await.expect("stream").expect("response");
        let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
            panic!("expected a service list");
        };
        list.service
            .into_iter()
            .map(|s| s.name)
            .collect::<Vec<String>>()
    }};
}

/// Both reflection versions answer: grpcurl asks v1; ghz and Evans ask only
/// v1alpha ("server does not support the reflection API" otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_service_in_v1_and_v1alpha() {
    let server = TestServer::embedded().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let v1 = list_services!(v1, channel.clone());
    let v1alpha = list_services!(v1alpha, channel);
    for (version, names) in [("v1", &v1), ("v1alpha", &v1alpha)] {
        for service in ["idemd.v1.Idempotency", "grpc.health.v1.Health"] {
            assert!(
                names.iter().any(|name| name == service),
                "{version} lacks {service}: {names:?}"
            );
        }
    }
    server.stop().await;
}

/// Roles and endpoint allow-lists of the tokens file: `PERMISSION_DENIED`
/// naming the reason, and two-column lines keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_roles_and_endpoint_allow_lists_are_enforced() {
    let hash = |token: &str| hex::encode(Sha256::digest(token.as_bytes()));
    let contents = format!(
        "acme {} service
acme {} reconciler
acme {}
acme {} service POST /v1/pay
",
        hash("svc"),
        hash("rec"),
        hash("legacy"),
        hash("narrow"),
    );
    let (server, _) = server_with_tokens(&contents).await;
    let mut client = server.new_client().await;
    let list = |endpoint: &str| pb::ListPendingRequest {
        endpoint: endpoint.into(),
        ..Default::default()
    };
    let reason = |status: &tonic::Status| {
        use tonic_types::StatusExt;
        status
            .get_details_error_info()
            .map(|info| info.reason)
            .unwrap_or_default()
    };

    // service: executes, may not list or reconcile.
    client
        .claim(with_token("svc", claim(PAYMENTS, "roles-1", 1)))
        .await
        .expect("service claims");
    let status = client
        .list_pending(with_token("svc", list("")))
        .await
        .expect_err("service cannot list");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(reason(&status), "ROLE_NOT_ALLOWED");
    let status = client
        .reconcile(with_token(
            "svc",
            pb::ReconcileRequest {
                endpoint: PAYMENTS.into(),
                key: "roles-1".into(),
                verdict: Some(pb::reconcile_request::Verdict::Failed("x".into())),
            },
        ))
        .await
        .expect_err("service cannot reconcile");
    assert_eq!(status.code(), Code::PermissionDenied);

    // reconciler and legacy two-column lines: list and reconcile too.
    for token in ["rec", "legacy"] {
        client
            .list_pending(with_token(token, list("")))
            .await
            .unwrap_or_else(|status| panic!("{token} lists: {status:?}"));
        client
            .claim(with_token(token, claim(PAYMENTS, "roles-1", 1)))
            .await
            .unwrap_or_else(|status| panic!("{token} executes: {status:?}"));
    }

    // An endpoint allow-list: prefixes match, others are refused.
    client
        .claim(with_token("narrow", claim(PAYMENTS, "roles-2", 1)))
        .await
        .expect("POST /v1/payments starts with POST /v1/pay");
    let status = client
        .claim(with_token("narrow", claim("POST /v1/orders", "roles-2", 1)))
        .await
        .expect_err("outside the allow-list");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(reason(&status), "ENDPOINT_NOT_ALLOWED");
    assert!(
        !status.message().contains("roles-2"),
        "no key in the message"
    );
    server.stop().await;
}
