//! `idemd-bench cql-scale`: one busy tenant's day on the CQL store, as a
//! user would drive it (docs/scylla.md, "The pending index").
//!
//! Against a running Cassandra (or ScyllaDB) and a real idemd process: `N`
//! Claim+Complete pairs of ONE tenant at `inflight`, then one claim left to
//! go stale, then:
//!
//! * ListPending, one call in flight, `--list-calls` times: every call must
//!   return the stale claim, and its p99 must stay under `--list-p99-max`;
//! * the pending gauges must show the stale claim with no "refreshing
//!   pending gauges failed" or "store maintenance failed" in idemd's log;
//! * no partition of `pending_buckets` may receive more rows than the
//!   written bound. The rows a partition received are counted here, from
//!   the claims' own lease expiries and the layout docs/scylla.md documents
//!   (bucket = due / 20 s, shard = FNV-1a(endpoint \0 key) mod 8), written
//!   out again in this file rather than imported, so a layout change that
//!   the docs do not follow fails here;
//! * the engine's own statistics (Cassandra's `system_views.
//!   tombstones_per_read`): the most tombstones any read of the index
//!   walked.
//!
//! Prints the figures; `--json` writes them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::Histogram;
use idemd::proto::v1 as pb;
use pb::idempotency_client::IdempotencyClient;
use serde::Serialize;
use tokio::process::Command;
use tonic::transport::Channel;

use crate::servers::{free_port, migrate_cql, scratch_dir};

/// The documented layout (docs/scylla.md): bucket width and shards.
const BUCKET_MS: i64 = 20_000;
const SHARDS: u64 = 8;

/// The documented bound (docs/scylla.md): a partition receives at most
/// `claims/s × 20 s / 8` rows on average; the hash's spread over 8 shards
/// and the bucket edges are allowed 50% and 50 rows on top.
fn bound(rows_in_busiest_bucket: u64) -> u64 {
    rows_in_busiest_bucket.div_ceil(SHARDS) * 3 / 2 + 50
}

const TENANT: &str = "busy";
const ENDPOINT: &str = "POST /v1/payments";

/// Flags of `cql-scale`.
#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    /// The idemd binary.
    #[arg(long, default_value = "target/release/idemd")]
    pub idemd_bin: PathBuf,
    /// CQL contact points.
    #[arg(long, env = "IDEMD_TEST_CQL_NODES", default_value = "127.0.0.1:9042")]
    pub cql_nodes: String,
    /// Completed Claim+Complete pairs of the one tenant.
    #[arg(long, default_value_t = 250_000)]
    pub pairs: u64,
    /// Requests in flight while filling.
    #[arg(long, default_value_t = 64)]
    pub inflight: usize,
    /// Lease of every claim (short leases put the tombstones of completed
    /// claims right where readers look next).
    #[arg(long, default_value = "2s")]
    pub lease: humantime::Duration,
    /// ListPending calls (one in flight) after the fill.
    #[arg(long, default_value_t = 200)]
    pub list_calls: usize,
    /// Fail when ListPending's p99 exceeds this.
    #[arg(long, default_value = "100ms")]
    pub list_p99_max: humantime::Duration,
    /// Write the figures here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What the check measured.
#[derive(Debug, Serialize)]
struct Figures {
    pairs: u64,
    errors: u64,
    fill_seconds: f64,
    pairs_per_second: f64,
    busiest_bucket_claims: u64,
    max_rows_per_partition: u64,
    partition_bound: u64,
    partitions_written: usize,
    list_pending_p50_ms: f64,
    list_pending_p99_ms: f64,
    list_pending_max_ms: f64,
    list_pending_found_every_time: bool,
    gauge_refresh_seconds: f64,
    gauge_refreshes: u64,
    gauge_errors_in_log: usize,
    maintenance_errors_in_log: usize,
    tombstones_per_read_max: Option<f64>,
    tombstones_per_read_p99: Option<f64>,
}

fn shard_of(endpoint: &str, key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in endpoint.bytes().chain([0]).chain(key.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash % SHARDS
}

fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "x-tenant-id",
        tonic::metadata::MetadataValue::from_static(TENANT),
    );
    request
}

