//! Calls at one request in flight, timed through a real gRPC client.
//!
//! Why: a transport defect (TCP_NODELAY missing on accepted sockets, issue
//! 12) once made every call whose reply left in two TCP segments wait ~44 ms
//! for the client's delayed ACK, for idemd and the bench's no-op server alike.
//! Throughput at saturation hides it; a sequential caller, the one that
//! matters for a service calling idemd before each side effect, does not.
//! The bound is generous (a busy CI runner stays far below it; the defect is
//! far above it); the healthy figure is well under a millisecond.

use std::time::{Duration, Instant};

use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use tonic::Request;
use tonic::transport::Channel;

use super::{PAYMENTS, claim, claimed, replayed};

/// Calls timed per measurement.
pub const CALLS: usize = 200;
/// Largest p50 accepted at one request in flight.
pub const MAX_P50: Duration = Duration::from_millis(10);
/// Stored body sizes of the replay measurements: one that fits a small
/// frame and one that spans several TCP segments and HTTP/2 DATA frames.
pub const BODY_SIZES: [usize; 2] = [1024, 16 * 1024];

/// p50 and p99 of a sample.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
}

fn percentiles(mut sample: Vec<Duration>) -> Percentiles {
    sample.sort_unstable();
    let at = |q: f64| sample[((sample.len() - 1) as f64 * q).round() as usize];
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn as_tenant<T>(tenant: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    if !tenant.is_empty() {
        request
            .metadata_mut()
            .insert("x-tenant-id", tenant.parse().expect("ascii tenant"));
    }
    request
}

/// A stored response whose body is `size` bytes.
fn response_of(size: usize) -> pb::StoredResponse {
    pb::StoredResponse {
        status: 201,
        headers: vec![pb::Header {
            name: "content-type".into(),
            value: "application/json".into(),
        }],
        body: vec![b'x'; size],
        body_ref: String::new(),
    }
}

/// Times [`CALLS`] sequential fresh Claims and, per [`BODY_SIZES`],
/// [`CALLS`] sequential replays of a completed key; asserts every p50 is
/// under [`MAX_P50`] and every answer is the expected one. `label` names the
/// transport in messages; keys are unique per `label`, and `tenant` is sent
/// as `x-tenant-id` when not empty (servers without auth).
pub async fn assert_fast_at_one_in_flight(
    client: &mut IdempotencyClient<Channel>,
    label: &str,
    tenant: &str,
) {
    let run = format!("{label}-{:x}", rand_suffix());
    // Warm the connection (HTTP/2 settings, TLS session, first store write).
    for i in 0..5 {
        let key = format!("{run}-warm-{i}");
        client
            .claim(as_tenant(tenant, claim(PAYMENTS, &key, 1)))
            .await
            .expect("warm-up claim");
    }

    let mut sample = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let key = format!("{run}-fresh-{i}");
        let started = Instant::now();
        let response = client
            .claim(as_tenant(tenant, claim(PAYMENTS, &key, 1)))
            .await
            .expect("fresh claim")
            .into_inner();
        sample.push(started.elapsed());
        claimed(&response);
    }
    report_and_check(label, "fresh Claim", percentiles(sample));

    for size in BODY_SIZES {
        let key = format!("{run}-replay-{size}");
        let response = client
            .claim(as_tenant(tenant, claim(PAYMENTS, &key, 1)))
            .await
            .expect("claim of the replay key")
            .into_inner();
        client
            .complete(as_tenant(
                tenant,
                pb::CompleteRequest {
                    endpoint: PAYMENTS.into(),
                    key: key.clone(),
                    lease_token: claimed(&response).lease_token,
                    response: Some(response_of(size)),
                },
            ))
            .await
            .expect("complete");
        let mut sample = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let started = Instant::now();
            let response = client
                .claim(as_tenant(tenant, claim(PAYMENTS, &key, 1)))
                .await
                .expect("replay")
                .into_inner();
            sample.push(started.elapsed());
            let body_len = replayed(&response).response.map_or(0, |r| r.body.len());
            assert_eq!(body_len, size, "{label}: replayed body length");
        }
        report_and_check(
            label,
            &format!("replay of a {} KiB body", size / 1024),
            percentiles(sample),
        );
    }
}

fn report_and_check(label: &str, what: &str, figures: Percentiles) {
    eprintln!(
        "latency ({label}): {CALLS} sequential calls, {what}: p50 {:.2} ms, p99 {:.2} ms",
        figures.p50.as_secs_f64() * 1000.0,
        figures.p99.as_secs_f64() * 1000.0
    );
    assert!(
        figures.p50 < MAX_P50,
        "{label}: {what} at one request in flight has p50 {:?} (bound {MAX_P50:?}): \
         a transport stall (is TCP_NODELAY set on accepted sockets? see src/net.rs)",
        figures.p50
    );
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
