//! Log hygiene: the whole gRPC contract suite runs with every log target at
//! debug level in JSON, captured in memory, and after each test the captured
//! lines are searched for every raw key the suite used, the request and
//! response body markers, and (in the auth test below) the bearer token.
//! Keys may appear only as SHA-256 prefixes.

mod common;
mod grpc_suite;

use std::io::Write;
use std::sync::{Mutex, Once};

use common::*;
use sha2::{Digest, Sha256};

/// Every log line of this test binary.
static CAPTURED: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_writer(|| Capture)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
    });
}

/// Strings that must never reach a log line.
fn forbidden() -> Vec<String> {
    let mut secrets: Vec<String> = grpc_suite::KEYS_USED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    secrets.extend(
        [
            // Request body (common::payment) and stored response body
            // (common::sample_response) markers.
            "cus_8812",
            "succeeded",
            // The invalid key of the bad-input tests.
            "bad key with spaces",
            // The bearer token of the auth test below.
            "hygiene-secret-token",
        ]
        .map(String::from),
    );
    secrets
}

fn assert_clean_logs() {
    let captured = CAPTURED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let text = String::from_utf8_lossy(&captured);
    assert!(
        text.contains("state transition"),
        "the capture works: transitions are logged"
    );
    for secret in forbidden() {
        if let Some(line) = text.lines().find(|line| line.contains(&secret)) {
            panic!("{secret:?} appears in a log line: {line}");
        }
    }
}

async fn start() -> TestServer {
    capture_logs();
    TestServer::embedded().await
}

grpc_suite!(start, after = assert_clean_logs);

/// With auth on, neither the token nor its full hash is logged, including
/// when it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_never_logged() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let token = "hygiene-secret-token";
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("acme {digest}\n")).expect("write");
    let mut settings = test_settings(&dir.path().join("data"));
    settings.auth_tokens = Some(tokens);
    let server = TestServer::start(dir, settings, None).await;
    let mut client = server.new_client().await;
    client
        .claim(with_token(token, claim(PAYMENTS, "hygiene-token-key", 1)))
        .await
        .expect("claim");
    client
        .claim(with_token(
            "hygiene-secret-token-wrong",
            claim(PAYMENTS, "hygiene-token-key", 1),
        ))
        .await
        .expect_err("unknown token");
    server.stop().await;
    let captured = CAPTURED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let text = String::from_utf8_lossy(&captured);
    for secret in [token, digest.as_str(), "hygiene-token-key"] {
        assert!(!text.contains(secret), "{secret:?} appears in the logs");
    }
    let _ = std::io::stderr().flush();
}