fn claim_request(key: &str, lease: Duration) -> pb::ClaimRequest {
    pb::ClaimRequest {
        endpoint: ENDPOINT.into(),
        key: key.into(),
        fingerprint: Some(pb::claim_request::Fingerprint::Sha256(vec![7; 32])),
        lease: Some(prost_types::Duration {
            seconds: i64::try_from(lease.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(lease.subsec_nanos()).unwrap_or(0),
        }),
        ..Default::default()
    }
}

fn millis(timestamp: Option<&prost_types::Timestamp>) -> Option<i64> {
    timestamp.map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
}

/// One pair; returns the claim's due instant (lease expiry).
async fn pair(client: &mut IdempotencyClient<Channel>, key: &str, lease: Duration) -> Result<i64> {
    let response = client
        .claim(request(claim_request(key, lease)))
        .await?
        .into_inner();
    let Some(pb::claim_response::Outcome::Claimed(claimed)) = response.outcome else {
        bail!("{key}: not claimed: {:?}", response.outcome);
    };
    let due =
        millis(claimed.lease_expires_at.as_ref()).ok_or_else(|| anyhow!("no lease expiry"))?;
    client
        .complete(request(pb::CompleteRequest {
            endpoint: ENDPOINT.into(),
            key: key.into(),
            lease_token: claimed.lease_token,
            response: Some(pb::StoredResponse {
                status: 201,
                body: br#"{"id":"pay_1","status":"succeeded"}"#.to_vec(),
                ..Default::default()
            }),
        }))
        .await?;
    Ok(due)
}

/// The value of one sample of `name` with every label in `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter(|line| {
            line[name.len()..].starts_with(['{', ' ']) && labels.iter().all(|l| line.contains(l))
        })
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

