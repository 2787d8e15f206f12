//! The load generator: `concurrency` workers over one [`Client`], closed
//! loop (each worker sends its next operation when the previous one
//! answered) or open loop at a fixed total rate, recording every operation's
//! latency in an HDR histogram.
//!
//! Workloads (one "operation" each):
//!
//! * `fresh`: Claim + Complete on a unique key (a pair).
//! * `replay`: one Claim on a key completed during set-up.
//! * `conflict`: `group` consecutive operations race for the same key; a
//!   winner completes it. Every key's winners are counted while the load
//!   runs: more than one winner for a key is a violation.
//! * `mixed`: 90% fresh, 8% replay, 2% duplicate in flight (a Claim of a key
//!   another worker has claimed and not necessarily completed yet; winning
//!   it is a violation).
//!
//! Open loop: worker `i` of `n` sends its `k`-th operation at
//! `t0 + (k·n + i) / rate`; latency is counted from that intended instant
//! when the worker is behind schedule (no coordinated omission), and from
//! the actual send when it woke within timer slack of it (so the ~1 ms
//! timer granularity is not counted as server latency).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::ids::run_id;
use crate::sampling::{Sampler, Usage, clock_ticks, read_tree};
use crate::systems::{ClaimOutcome, Client};

/// Which workload to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Claim + Complete on unique keys (pairs/s).
    Fresh,
    /// Claims on completed keys.
    Replay,
    /// Many workers racing for few keys; exactly one winner per key.
    Conflict,
    /// 90% fresh, 8% replay, 2% duplicate in flight.
    Mixed,
}

impl Workload {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Fresh => "fresh",
            Workload::Replay => "replay",
            Workload::Conflict => "conflict",
            Workload::Mixed => "mixed",
        }
    }

    /// What one operation is, for the report's unit.
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Fresh => "pairs/s",
            Workload::Replay | Workload::Conflict => "claims/s",
            Workload::Mixed => "ops/s",
        }
    }

    /// Whether the workload needs completed keys to replay.
    fn needs_replay_keys(self) -> bool {
        matches!(self, Workload::Replay | Workload::Mixed)
    }
}

/// How to drive one measurement.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The workload.
    pub workload: Workload,
    /// Operations in flight (closed loop) or workers (open loop).
    pub concurrency: usize,
    /// Measured window.
    pub duration: Duration,
    /// Unmeasured load before the window.
    pub warmup: Duration,
    /// Total operations per second (open loop); `None` for closed loop.
    pub rate: Option<f64>,
    /// Workers racing for one key in `conflict`.
    pub conflict_group: usize,
    /// Completed keys prepared for `replay` and `mixed`.
    pub replay_keys: usize,
    /// Whether the system enforces one winner per key (the no-op does not:
    /// its winners are not checked).
    pub check_exclusive: bool,
    /// Processes sampled (RSS, CPU) during the window: `(role, pid)`.
    pub sample: Vec<(String, u32)>,
    /// Print and keep a progress point this often during the window (soak).
    pub progress_every: Option<Duration>,
}

/// One progress point of a long window.
#[derive(Debug, Clone, Serialize)]
pub struct ProgressPoint {
    /// Seconds since the window started.
    pub at_s: f64,
    /// Successful operations per second since the previous point.
    pub throughput: f64,
    /// Errors so far (whole run).
    pub errors: u64,
    /// RSS of the sampled `server` process tree now, MiB.
    pub server_rss_mib: f64,
}

/// What one measurement produced.
#[derive(Debug, Clone)]
pub struct LoadResult {
    /// Operations that succeeded inside the window.
    pub ops: u64,
    /// Operations that failed inside the window.
    pub errors: u64,
    /// Failed operations during warm-up, set-up and wind-down.
    pub errors_outside_window: u64,
    /// The first error seen, for the report.
    pub first_error: Option<String>,
    /// Length of the window.
    pub elapsed: Duration,
    /// Latency of successful operations in the window, in microseconds.
    pub histogram: Histogram<u64>,
    /// Keys with more than one winner (conflict, mixed duplicates).
    pub violations: u64,
    /// Keys contended in `conflict` (winners checked).
    pub contended_keys: u64,
    /// Claims that lost a race (busy or replayed) in `conflict`/`mixed`.
    pub losers: u64,
    /// RSS and CPU of the sampled processes over the window, by role.
    pub usage: Vec<(String, Usage)>,
    /// Progress points (when `progress_every` was set).
    pub progress: Vec<ProgressPoint>,
}

