//! `idemd-bench startup`: how long a restart of the embedded store takes to
//! answer its first Claim as the store grows, warm and with the page cache
//! dropped (a rebooted node, or a pod moved to another node, has none).
//!
//! For each size, in increasing order, the same store is filled up to it
//! (in this process, through the store's own API: completed records shaped
//! like the growth run's pairs, 24 h TTL, many writes in flight so the
//! writer batches them; filling 10^7 records through the gRPC port would
//! take a quarter of an hour per run), then idemd is started on it four
//! times:
//!
//! 1. warm, after a clean stop (the fill's close);
//! 2. after `kill -9` under load (fresh pairs at 64 in flight for 3 s),
//!    page cache dropped;
//! 3. after a clean stop, page cache dropped;
//! 4. warm again, after a clean stop.
//!
//! Each row says whether that start checked the whole file (its log says
//! so); only a start after a lost machine or the first start of a release
//! on an old file should. Dropping the page cache needs root
//! (`/proc/sys/vm/drop_caches`); without it the cold columns are skipped
//! and the report says so.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use idemd::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idemd::store::{Record, RecordKey, RecordState, Store, StoredResponse};
use serde::Serialize;

use crate::load::{self, LoadSpec, Workload};
use crate::servers::{self, Server};
use crate::systems::{Client, Grpc};

/// `idemd-bench startup`.
#[derive(Debug, Args)]
pub struct StartupArgs {
    /// The idemd binary (default: `idemd` next to this binary).
    #[arg(long)]
    pub idemd_bin: Option<PathBuf>,
    /// Store sizes (records) to measure at, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000,10000000")]
    pub sizes: Vec<u64>,
    /// Directory for the store (default: a scratch directory, removed after).
    /// Keeping it lets a later run start from the filled store.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// After the largest size: `idemd backup` of the serving store while
    /// fresh pairs run at 64 in flight, with the latency of those pairs
    /// during the backup against a window without one.
    #[arg(long)]
    pub backup: bool,
}

/// One size's figures (milliseconds to the first answered Claim).
#[derive(Debug, Clone, Serialize)]
struct Row {
    records: u64,
    /// The data directory on disk (database, checksums, log).
    bytes: u64,
    warm_clean_ms: f64,
    cold_after_kill_ms: Option<f64>,
    cold_clean_ms: Option<f64>,
    warm_again_ms: f64,
    /// Starts of this row that checked the whole file, and why.
    full_checks: Vec<String>,
}

/// Writes in flight while filling: the writer batches up to 1,024.
const FILL_IN_FLIGHT: usize = 2048;

