//! Prometheus metrics: every metric name, its help text and buckets, in one
//! place, plus the label-cardinality guard and the exporter.
//!
//! Names are part of the product: dashboards and the alerts in
//! `deploy/prometheus/` depend on them. Change one only with a migration
//! note. The exporter serves `GET /metrics` on `--metrics-listen`, separate
//! from the gRPC port.
//!
//! Tenant and endpoint label values are capped (`--metrics-max-tenants`,
//! `--metrics-max-endpoints`, default 100 each): values beyond the cap are
//! reported as `_other` and counted in [`LABEL_OVERFLOW`], so one noisy
//! client cannot blow up the time-series database.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Mutex;

use http_body_util::Full;
use hyper::body::Bytes;
use metrics::{describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Claims by outcome: claimed, replayed, in_progress, mismatch, pending,
/// rejected (invalid input or credentials).
pub const CLAIMS: &str = "idemd_claims_total";
/// Successful Complete calls.
pub const COMPLETIONS: &str = "idemd_completions_total";
/// Successful Fail calls by disposition (release, unknown, failed).
pub const FAILURES: &str = "idemd_failures_total";
/// Successful Reconcile calls by verdict.
pub const RECONCILIATIONS: &str = "idemd_reconciliations_total";
/// Fenced calls refused because the caller's lease was lost.
pub const LEASE_LOST: &str = "idemd_lease_lost_total";
/// RPC latency by method and gRPC code.
pub const RPC_DURATION: &str = "idemd_rpc_duration_seconds";
/// Store operation latency by backend and operation.
pub const STORE_DURATION: &str = "idemd_store_operation_duration_seconds";
/// Embedded store: time each write spent in each stage of the writer
/// (`queue`, `checkpoint_wait`, `apply`, `log_write`, `fsync`, `commit`),
/// recorded per operation: which stage the slow writes waited in.
pub const EMBEDDED_WRITE_STAGE: &str = "idemd_embedded_write_stage_duration_seconds";
/// Embedded store: time from a write's queueing to its answer, labelled
/// with the stage that took most of it (`slowest_stage`): the slowest
/// writes name their own cause.
pub const EMBEDDED_WRITE: &str = "idemd_embedded_write_duration_seconds";
/// Embedded store: duration of each checkpoint (the durable redb commit
/// after which the write-ahead log is reused).
pub const EMBEDDED_CHECKPOINT: &str = "idemd_embedded_checkpoint_duration_seconds";
/// Embedded store: 1 once a block of the database file was found not to
/// match its checksum (by a read or the scrub); the store then answers
/// `DATA_LOSS` and its health is NOT_SERVING. Alert on it.
pub const EMBEDDED_DAMAGED_BLOCKS: &str = "idemd_embedded_damaged_blocks";
/// Embedded store: bytes of the database file the scrub has checked.
pub const EMBEDDED_SCRUB_BYTES: &str = "idemd_embedded_scrub_bytes_total";
/// Embedded store: scrub passes finished over the whole file.
pub const EMBEDDED_SCRUB_PASSES: &str = "idemd_embedded_scrub_passes_total";
/// Embedded store: when the last scrub pass finished (Unix seconds): an
/// alert on its age catches a scrub that no longer finishes.
pub const EMBEDDED_SCRUB_LAST_PASS: &str = "idemd_embedded_scrub_last_pass_timestamp_seconds";
/// Store operations that failed, by backend and operation.
pub const STORE_ERRORS: &str = "idemd_store_errors_total";
/// Writes whose outcome was uncertain (then resolved or reported).
pub const STORE_UNCERTAIN: &str = "idemd_store_uncertain_writes_total";
/// Records that need a decision, by tenant and state.
pub const PENDING_RECORDS: &str = "idemd_pending_records";
/// Age of the oldest record that needs a decision, by tenant.
pub const PENDING_OLDEST_AGE: &str = "idemd_pending_oldest_age_seconds";
/// Size of stored responses.
pub const STORED_RESPONSE_BYTES: &str = "idemd_stored_response_bytes";
/// Build information (value 1).
pub const BUILD_INFO: &str = "idemd_build_info";
/// Audit appends that failed (the transition itself succeeded), by backend.
pub const AUDIT_WRITE_ERRORS: &str = "idemd_audit_write_errors_total";
/// Calls refused by a limit, by limit (`new_keys` per tenant, `in_flight`).
pub const RATE_LIMITED: &str = "idemd_rate_limited_total";
/// Reloads of watched files (tokens, client tenants, certificates), by
/// source and result (`ok`, `error`: the previous version stays).
pub const RELOADS: &str = "idemd_reloads_total";
/// Requests through `idemd proxy` by outcome: executed, replayed,
/// in_progress, mismatch, pending, rejected, passthrough, released,
/// upstream_unavailable, upstream_unknown, too_large, unrecorded.
pub const PROXY_REQUESTS: &str = "idemd_proxy_requests_total";
/// Time `idemd proxy` waited for its upstream's answer.
pub const PROXY_UPSTREAM_DURATION: &str = "idemd_proxy_upstream_duration_seconds";
/// Label values replaced by `_other` because of the cardinality cap.
pub const LABEL_OVERFLOW: &str = "idemd_metric_label_overflow_total";

/// This replica's clock minus the cluster's (the store's), in seconds, at
/// the last maintenance step (`engine::skew`); absent on stores of one
/// process.
pub const CLOCK_OFFSET: &str = "idemd_clock_offset_seconds";
/// Claims of keys whose lease looked expired by this replica's clock,
/// answered IN_PROGRESS (no takeover, no pending answer) because that clock
/// may be further from the cluster's than half of `max_clock_skew`.
pub const TAKEOVERS_REFUSED: &str = "idemd_takeovers_refused_total";

/// The value that replaces label values beyond the cap.
pub const OVERFLOW_VALUE: &str = "_other";

/// Latency buckets (seconds): 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Response size buckets (bytes): 64 B to 4 MiB.
const SIZE_BUCKETS: &[f64] = &[
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
];

/// Registers help text for every metric.
pub fn describe() {
    describe_counter!(
        CLAIMS,
        "Claims by outcome (claimed, replayed, in_progress, mismatch, pending, rejected)."
    );
    describe_counter!(COMPLETIONS, "Successful Complete calls.");
    describe_counter!(FAILURES, "Successful Fail calls by disposition.");
    describe_counter!(RECONCILIATIONS, "Successful Reconcile calls by verdict.");
    describe_counter!(
        LEASE_LOST,
        "Fenced calls refused because the lease was lost."
    );
    describe_histogram!(
        RPC_DURATION,
        metrics::Unit::Seconds,
        "gRPC request latency by method and status code."
    );
    describe_histogram!(
        STORE_DURATION,
        metrics::Unit::Seconds,
        "Store operation latency."
    );
    describe_counter!(STORE_ERRORS, "Store operations that failed.");
    describe_histogram!(
        EMBEDDED_WRITE_STAGE,
        metrics::Unit::Seconds,
        "Embedded store: time each write spent in each writer stage (queue, checkpoint_wait, apply, log_write, fsync, commit)."
    );
    describe_histogram!(
        EMBEDDED_WRITE,
        metrics::Unit::Seconds,
        "Embedded store: time from a write's queueing to its answer, by the stage that took most of it."
    );
    describe_histogram!(
        EMBEDDED_CHECKPOINT,
        metrics::Unit::Seconds,
        "Embedded store: duration of each checkpoint (durable redb commit)."
    );
    describe_gauge!(
        EMBEDDED_DAMAGED_BLOCKS,
        "1 once a block of the embedded store's file failed its checksum (the store answers DATA_LOSS)."
    );
    describe_counter!(
        EMBEDDED_SCRUB_BYTES,
        "Bytes of the embedded store's file checked by the scrub."
    );
    describe_counter!(
        EMBEDDED_SCRUB_PASSES,
        "Scrub passes finished over the embedded store's whole file."
    );
    describe_gauge!(
        EMBEDDED_SCRUB_LAST_PASS,
        "When the last scrub pass of the embedded store's file finished (Unix seconds)."
    );
    describe_counter!(
        RATE_LIMITED,
        "Calls refused with RESOURCE_EXHAUSTED by a limit: new_keys (per-tenant key creation rate) or in_flight (load shedding)."
    );
    describe_counter!(
        AUDIT_WRITE_ERRORS,
        "Audit log appends that failed; the transitions they describe are durable but missing from the audit log."
    );
    describe_counter!(
        STORE_UNCERTAIN,
        "Store writes whose outcome was uncertain (resolved by a read, or reported)."
    );
    describe_gauge!(
        PENDING_RECORDS,
        "Records that need a decision (in_progress past lease, unknown, failed)."
    );
    describe_gauge!(
        PENDING_OLDEST_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest record that needs a decision."
    );
    describe_histogram!(
        STORED_RESPONSE_BYTES,
        metrics::Unit::Bytes,
        "Size of stored responses."
    );
    describe_gauge!(BUILD_INFO, "Build information.");
    describe_gauge!(
        CLOCK_OFFSET,
        metrics::Unit::Seconds,
        "This replica's clock minus the cluster's, measured at each maintenance step."
    );
    describe_counter!(
        TAKEOVERS_REFUSED,
        "Claims of keys whose lease looked expired here, answered IN_PROGRESS (no takeover, no pending answer) because this replica's clock may be more than half of max_clock_skew off the cluster's."
    );
    describe_counter!(
        PROXY_REQUESTS,
        "Requests through idemd proxy by outcome (executed, replayed, in_progress, mismatch, pending, rejected, passthrough, released, upstream_unavailable, upstream_unknown, too_large, unrecorded)."
    );
    describe_histogram!(
        PROXY_UPSTREAM_DURATION,
        "Time idemd proxy waited for its upstream's answer."
    );
    describe_counter!(
        RELOADS,
        "Reloads of watched files by source and result; error keeps the previous version in force."
    );
    describe_counter!(
        LABEL_OVERFLOW,
        "Label values reported as _other because of the cardinality cap."
    );
}

/// Starts the exporter on `address` (inside the current Tokio runtime) and
/// installs the process-wide recorder. A second call in the same process
/// (tests with several servers) keeps the first recorder and serves nothing.
///
/// `/metrics` is served here rather than by the exporter crate's own HTTP
/// listener so that its sockets come from [`crate::net`] like every other
/// listener's (the crate's listener leaves Nagle's algorithm on). Any path
/// renders the metrics and `/health` answers `OK`, as that listener did.
pub fn install_exporter(address: SocketAddr) -> Result<(), String> {
    let listener = std::net::TcpListener::bind(address)
        .and_then(|listener| {
            listener.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(listener)
        })
        .map_err(|e| format!("cannot listen on {address}: {e}"))?;
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(STORED_RESPONSE_BYTES.into()), SIZE_BUCKETS)
        })
        .map_err(|e| e.to_string())?
        .build_recorder();
    let handle = recorder.handle();
    if metrics::set_global_recorder(recorder).is_err() {
        return Ok(());
    }
    let upkeep = handle.clone();
    tokio::spawn(async move {
        // Drains histogram buffers between scrapes, as the crate's own
        // exporter does.
        let mut interval = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            interval.tick().await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(serve_metrics(listener, handle));
    describe();
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(())
}

/// How often the recorder's histogram buffers are drained.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// The content type of the Prometheus text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves HTTP/1.1 scrapes of `handle` on `listener`, forever.
async fn serve_metrics(listener: tokio::net::TcpListener, handle: PrometheusHandle) {
    loop {
        let (stream, peer) = crate::net::accept_retrying(&listener).await;
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
                let handle = handle.clone();
                async move {
                    let (content_type, body) = if request.uri().path() == "/health" {
                        ("text/plain", "OK".to_owned())
                    } else {
                        (TEXT_FORMAT, handle.render())
                    };
                    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
                    response.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static(content_type),
                    );
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, %error, "metrics connection ended with an error");
            }
        });
    }
}

