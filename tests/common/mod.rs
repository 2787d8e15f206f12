//! Shared test harness: a real idemd server on port 0, a gRPC client, and
//! helpers to build requests and inspect statuses.
//!
//! Each integration-test binary includes this module; not every binary uses
//! every helper.
#![allow(dead_code)]

pub mod certs;
pub mod http;
pub mod latency;
pub mod process;

use std::sync::Arc;
use std::time::Duration;

use idemd::clock::{Clock, ManualClock};
use idemd::config::Settings;
use idemd::engine::{ExpiredLeasePolicy, Policy};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use idemd::server::{RunningServer, ServerError};
use idemd::store::Store;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

/// Endpoint whose policy is `on_expired_lease = takeover` in test servers.
pub const TAKEOVER_ENDPOINT: &str = "POST /v1/takeover";
/// Endpoint with a small response cap (1 KiB) in test servers.
pub const SMALL_ENDPOINT: &str = "POST /v1/small";
/// Endpoint with `audit = true` in test servers.
pub const AUDITED_ENDPOINT: &str = "POST /v1/audited";
/// The default endpoint used by most tests.
pub const PAYMENTS: &str = "POST /v1/payments";

/// Changes the settings of a test server before it starts.
pub type SettingsHook = Box<dyn FnOnce(&mut Settings) + Send>;

/// Starts a test server with a settings hook: what each backend's binary
/// hands the suites that need their own settings (proxy, keys).
pub type Starter =
    fn(SettingsHook) -> std::pin::Pin<Box<dyn std::future::Future<Output = TestServer> + Send>>;

/// A [`Starter`] on the embedded store.
pub async fn start_embedded(hook: SettingsHook) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = test_settings(dir.path());
    hook(&mut settings);
    TestServer::start(dir, settings, None).await
}

/// Opens the store of a test server.
pub type StoreFactory = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Arc<dyn Store>, ServerError>> + Send>,
>;

/// A running server with a manual clock and a connected client.
pub struct TestServer {
    /// The server under test.
    pub server: Option<RunningServer>,
    /// The server's clock; tests move it forward.
    pub clock: ManualClock,
    /// A connected client.
    pub client: IdempotencyClient<Channel>,
    /// Data directory (kept alive for the test's duration).
    pub dir: tempfile::TempDir,
    /// Address of the server.
    pub addr: std::net::SocketAddr,
}

/// Settings every test server uses: default policies plus the test
/// endpoints above.
pub fn test_settings(dir: &std::path::Path) -> Settings {
    let mut settings = Settings::for_data_dir(dir);
    // Reload tests wait for the reload event (`next_reload`), not a sleep.
    settings.reload_interval = Duration::from_millis(20);
    settings.policies.endpoints.insert(
        TAKEOVER_ENDPOINT.to_string(),
        Policy {
            on_expired_lease: ExpiredLeasePolicy::Takeover,
            ..Policy::default()
        },
    );
    settings.policies.endpoints.insert(
        AUDITED_ENDPOINT.to_string(),
        Policy {
            audit: true,
            ..Policy::default()
        },
    );
    settings.policies.endpoints.insert(
        SMALL_ENDPOINT.to_string(),
        Policy {
            max_response_bytes: 1024,
            ..Policy::default()
        },
    );
    settings
}

impl TestServer {
    /// A server on the embedded store.
    pub async fn embedded() -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = test_settings(dir.path());
        Self::start(dir, settings, None).await
    }

    /// A server with the given settings and store factory (embedded when
    /// `None`).
    pub async fn start(
        dir: tempfile::TempDir,
        settings: Settings,
        store: Option<StoreFactory>,
    ) -> TestServer {
        let clock = ManualClock::starting_now();
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let server = match store {
            None => idemd::server::start(settings, shared).await,
            Some(factory) => idemd::server::start_with_store(settings, shared, factory).await,
        }
        .expect("server starts");
        let addr = server.local_addr;
        let client = connect(addr).await;
        TestServer {
            server: Some(server),
            clock,
            client,
            dir,
            addr,
        }
    }

    /// A fresh client connection.
    pub async fn new_client(&self) -> IdempotencyClient<Channel> {
        connect(self.addr).await
    }

    /// Current server time in ms.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Gracefully stops the server.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await.expect("clean shutdown");
        }
    }
}

/// Connects a client to `addr`.
pub async fn connect(addr: std::net::SocketAddr) -> IdempotencyClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("valid uri")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connects");
    IdempotencyClient::new(channel)
        .max_decoding_message_size(8 * 1024 * 1024)
        .max_encoding_message_size(8 * 1024 * 1024)
}

/// Claims `request` as `tenant` on a new client of `server`; panics on an
/// error status.
pub async fn claim_ok(
    server: &TestServer,
    tenant: &str,
    request: pb::ClaimRequest,
) -> pb::ClaimResponse {
    server
        .new_client()
        .await
        .claim(as_tenant(tenant, request))
        .await
        .expect("claim succeeds")
        .into_inner()
}

/// Milliseconds since the Unix epoch on this machine's wall clock.
pub fn wall_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis(),
    )
    .expect("ms fit i64")
}

/// A request as tenant `tenant` (auth off: `x-tenant-id`).
pub fn as_tenant<T>(tenant: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("x-tenant-id", tenant.parse().expect("ascii tenant"));
    request
}

/// A request with a bearer token.
pub fn with_token<T>(token: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii token"),
    );
    request
}