impl LoadResult {
    /// Successful operations per second in the window.
    pub fn throughput(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Latency percentile in milliseconds.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        self.histogram.value_at_quantile(p) as f64 / 1000.0
    }
}

/// State shared by the workers of one measurement.
struct Shared {
    run_id: String,
    measuring: AtomicBool,
    stop: AtomicBool,
    /// Next operation index of `conflict` (decides the key).
    conflict_sequence: AtomicU64,
    /// Winners per conflict key.
    winners: Mutex<HashMap<u64, u32>>,
    /// Keys claimed by `mixed` fresh operations, for duplicates in flight.
    in_flight: Mutex<VecDeque<String>>,
    violations: AtomicU64,
    /// Successful operations in the window, for progress points.
    ops_done: AtomicU64,
    /// Failed operations anywhere, for progress points.
    errors_done: AtomicU64,
    first_error: Mutex<Option<String>>,
}

/// Per-worker tallies, merged at the end.
struct Tally {
    histogram: Histogram<u64>,
    ops: u64,
    errors: u64,
    errors_outside: u64,
    losers: u64,
}

fn new_histogram() -> Result<Histogram<u64>> {
    // 1 µs .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000, 3).map_err(|e| anyhow!("histogram: {e}"))
}

/// Key of the `i`-th completed key prepared for replays (the no-op server
/// recognises the `r-` prefix).
fn replay_key(run_id: &str, i: usize) -> String {
    format!("r-{run_id}-{i}")
}