async fn scrape(address: SocketAddr) -> Result<String> {
    let output = Command::new("curl")
        .args(["-sf", &format!("http://{address}/metrics")])
        .output()
        .await
        .context("curl")?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Cassandra's statistics of the most tombstones one read walked on the
/// pending tables (`None` on ScyllaDB, which has no such view).
async fn tombstones_per_read(nodes: &[String]) -> Option<(f64, f64)> {
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_nodes(nodes)
        .build()
        .await
        .ok()?;
    let result = session
        .query_unpaged(
            "SELECT table_name, max, p99th FROM system_views.tombstones_per_read \
             WHERE keyspace_name = 'idemd' ALLOW FILTERING",
            (),
        )
        .await
        .ok()?;
    let rows = result.into_rows_result().ok()?;
    let mut worst: Option<(f64, f64)> = None;
    for row in rows.rows::<(String, f64, f64)>().ok()? {
        let (table, max, p99) = row.ok()?;
        if table.starts_with("pending_") {
            worst = Some(worst.map_or((max, p99), |(m, p)| (m.max(max), p.max(p99))));
        }
    }
    worst
}

/// Runs the check; `Ok(false)` when a bound failed.
pub async fn run(args: ScaleArgs) -> Result<bool> {
    let nodes: Vec<String> = args.cql_nodes.split(',').map(str::to_string).collect();
    migrate_cql(&args.idemd_bin, &nodes).await?;
    let dir = scratch_dir("idemd-scale")?;
    let port = free_port()?;
    let metrics_port = free_port()?;
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let metrics: SocketAddr = ([127, 0, 0, 1], metrics_port).into();
    let log_path = dir.join("idemd.log");
    let mut server = Command::new(&args.idemd_bin)
        .args(["--store", "cql", "--cql-nodes", &args.cql_nodes])
        .arg("--listen")
        .arg(address.to_string())
        .arg("--metrics-listen")
        .arg(metrics.to_string())
        .arg("--data-dir")
        .arg(dir.join("data"))
        // Claims are the point here, not the per-tenant ceiling.
        .args(["--claim-rate", "0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", args.idemd_bin.display()))?;
    let url = format!("http://{address}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let channel = loop {
        match Channel::from_shared(url.clone())?.connect().await {
            Ok(channel) => break channel,
            Err(_) if Instant::now() < deadline => {
                if let Some(status) = server.try_wait()? {
                    bail!(
                        "idemd exited during start-up ({status}); log: {}",
                        log_path.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => bail!("idemd did not answer in 60 s: {error}"),
        }
    };
    // Connected is not serving: wait until the store is open (a call that
    // needs it succeeds).
    let mut probe = IdempotencyClient::new(channel.clone());
    loop {
        match probe
            .list_pending(request(pb::ListPendingRequest::default()))
            .await
        {
            Ok(_) => break,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => bail!("idemd never served: {status}"),
        }
    }
    let result = check(&args, &nodes, channel, metrics, &log_path).await;
    let _ = server.start_kill();
    let _ = server.wait().await;
    let (figures, passed) = result?;
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&figures)?)?;
    }
    Ok(passed)
}

async fn check(
    args: &ScaleArgs,
    nodes: &[String],
    channel: Channel,
    metrics: SocketAddr,
    log_path: &std::path::Path,
) -> Result<(Figures, bool)> {
    let lease: Duration = args.lease.into();
    // A run's keys are its own, so the check can be repeated on one cluster.
    let run_id = std::process::id();
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let per_partition: Arc<Mutex<HashMap<(i64, u64), u64>>> = Arc::default();
    let per_bucket: Arc<Mutex<HashMap<i64, u64>>> = Arc::default();
    let started = Instant::now();
    println!(
        "cql-scale: {} pairs of tenant '{TENANT}' at {} in flight, {} leases",
        args.pairs, args.inflight, args.lease
    );
    let progress = {
        let next = Arc::clone(&next);
        let total = args.pairs;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_secs(10));
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let done = next.load(Ordering::Relaxed).min(total);
                let elapsed = started.elapsed().as_secs_f64();
                println!(
                    "cql-scale: {done}/{total} pairs, {:.0}/s, {elapsed:.0} s",
                    done as f64 / elapsed
                );
            }
        })
    };
    let mut workers = Vec::new();
    for _ in 0..args.inflight {
        let mut client = IdempotencyClient::new(channel.clone());
        let (next, errors) = (Arc::clone(&next), Arc::clone(&errors));
        let (per_partition, per_bucket) = (Arc::clone(&per_partition), Arc::clone(&per_bucket));
        let total = args.pairs;
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return;
                }
                let key = format!("scale-{run_id}-{i}");
                match pair(&mut client, &key, lease).await {
                    Ok(due) => {
                        let bucket = due.div_euclid(BUCKET_MS);
                        if let Ok(mut map) = per_partition.lock() {
                            *map.entry((bucket, shard_of(ENDPOINT, &key))).or_default() += 1;
                        }
                        if let Ok(mut map) = per_bucket.lock() {
                            *map.entry(bucket).or_default() += 1;
                        }
                    }
                    Err(error) => {
                        if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                            eprintln!("cql-scale: pair failed: {error:#}");
                        }
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker.await?;
    }
    progress.abort();
    let fill_seconds = started.elapsed().as_secs_f64();
    let errors = errors.load(Ordering::Relaxed);
    let pairs_per_second = args.pairs as f64 / fill_seconds;
    println!(
        "cql-scale: filled in {fill_seconds:.1} s ({pairs_per_second:.0} pairs/s), {errors} errors"
    );

    // One claim left to go stale.
    let mut client = IdempotencyClient::new(channel);
    let stale_key = format!("stale-{run_id}");
    let stale_lease = Duration::from_secs(1);
    client
        .claim(request(claim_request(&stale_key, stale_lease)))
        .await
        .context("stale claim")?;
    tokio::time::sleep(stale_lease + Duration::from_millis(200)).await;

    let mut histogram = Histogram::<u64>::new(3)?;
    let mut found_every_time = true;
    for _ in 0..args.list_calls {
        let sent = Instant::now();
        let page = client
            .list_pending(request(pb::ListPendingRequest::default()))
            .await
            .context("ListPending")?
            .into_inner();
        histogram.record(u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX))?;
        found_every_time &= page.records.iter().any(|r| r.key == stale_key);
    }
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "cql-scale: ListPending (1 in flight, {} calls): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; found the stale claim every time: {found_every_time}",
        args.list_calls,
        ms(0.5),
        ms(0.99),
        histogram.max() as f64 / 1000.0
    );

    // The gauges: wait for a refresh that shows the stale claim.
    let gauge_deadline = Instant::now() + Duration::from_secs(60);
    let stale_seen = loop {
        let text = scrape(metrics).await?;
        let value = metric(
            &text,
            "idemd_pending_records",
            &[&format!("tenant=\"{TENANT}\""), "state=\"in_progress\""],
        );
        if value.is_some_and(|v| v >= 1.0) || Instant::now() > gauge_deadline {
            break value.is_some_and(|v| v >= 1.0);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let text = scrape(metrics).await?;
    let summary = ["operation=\"pending_summary\""];
    let refreshes = metric(
        &text,
        "idemd_store_operation_duration_seconds_count",
        &summary,
    )
    .unwrap_or(0.0);
    let refresh_sum = metric(
        &text,
        "idemd_store_operation_duration_seconds_sum",
        &summary,
    )
    .unwrap_or(0.0);
    let log = std::fs::read_to_string(log_path).unwrap_or_default();
    let gauge_errors = log.matches("refreshing pending gauges failed").count();
    let maintenance_errors = log.matches("store maintenance failed").count();
    println!(
        "cql-scale: gauges show the stale claim: {stale_seen}; {refreshes} refreshes, mean {:.2} ms; gauge errors in the log: {gauge_errors}; maintenance errors: {maintenance_errors}",
        if refreshes > 0.0 {
            refresh_sum / refreshes * 1000.0
        } else {
            0.0
        }
    );

    let per_partition = per_partition
        .lock()
        .map_err(|_| anyhow!("poisoned"))?
        .clone();
    let busiest_bucket = per_bucket
        .lock()
        .map_err(|_| anyhow!("poisoned"))?
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    let max_rows = per_partition.values().copied().max().unwrap_or(0);
    let partition_bound = bound(busiest_bucket);
    println!(
        "cql-scale: {} bucket partitions written; busiest bucket {busiest_bucket} claims; most rows one partition received {max_rows} (bound {partition_bound})",
        per_partition.len()
    );
    let tombstones = tombstones_per_read(nodes).await;
    match tombstones {
        Some((max, p99)) => println!(
            "cql-scale: tombstones walked per read of the pending tables (Cassandra's statistics): max {max:.0}, p99 {p99:.0}"
        ),
        None => println!("cql-scale: no tombstone statistics (system_views.tombstones_per_read)"),
    }

    let p99_max = Duration::from(args.list_p99_max).as_secs_f64() * 1000.0;
    let mut failures = Vec::new();
    if errors > 0 {
        failures.push(format!("{errors} pairs failed"));
    }
    if !found_every_time {
        failures.push("ListPending missed the stale claim".to_string());
    }
    if ms(0.99) > p99_max {
        failures.push(format!("ListPending p99 {:.1} ms > {p99_max} ms", ms(0.99)));
    }
    if !stale_seen {
        failures.push("the gauges never showed the stale claim".to_string());
    }
    if gauge_errors + maintenance_errors > 0 {
        failures.push("gauge or maintenance errors in idemd's log".to_string());
    }
    if max_rows > partition_bound {
        failures.push(format!(
            "a partition received {max_rows} rows, over the bound {partition_bound}"
        ));
    }
    for failure in &failures {
        eprintln!("cql-scale: FAILED: {failure}");
    }
    if failures.is_empty() {
        println!("cql-scale: passed");
    }
    let figures = Figures {
        pairs: args.pairs,
        errors,
        fill_seconds,
        pairs_per_second,
        busiest_bucket_claims: busiest_bucket,
        max_rows_per_partition: max_rows,
        partition_bound,
        partitions_written: per_partition.len(),
        list_pending_p50_ms: ms(0.5),
        list_pending_p99_ms: ms(0.99),
        list_pending_max_ms: histogram.max() as f64 / 1000.0,
        list_pending_found_every_time: found_every_time,
        gauge_refresh_seconds: if refreshes > 0.0 {
            refresh_sum / refreshes
        } else {
            0.0
        },
        gauge_refreshes: refreshes as u64,
        gauge_errors_in_log: gauge_errors,
        maintenance_errors_in_log: maintenance_errors,
        tombstones_per_read_max: tombstones.map(|t| t.0),
        tombstones_per_read_p99: tombstones.map(|t| t.1),
    };
    Ok((figures, failures.is_empty()))
}