/// A JSON payment request for fingerprinting.
pub fn payment(amount: u64) -> pb::HttpRequest {
    pb::HttpRequest {
        method: "POST".into(),
        path: "/v1/payments".into(),
        body: format!(r#"{{"amount":{amount},"currency":"usd","customer":"cus_8812"}}"#)
            .into_bytes(),
        content_type: "application/json".into(),
        ignore_fields: vec![],
    }
}

/// A Claim of `key` on `endpoint` for a payment of `amount`.
pub fn claim(endpoint: &str, key: &str, amount: u64) -> pb::ClaimRequest {
    pb::ClaimRequest {
        endpoint: endpoint.into(),
        key: key.into(),
        fingerprint: Some(pb::claim_request::Fingerprint::Request(payment(amount))),
        ..Default::default()
    }
}

/// A protobuf duration.
pub fn dur(duration: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: duration.as_secs() as i64,
        nanos: duration.subsec_nanos() as i32,
    }
}

/// Milliseconds of a protobuf timestamp.
pub fn ts_ms(ts: &Option<prost_types::Timestamp>) -> i64 {
    let ts = ts.as_ref().expect("timestamp present");
    ts.seconds * 1000 + i64::from(ts.nanos) / 1_000_000
}

/// A response with repeated and ordered headers and a binary body.
pub fn sample_response(id: &str) -> pb::StoredResponse {
    pb::StoredResponse {
        status: 201,
        headers: vec![
            pb::Header {
                name: "Set-Cookie".into(),
                value: "b=2".into(),
            },
            pb::Header {
                name: "Content-Type".into(),
                value: "application/json".into(),
            },
            pb::Header {
                name: "Set-Cookie".into(),
                value: "a=1".into(),
            },
        ],
        body: {
            let mut body =
                format!(r#"{{"id":"{id}","status":"succeeded","amount":4200}}"#).into_bytes();
            body.extend_from_slice(&[0, 255, 13, 10]);
            body
        },
        body_ref: String::new(),
    }
}

/// The `Claimed` of a response, or a panic naming what came instead.
pub fn claimed(response: &pb::ClaimResponse) -> pb::Claimed {
    match &response.outcome {
        Some(pb::claim_response::Outcome::Claimed(claimed)) => claimed.clone(),
        other => panic!("expected claimed, got {other:?}"),
    }
}

/// Asserts that `again` (a holder's retried Claim after a restart) is the
/// lease `granted` before it: same token, attempt and expiry; its end may
/// be later, never earlier (a restart credits live leases with the time
/// idemd was down: docs/design.md, "Leases across a stop").
pub fn assert_lease_back(again: &pb::Claimed, granted: &pb::Claimed, what: &str) {
    assert_eq!(
        (&again.lease_token, again.attempt, &again.expires_at),
        (&granted.lease_token, granted.attempt, &granted.expires_at),
        "{what}: the holder gets its lease back"
    );
    assert!(
        ts_ms(&again.lease_expires_at) >= ts_ms(&granted.lease_expires_at),
        "{what}: a restart shortened the lease: {:?} before, {:?} after",
        granted.lease_expires_at,
        again.lease_expires_at
    );
}

/// The `Replayed` of a response, or a panic.
pub fn replayed(response: &pb::ClaimResponse) -> pb::Replayed {
    match &response.outcome {
        Some(pb::claim_response::Outcome::Replayed(replayed)) => replayed.clone(),
        other => panic!("expected replayed, got {other:?}"),
    }
}

/// Name of a claim outcome.
pub fn outcome_name(response: &pb::ClaimResponse) -> &'static str {
    use pb::claim_response::Outcome;
    match &response.outcome {
        Some(Outcome::Claimed(_)) => "claimed",
        Some(Outcome::Replayed(_)) => "replayed",
        Some(Outcome::InProgress(_)) => "in_progress",
        Some(Outcome::Mismatch(_)) => "mismatch",
        Some(Outcome::Pending(_)) => "pending",
        None => "none",
    }
}

/// Asserts `status` has `code` and a `BadRequest` violation naming `field`.
pub fn assert_bad_field(status: &Status, code: Code, field: &str) {
    assert_eq!(status.code(), code, "status: {status:?}");
    let details = status.get_error_details();
    let violations = details
        .bad_request()
        .map(|b| b.field_violations.clone())
        .unwrap_or_default();
    assert!(
        violations.iter().any(|v| v.field == field),
        "expected a violation naming {field:?}, got {violations:?} ({})",
        status.message()
    );
    assert!(
        status.message().contains(field),
        "message names the field: {}",
        status.message()
    );
}

/// Asserts `status` is FAILED_PRECONDITION with `ErrorInfo.reason` = `reason`.
pub fn assert_precondition(status: &Status, reason: &str) {
    assert_eq!(
        status.code(),
        Code::FailedPrecondition,
        "status: {status:?}"
    );
    let details = status.get_error_details();
    let info = details.error_info().expect("ErrorInfo detail");
    assert_eq!(info.reason, reason, "{}", status.message());
}

/// Waits (at most 10 s) for the next reload of `source` and returns its
/// outcome: tests change a watched file, then wait here instead of sleeping
/// past the poll interval.
pub async fn next_reload(
    events: &mut tokio::sync::broadcast::Receiver<idemd::reload::ReloadEvent>,
    source: &str,
) -> Result<String, String> {
    let wait = async {
        loop {
            match events.recv().await {
                Ok(event) if event.source == source => return event.result,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(error) => panic!("reload events closed: {error}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("no reload of {source} within 10 s"))
}

/// The response every 0.1.0-format fixture holds (`tests/fixtures`, and the
/// CQL blobs of `tests/cql/encryption_cql.rs`).
pub fn fixture_0_1_0_response() -> idemd::store::StoredResponse {
    idemd::store::StoredResponse {
        status: 201,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-a".into(), "1".into()),
            ("x-a".into(), "2".into()),
        ],
        body: b"{\"id\":\"pay_1\"}".to_vec(),
        body_ref: String::new(),
    }
}