/// Completes `count` keys so that `replay` and `mixed` have something to
/// replay.
async fn prepare_replay_keys(client: &Arc<Client>, run_id: &str, count: usize) -> Result<()> {
    let workers = 32usize;
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let client = Arc::clone(client);
        let run_id = run_id.to_string();
        tasks.push(tokio::spawn(async move {
            let mut i = worker;
            while i < count {
                let key = replay_key(&run_id, i);
                match client.claim(&key, worker).await? {
                    ClaimOutcome::Won(token) => client.complete(&key, &token, worker).await?,
                    // The no-op server answers `replayed` for these keys.
                    ClaimOutcome::Replayed => {}
                    ClaimOutcome::Busy => bail!("replay key {key} busy during set-up"),
                }
                i += workers;
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Runs one measurement.
pub async fn run(client: Arc<Client>, spec: &LoadSpec) -> Result<LoadResult> {
    let shared = Arc::new(Shared {
        run_id: run_id(),
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        conflict_sequence: AtomicU64::new(0),
        winners: Mutex::new(HashMap::new()),
        in_flight: Mutex::new(VecDeque::new()),
        violations: AtomicU64::new(0),
        ops_done: AtomicU64::new(0),
        errors_done: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });
    if spec.workload.needs_replay_keys() {
        prepare_replay_keys(&client, &shared.run_id, spec.replay_keys).await?;
    }
    let concurrency = spec.concurrency.max(1);
    let started = Instant::now();
    let mut workers = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let client = Arc::clone(&client);
        let shared = Arc::clone(&shared);
        let spec = spec.clone();
        workers.push(tokio::spawn(async move {
            worker_loop(worker, concurrency, started, &client, &shared, &spec).await
        }));
    }
    tokio::time::sleep(spec.warmup).await;
    shared.measuring.store(true, Ordering::SeqCst);
    let window_start = Instant::now();
    let samplers: Vec<(String, Sampler)> = spec
        .sample
        .iter()
        .map(|(role, pid)| (role.clone(), Sampler::start(*pid)))
        .collect();
    let progress = watch_window(spec, &shared, window_start).await;
    shared.measuring.store(false, Ordering::SeqCst);
    let elapsed = window_start.elapsed();
    let ticks = clock_ticks();
    let mut usage = Vec::new();
    for (role, sampler) in samplers {
        usage.push((role, sampler.finish(ticks).await));
    }
    shared.stop.store(true, Ordering::SeqCst);

    let mut histogram = new_histogram()?;
    let (mut ops, mut errors, mut errors_outside, mut losers) = (0, 0, 0, 0);
    for worker in workers {
        let tally = worker.await??;
        histogram
            .add(&tally.histogram)
            .map_err(|e| anyhow!("merging histograms: {e}"))?;
        ops += tally.ops;
        errors += tally.errors;
        errors_outside += tally.errors_outside;
        losers += tally.losers;
    }
    let winners = shared
        .winners
        .lock()
        .map_err(|_| anyhow!("winners lock poisoned"))?;
    let contended_keys = winners.len() as u64;
    let conflict_violations = winners.values().filter(|&&w| w > 1).count() as u64;
    let first_error = shared
        .first_error
        .lock()
        .map_err(|_| anyhow!("error lock poisoned"))?
        .clone();
    Ok(LoadResult {
        ops,
        errors,
        errors_outside_window: errors_outside,
        first_error,
        elapsed,
        histogram,
        violations: shared.violations.load(Ordering::SeqCst) + conflict_violations,
        contended_keys,
        losers,
        usage,
        progress,
    })
}

/// Waits out the window; with `progress_every`, prints and keeps a point
/// (throughput, errors, server RSS) at each step.
async fn watch_window(
    spec: &LoadSpec,
    shared: &Shared,
    window_start: Instant,
) -> Vec<ProgressPoint> {
    let mut points = Vec::new();
    let Some(every) = spec.progress_every else {
        tokio::time::sleep(spec.duration).await;
        return points;
    };
    let end = window_start + spec.duration;
    let (mut last_ops, mut last_at) = (0u64, window_start);
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        tokio::time::sleep(every.min(end - now)).await;
        let now = Instant::now();
        let ops = shared.ops_done.load(Ordering::Relaxed);
        let rss: u64 = spec
            .sample
            .iter()
            .filter(|(role, _)| role == "server")
            .map(|(_, pid)| read_tree(*pid).rss_bytes)
            .sum();
        let point = ProgressPoint {
            at_s: (now - window_start).as_secs_f64(),
            throughput: (ops - last_ops) as f64 / (now - last_at).as_secs_f64().max(1e-9),
            errors: shared.errors_done.load(Ordering::Relaxed),
            server_rss_mib: rss as f64 / (1024.0 * 1024.0),
        };
        eprintln!(
            "  t={:>6.0}s  {:>9.0} ops/s  errors {}  server RSS {:.1} MiB",
            point.at_s, point.throughput, point.errors, point.server_rss_mib
        );
        points.push(point);
        (last_ops, last_at) = (ops, now);
    }
    points
}

/// Timer slack tolerated in open loop before latency counts from the
/// intended send instant.
const TIMER_SLACK: Duration = Duration::from_millis(2);

async fn worker_loop(
    worker: usize,
    workers: usize,
    started: Instant,
    client: &Client,
    shared: &Shared,
    spec: &LoadSpec,
) -> Result<Tally> {
    let mut tally = Tally {
        histogram: new_histogram()?,
        ops: 0,
        errors: 0,
        errors_outside: 0,
        losers: 0,
    };
    // StdRng, not the thread-local one: the worker future moves between
    // runtime threads.
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random::<u64>() ^ worker as u64);
    let mut sequence: u64 = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        let begin = match spec.rate {
            None => Instant::now(),
            Some(rate) => {
                let slot = sequence as f64 * workers as f64 + worker as f64;
                let intended = started + Duration::from_secs_f64(slot / rate);
                tokio::time::sleep_until(intended.into()).await;
                let now = Instant::now();
                if now.saturating_duration_since(intended) > TIMER_SLACK {
                    intended
                } else {
                    now
                }
            }
        };
        sequence += 1;
        let outcome = one_operation(worker, sequence, client, shared, spec, &mut rng).await;
        let in_window = shared.measuring.load(Ordering::Relaxed);
        match outcome {
            Ok(lost) => {
                if lost {
                    tally.losers += 1;
                }
                if in_window {
                    tally.ops += 1;
                    shared.ops_done.fetch_add(1, Ordering::Relaxed);
                    let micros = u64::try_from(begin.elapsed().as_micros()).unwrap_or(u64::MAX);
                    tally.histogram.saturating_record(micros.max(1));
                }
            }
            Err(error) => {
                shared.errors_done.fetch_add(1, Ordering::Relaxed);
                if in_window {
                    tally.errors += 1;
                } else {
                    tally.errors_outside += 1;
                }
                if let Ok(mut first) = shared.first_error.lock()
                    && first.is_none()
                {
                    *first = Some(format!("{error:#}"));
                }
                // A dead server fails fast: do not spin a core on it.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    Ok(tally)
}

/// One operation of the workload; `Ok(true)` when a claim lost a race.
async fn one_operation(
    worker: usize,
    sequence: u64,
    client: &Client,
    shared: &Shared,
    spec: &LoadSpec,
    rng: &mut impl Rng,
) -> Result<bool> {
    match spec.workload {
        Workload::Fresh => fresh(worker, sequence, client, shared, false).await,
        Workload::Replay => replay(worker, client, shared, spec, rng).await,
        Workload::Conflict => conflict(worker, client, shared, spec).await,
        Workload::Mixed => {
            let roll = rng.random_range(0..100u32);
            if roll < 90 {
                fresh(worker, sequence, client, shared, true).await
            } else if roll < 98 {
                replay(worker, client, shared, spec, rng).await
            } else {
                duplicate(worker, sequence, client, shared, spec).await
            }
        }
    }
}

async fn fresh(
    worker: usize,
    sequence: u64,
    client: &Client,
    shared: &Shared,
    publish: bool,
) -> Result<bool> {
    let key = format!("f-{}-{worker}-{sequence}", shared.run_id);
    let ClaimOutcome::Won(token) = client.claim(&key, worker).await? else {
        bail!("fresh key {key} was not claimed");
    };
    if publish && let Ok(mut keys) = shared.in_flight.lock() {
        // Offered to duplicates while this caller still holds it.
        keys.push_back(key.clone());
        if keys.len() > 64 {
            keys.pop_front();
        }
    }
    client.complete(&key, &token, worker).await?;
    Ok(false)
}

async fn replay(
    worker: usize,
    client: &Client,
    shared: &Shared,
    spec: &LoadSpec,
    rng: &mut impl Rng,
) -> Result<bool> {
    let key = replay_key(&shared.run_id, rng.random_range(0..spec.replay_keys.max(1)));
    match client.claim(&key, worker).await? {
        ClaimOutcome::Replayed => Ok(false),
        other => bail!("completed key {key} answered {other:?} instead of a replay"),
    }
}

async fn conflict(
    worker: usize,
    client: &Client,
    shared: &Shared,
    spec: &LoadSpec,
) -> Result<bool> {
    let index = shared.conflict_sequence.fetch_add(1, Ordering::Relaxed);
    let key_index = index / spec.conflict_group.max(1) as u64;
    let key = format!("c-{}-{key_index}", shared.run_id);
    match client.claim(&key, worker).await? {
        ClaimOutcome::Won(token) => {
            if spec.check_exclusive
                && let Ok(mut winners) = shared.winners.lock()
            {
                *winners.entry(key_index).or_insert(0) += 1;
            }
            client.complete(&key, &token, worker).await?;
            Ok(false)
        }
        ClaimOutcome::Busy | ClaimOutcome::Replayed => Ok(true),
    }
}

async fn duplicate(
    worker: usize,
    sequence: u64,
    client: &Client,
    shared: &Shared,
    spec: &LoadSpec,
) -> Result<bool> {
    let key = shared
        .in_flight
        .lock()
        .ok()
        .and_then(|keys| keys.back().cloned());
    let Some(key) = key else {
        // Nothing claimed yet (start of the run): a fresh pair instead.
        return fresh(worker, sequence, client, shared, true).await;
    };
    match client.claim(&key, worker).await? {
        ClaimOutcome::Won(token) => {
            if spec.check_exclusive {
                shared.violations.fetch_add(1, Ordering::Relaxed);
            }
            client.complete(&key, &token, worker).await?;
            Ok(false)
        }
        ClaimOutcome::Busy | ClaimOutcome::Replayed => Ok(true),
    }
}