/// Runs the measurement; false when a start checked the whole file without
/// a reason to.
pub async fn run(args: StartupArgs) -> Result<bool> {
    let bin = crate::embedded::idemd_bin(args.idemd_bin.as_deref())?;
    let (dir, scratch) = match &args.dir {
        Some(dir) => (dir.clone(), false),
        None => (servers::scratch_dir("startup")?, true),
    };
    let outcome = measure(&args, &bin, &dir).await;
    if scratch {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

async fn measure(args: &StartupArgs, bin: &Path, dir: &Path) -> Result<bool> {
    let data = dir.join("data");
    let can_drop = drop_caches().is_ok();
    if !can_drop {
        eprintln!(
            "idemd-bench startup: cannot write /proc/sys/vm/drop_caches (needs root): cold starts skipped"
        );
    }
    let mut rows = Vec::new();
    let mut filled = count(&data).await?;
    let mut sizes = args.sizes.clone();
    sizes.sort_unstable();
    for size in sizes {
        if size < filled {
            eprintln!("skipping {size} records: the store in --dir already holds {filled}");
            continue;
        }
        if size > filled {
            let started = Instant::now();
            fill(&data, filled, size).await?;
            eprintln!(
                "filled {filled}..{size} records in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            filled = size;
        }
        let log = dir.join(format!("idemd-{size}.log"));
        let mut full_checks = Vec::new();
        let warm_clean_ms = restart(bin, &data, &log, None, &mut full_checks).await?;
        let cold_after_kill_ms = if can_drop {
            Some(
                restart(
                    bin,
                    &data,
                    &log,
                    Some(Stop::KillUnderLoad),
                    &mut full_checks,
                )
                .await?,
            )
        } else {
            None
        };
        let cold_clean_ms = if can_drop {
            Some(restart(bin, &data, &log, Some(Stop::Clean), &mut full_checks).await?)
        } else {
            None
        };
        let warm_again_ms = restart(bin, &data, &log, None, &mut full_checks).await?;
        let row = Row {
            records: size,
            bytes: dir_bytes(&data),
            warm_clean_ms,
            cold_after_kill_ms,
            cold_clean_ms,
            warm_again_ms,
            full_checks,
        };
        eprintln!("{}", line(&row));
        rows.push(row);
    }
    let mut out = String::new();
    writeln!(out, "{}", markdown(&rows, can_drop))?;
    if args.backup {
        writeln!(
            out,
            "{}",
            backup_under_load(bin, &data, &dir.join("idemd-backup.log"), dir).await?
        )?;
    }
    println!("{out}");
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(rows.iter().all(|row| row.full_checks.is_empty()))
}

/// Fresh pairs at 64 in flight for `duration` through `client`.
fn pairs(duration: Duration) -> LoadSpec {
    LoadSpec {
        workload: Workload::Fresh,
        concurrency: 64,
        duration,
        warmup: Duration::ZERO,
        rate: None,
        conflict_group: 1,
        replay_keys: 0,
        check_exclusive: false,
        sample: Vec::new(),
        progress_every: None,
    }
}

/// The latency line of `result`.
fn latency(result: &load::LoadResult) -> String {
    format!(
        "{:.0} pairs/s, p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms, errors {}",
        result.throughput(),
        result.percentile_ms(0.5),
        result.percentile_ms(0.99),
        result.percentile_ms(0.999),
        result.errors
    )
}

/// `idemd backup` of the store in `data` while idemd serves fresh pairs:
/// how long it takes, and the pairs' latency during it against 10 s
/// before it.
async fn backup_under_load(bin: &Path, data: &Path, log: &Path, dir: &Path) -> Result<String> {
    let (mut server, address) = start(bin, data, log).await?;
    crate::embedded::wait_ready(&mut server, address, Instant::now()).await?;
    let client = Arc::new(Client::Grpc(
        Grpc::connect(&format!("http://{address}"), 4).await?,
    ));
    let before = load::run(Arc::clone(&client), &pairs(Duration::from_secs(10))).await?;
    let out = dir.join(format!("backup-{}", crate::ids::run_id()));
    let started = Instant::now();
    let mut backup = tokio::process::Command::new(bin)
        .arg("backup")
        .arg("--data-dir")
        .arg(data)
        .arg("--to")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    // Windows of load until the backup is done, merged.
    let mut during: Option<load::LoadResult> = None;
    let status = loop {
        let window = load::run(Arc::clone(&client), &pairs(Duration::from_secs(2))).await?;
        match &mut during {
            Some(during) => {
                during.ops += window.ops;
                during.errors += window.errors;
                during.elapsed += window.elapsed;
                during.histogram.add(&window.histogram)?;
            }
            None => during = Some(window),
        }
        if let Some(status) = backup.try_wait()? {
            break status;
        }
    };
    let took = started.elapsed();
    let said = match backup.stdout.take() {
        Some(mut stdout) => {
            let mut text = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut text).await?;
            text.trim().to_string()
        }
        None => String::new(),
    };
    server.stop().await?;
    let _ = std::fs::remove_dir_all(&out);
    if !status.success() {
        bail!("idemd backup failed ({status})");
    }
    let during = during.context("no load window")?;
    let line = format!(
        "Backup under load: {:.1} s ({said}).\n\n- fresh pairs at 64 in flight, 10 s before: {}\n- during the backup: {}\n",
        took.as_secs_f64(),
        latency(&before),
        latency(&during)
    );
    eprintln!("{line}");
    Ok(line)
}

/// How the idemd before a cold start was stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// SIGTERM: drained, last checkpoint taken.
    Clean,
    /// SIGKILL while fresh pairs run at 64 in flight.
    KillUnderLoad,
}

/// Starts idemd on `data` (the previous one stopped as `stop` says, then
/// the page cache dropped; `None`: warm, after a clean stop), waits for the
/// first Claim, stops it cleanly: ms to that Claim.
async fn restart(
    bin: &Path,
    data: &Path,
    log: &Path,
    stop: Option<Stop>,
    full_checks: &mut Vec<String>,
) -> Result<f64> {
    if let Some(Stop::KillUnderLoad) = stop {
        let (mut server, address) = start(bin, data, log).await?;
        crate::embedded::wait_ready(&mut server, address, Instant::now()).await?;
        let client = Arc::new(Client::Grpc(
            Grpc::connect(&format!("http://{address}"), 4).await?,
        ));
        let load =
            tokio::spawn(async move { load::run(client, &pairs(Duration::from_secs(10))).await });
        tokio::time::sleep(Duration::from_secs(3)).await;
        server.kill().await?;
        load.abort();
    }
    if stop.is_some() {
        drop_caches()?;
    }
    let before = std::fs::read_to_string(log).unwrap_or_default().len();
    let started = Instant::now();
    let (mut server, address) = start(bin, data, log).await?;
    let ready = crate::embedded::wait_ready(&mut server, address, started).await?;
    server.stop().await?;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    if let Some(check) = text
        .get(before..)
        .unwrap_or_default()
        .lines()
        .find(|l| l.contains("checking the whole database file"))
    {
        full_checks.push(check.to_string());
    }
    Ok(ready.as_secs_f64() * 1000.0)
}

async fn start(bin: &Path, data: &Path, log: &Path) -> Result<(Server, SocketAddr)> {
    let address: SocketAddr = ([127, 0, 0, 1], servers::free_port()?).into();
    let args = [
        "--listen".to_string(),
        address.to_string(),
        "--metrics-listen".to_string(),
        "off".to_string(),
        "--claim-rate".to_string(),
        "0".to_string(),
    ];
    let server = servers::start_idemd_on(bin, data, log, &args, false).await?;
    Ok((server, address))
}

/// Drops the page cache (written back first).
fn drop_caches() -> std::io::Result<()> {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
}

fn store_options(data: &Path) -> EmbeddedOptions {
    let mut options = EmbeddedOptions::new(data);
    // The fill measures nothing: no scrub competing with it.
    options.scrub.rate = 0;
    options
}

/// Records in the store (a kept `--dir` from an earlier run).
async fn count(data: &Path) -> Result<u64> {
    if !data.join(idemd::store::embedded::DATABASE_FILE).exists() {
        return Ok(0);
    }
    let marker = data.join("startup-filled");
    Ok(std::fs::read_to_string(marker)
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

/// Adds records `from..to` to the store in `data`.
async fn fill(data: &Path, from: u64, to: u64) -> Result<()> {
    let options = store_options(data);
    let store =
        Arc::new(tokio::task::spawn_blocking(move || EmbeddedStore::open(&options)).await??);
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let run = crate::ids::run_id();
    crate::embedded::fill(&store, from..to, FILL_IN_FLIGHT, |i| {
        record(&run, i, now_ms)
    })
    .await?;
    store.close().await?;
    std::fs::write(data.join("startup-filled"), to.to_string())?;
    Ok(())
}

/// A completed pair as the growth run leaves them: a 32-byte fingerprint, a
/// small JSON response, 24 h to live.
fn record(run: &str, i: u64, now_ms: i64) -> Record {
    Record {
        id: RecordKey {
            tenant: "default".into(),
            endpoint: "bench".into(),
            key: format!("startup-{run}-{i:012}"),
        },
        state: RecordState::Completed,
        fingerprint: i.to_le_bytes().repeat(4),
        attempt: 1,
        lease_token: format!("{:032x}", u128::from(i) * 0x9e37_79b9_7f4a_7c15),
        attempt_id: String::new(),
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        lease_expires_at_ms: now_ms,
        completed_at_ms: Some(now_ms),
        expires_at_ms: now_ms + 24 * 3600 * 1000,
        response: Some(StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: format!("{{\"order\":{i},\"status\":\"paid\"}}").into_bytes(),
            body_ref: String::new(),
        }),
        reason: String::new(),
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "skipped".to_string(), |v| format!("{v:.0}"))
}

fn line(row: &Row) -> String {
    format!(
        "{:>10} records {:>8.1} MiB  warm {:>6.0} ms  cold after kill -9 {:>7} ms  cold after stop {:>7} ms  warm again {:>6.0} ms  full checks {}",
        row.records,
        row.bytes as f64 / 1048576.0,
        row.warm_clean_ms,
        ms(row.cold_after_kill_ms),
        ms(row.cold_clean_ms),
        row.warm_again_ms,
        row.full_checks.len()
    )
}

fn markdown(rows: &[Row], cold: bool) -> String {
    let mut out = String::from(
        "| records | on disk (MiB) | warm, after a clean stop (ms) | cold, after kill -9 under load (ms) | cold, after a clean stop (ms) | warm again (ms) | whole-file checks |\n|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {} | {} | {:.0} | {} |",
            row.records,
            row.bytes as f64 / 1048576.0,
            row.warm_clean_ms,
            ms(row.cold_after_kill_ms),
            ms(row.cold_clean_ms),
            row.warm_again_ms,
            row.full_checks.len()
        );
    }
    if !cold {
        out.push_str("\nCold starts skipped: dropping the page cache needs root.\n");
    }
    out
}
