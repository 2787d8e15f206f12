//! A small closed-loop load generator: `connections` gRPC connections with
//! `concurrency` callers in total, each running Claim + Complete on fresh keys
//! (one "pair" per logical operation) for `duration`, then printing
//! throughput and pair-latency percentiles. A quick measurement tool; the
//! benchmark suite proper lives elsewhere.
//!
//! ```text
//! cargo run --release --example loadgen -- \
//!     [--target http://127.0.0.1:50051] [--connections 4] [--concurrency 64] \
//!     [--duration 10s] [--warmup 2s] [--tenant load]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use tonic::transport::Channel;

struct Options {
    target: String,
    connections: usize,
    concurrency: usize,
    duration: Duration,
    warmup: Duration,
    tenant: String,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        target: "http://127.0.0.1:50051".into(),
        connections: 4,
        concurrency: 64,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        tenant: "load".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--target" => options.target = value,
            "--connections" => {
                options.connections = value.parse().map_err(|e| format!("{flag}: {e}"))?
            }
            "--concurrency" => {
                options.concurrency = value.parse().map_err(|e| format!("{flag}: {e}"))?
            }
            "--duration" => {
                options.duration =
                    humantime::parse_duration(&value).map_err(|e| format!("{flag}: {e}"))?
            }
            "--warmup" => {
                options.warmup =
                    humantime::parse_duration(&value).map_err(|e| format!("{flag}: {e}"))?
            }
            "--tenant" => options.tenant = value,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if options.connections == 0 || options.concurrency == 0 {
        return Err("--connections and --concurrency must be positive".into());
    }
    Ok(options)
}

fn with_tenant<T>(tenant: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = tenant.parse() {
        request.metadata_mut().insert("x-tenant-id", value);
    }
    request
}

async fn pair(
    client: &mut IdempotencyClient<Channel>,
    tenant: &str,
    key: String,
) -> Result<(), tonic::Status> {
    let claim = pb::ClaimRequest {
        endpoint: "POST /v1/payments".into(),
        key: key.clone(),
        fingerprint: Some(pb::claim_request::Fingerprint::Sha256(vec![7; 32])),
        ..Default::default()
    };
    let response = client.claim(with_tenant(tenant, claim)).await?.into_inner();
    let Some(pb::claim_response::Outcome::Claimed(lease)) = response.outcome else {
        return Err(tonic::Status::internal("fresh key was not claimed"));
    };
    let complete = pb::CompleteRequest {
        endpoint: "POST /v1/payments".into(),
        key,
        lease_token: lease.lease_token,
        response: Some(pb::StoredResponse {
            status: 201,
            headers: vec![pb::Header {
                name: "Content-Type".into(),
                value: "application/json".into(),
            }],
            body: br#"{"id":"pay_123","status":"succeeded","amount":4200}"#.to_vec(),
            body_ref: String::new(),
        }),
    };
    client.complete(with_tenant(tenant, complete)).await?;
    Ok(())
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[index]) / 1000.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = parse_args()?;
    let mut channels = Vec::new();
    for _ in 0..options.connections {
        channels.push(
            Channel::from_shared(options.target.clone())?
                .connect()
                .await?,
        );
    }
    let run_id = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
    );
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..options.concurrency {
        let mut client = IdempotencyClient::new(channels[worker % channels.len()].clone());
        let (measuring, stop, errors) = (
            Arc::clone(&measuring),
            Arc::clone(&stop),
            Arc::clone(&errors),
        );
        let tenant = options.tenant.clone();
        let run_id = run_id.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies_us: Vec<u32> = Vec::new();
            let mut sequence = 0u64;
            while !stop.load(Ordering::Relaxed) {
                sequence += 1;
                let key = format!("{run_id}-{worker}-{sequence}");
                let started = Instant::now();
                let result = pair(&mut client, &tenant, key).await;
                if measuring.load(Ordering::Relaxed) {
                    match result {
                        Ok(()) => latencies_us
                            .push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX)),
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            latencies_us
        }));
    }
    tokio::time::sleep(options.warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(options.duration).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.await?);
    }
    latencies.sort_unstable();
    println!(
        "pairs: {}  errors: {}  throughput: {:.0} pairs/s  latency ms p50 {:.2} p90 {:.2} p99 {:.2} p99.9 {:.2}  ({} connections x {} callers, {:?})",
        latencies.len(),
        errors.load(Ordering::Relaxed),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.90),
        percentile(&latencies, 0.99),
        percentile(&latencies, 0.999),
        options.connections,
        options.concurrency,
        options.duration,
    );
    Ok(())
}