/// Caps the distinct values of the tenant and endpoint labels.
#[derive(Debug)]
pub struct LabelGuard {
    /// Most distinct tenants reported by name.
    max_tenants: usize,
    /// Most distinct endpoints reported by name.
    max_endpoints: usize,
    /// Values admitted so far.
    seen: Mutex<(HashSet<String>, HashSet<String>)>,
}

impl LabelGuard {
    /// A guard admitting up to the given numbers of distinct values.
    pub fn new(max_tenants: usize, max_endpoints: usize) -> Self {
        Self {
            max_tenants,
            max_endpoints,
            seen: Mutex::new((HashSet::new(), HashSet::new())),
        }
    }

    /// The label values to report for `tenant` and `endpoint`.
    pub fn labels(&self, tenant: &str, endpoint: &str) -> (String, String) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (tenants, endpoints) = &mut *seen;
        let tenant = admit(tenants, tenant, self.max_tenants, "tenant");
        let endpoint = admit(endpoints, endpoint, self.max_endpoints, "endpoint");
        (tenant, endpoint)
    }

    /// Tenants admitted so far (those the pending gauges report on).
    pub fn tenants(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.0.iter().cloned().collect()
    }
}

fn admit(seen: &mut HashSet<String>, value: &str, cap: usize, label: &'static str) -> String {
    if seen.contains(value) {
        return value.to_string();
    }
    if seen.len() < cap {
        seen.insert(value.to_string());
        return value.to_string();
    }
    metrics::counter!(LABEL_OVERFLOW, "label" => label).increment(1);
    OVERFLOW_VALUE.to_string()
}

/// The gRPC code name used as the `code` label.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_beyond_the_cap_become_other() {
        let guard = LabelGuard::new(2, 1);
        assert_eq!(guard.labels("a", "x"), ("a".to_string(), "x".to_string()));
        assert_eq!(
            guard.labels("b", "y"),
            ("b".to_string(), OVERFLOW_VALUE.to_string())
        );
        assert_eq!(
            guard.labels("c", "x"),
            (OVERFLOW_VALUE.to_string(), "x".to_string())
        );
        assert_eq!(
            guard.labels("a", "x"),
            ("a".to_string(), "x".to_string()),
            "admitted values stay"
        );
        let mut tenants = guard.tenants();
        tenants.sort();
        assert_eq!(tenants, vec!["a", "b"]);
    }
}
