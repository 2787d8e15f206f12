//! The engine alone, without gRPC: what one fresh Claim+Complete pair costs
//! in the engine, and what it costs in each store, as ratios against a
//! baseline run in the same process.
//!
//! `cargo bench --bench engine` measures; `cargo test` runs every phase a
//! few times as a smoke test (no `--bench` argument), so the benchmark
//! cannot rot.
//!
//! Phases, each a fresh pair on a unique key (Claim, then Complete with a
//! 64-byte response):
//!
//! * `store floor`: the two conditional writes the engine issues per pair
//!   (`insert_if_absent`, `replace_if`), called directly with records built
//!   once: the store's own cost, the baseline the engine is compared with;
//! * `engine`: `Engine::claim` + `Engine::complete` on the same store:
//!   validation, fingerprint, decisions, cache, metrics and the store calls.
//!
//! Both on the in-memory store (one task: the engine's CPU per pair) and on
//! the embedded store in a temporary directory (one task, then 64 at once:
//! group commit), with allocations per pair from a counting allocator.

use std::alloc::System;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemd::clock::{Clock, SystemClock};
use idemd::engine::{ClaimInput, ClaimOutcome, Engine, FingerprintInput, PolicySet};
use idemd::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idemd::store::memory::MemoryStore;
use idemd::store::{
    CasOutcome, Expected, InsertOutcome, Record, RecordKey, RecordState, Store, StoredResponse,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

/// Counts allocations so that a phase can report allocations per pair.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const TENANT: &str = "bench";
const ENDPOINT: &str = "POST /v1/payments";

/// How long each measured phase runs (and how many pairs at least).
struct Budget {
    duration: Duration,
    min_pairs: u64,
}

/// What one phase measured.
struct Figures {
    pairs: u64,
    wall: Duration,
    /// CPU of the whole process (every thread, the store's writer included).
    cpu: Duration,
    allocations: u64,
    allocated_bytes: u64,
}

impl Figures {
    fn wall_us_per_pair(&self) -> f64 {
        self.wall.as_secs_f64() * 1e6 / self.pairs as f64
    }
    fn cpu_us_per_pair(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.pairs as f64
    }
    fn pairs_per_second(&self) -> f64 {
        self.pairs as f64 / self.wall.as_secs_f64()
    }
}

/// utime + stime of this process, from /proc (Linux); zero elsewhere.
fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) start at ')'.
    let Some(rest) = stat.rfind(')').map(|at| &stat[at + 2..]) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index).and_then(|f| f.parse::<u64>().ok());
    // utime and stime are fields 14 and 15 of the line, 11 and 12 here.
    match (ticks(11), ticks(12)) {
        // USER_HZ is 100 on every Linux configuration that matters here.
        (Some(user), Some(system)) => Duration::from_millis((user + system) * 10),
        _ => Duration::ZERO,
    }
}

fn claim_input(key: String) -> ClaimInput {
    ClaimInput {
        endpoint: ENDPOINT.to_string(),
        key,
        fingerprint: FingerprintInput::Request {
            method: "POST".to_string(),
            path: "/v1/payments".to_string(),
            body: br#"{"amount":1000,"currency":"EUR","customer":"c_42"}"#.to_vec(),
            content_type: "application/json".to_string(),
            ignore_fields: Vec::new(),
        },
        lease_ms: Some(30_000),
        ttl_ms: None,
        wait_ms: None,
        attempt_id: String::new(),
    }
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".to_string(), "application/json".to_string())],
        body: vec![b'x'; 64],
        body_ref: String::new(),
    }
}

/// One fresh pair through the engine.
async fn engine_pair(engine: &Engine, key: String) {
    let result = engine
        .claim(TENANT, claim_input(key.clone()))
        .await
        .expect("claim");
    let ClaimOutcome::Claimed(lease) = result.outcome else {
        panic!("a fresh key was not claimed: {:?}", result.outcome);
    };
    engine
        .complete(TENANT, ENDPOINT, &key, &lease.lease_token, response())
        .await
        .expect("complete");
}

/// The same two conditional writes, straight to the store.
async fn store_pair(store: &dyn Store, template: &Record, completed: &Record, key: String) {
    let now = SystemClock.now_ms();
    let mut record = template.clone();
    record.id.key = key;
    match store.insert_if_absent(&record, now).await.expect("insert") {
        InsertOutcome::Inserted => {}
        InsertOutcome::Exists(_) => panic!("a fresh key existed"),
    }
    let mut done = completed.clone();
    done.id = record.id.clone();
    let expected = Expected::matching(&record);
    match store
        .replace_if(&done, &expected, now)
        .await
        .expect("replace")
    {
        CasOutcome::Applied => {}
        CasOutcome::Conflict { .. } => panic!("the holder's write conflicted"),
    }
}

fn templates() -> (Record, Record) {
    let now = SystemClock.now_ms();
    let record = Record {
        id: RecordKey {
            tenant: TENANT.to_string(),
            endpoint: ENDPOINT.to_string(),
            key: String::new(),
        },
        state: RecordState::InProgress,
        fingerprint: vec![7; 32],
        attempt: 1,
        lease_token: "0123456789abcdef0123456789abcdef".to_string(),
        attempt_id: String::new(),
        created_at_ms: now,
        updated_at_ms: now,
        lease_expires_at_ms: now + 30_000,
        completed_at_ms: None,
        expires_at_ms: now + 86_400_000,
        response: None,
        reason: String::new(),
    };
    let mut completed = record.clone();
    completed.state = RecordState::Completed;
    completed.completed_at_ms = Some(now);
    completed.response = Some(response());
    (record, completed)
}

/// Runs `pair` on unique keys with `concurrency` pairs in flight until the
/// budget is spent.
async fn measure<F, Fut>(
    label: &'static str,
    concurrency: usize,
    budget: &Budget,
    pair: F,
) -> Figures
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + budget.duration;
    let region = Region::new(GLOBAL);
    let (cpu, started) = (process_cpu(), Instant::now());
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let pair = pair.clone();
            let next = Arc::clone(&next);
            let min_pairs = budget.min_pairs;
            let prefix = format!("{label}-{run}");
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= min_pairs && Instant::now() >= deadline {
                        break;
                    }
                    pair(format!("{prefix}-{n}")).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
    // Every worker took one number more than it ran: the one that stopped it.
    let pairs = next
        .load(Ordering::Relaxed)
        .saturating_sub(concurrency as u64);
    let (wall, cpu) = (started.elapsed(), process_cpu().saturating_sub(cpu));
    let allocated = region.change();
    Figures {
        pairs: pairs.max(1),
        wall,
        cpu,
        allocations: (allocated.allocations + allocated.reallocations) as u64,
        allocated_bytes: allocated.bytes_allocated as u64,
    }
}

fn print_row(label: &str, figures: &Figures, baseline: Option<&Figures>) {
    let ratio = baseline.map_or_else(
        || "baseline".to_string(),
        |base| {
            format!(
                "{:.2}x",
                figures.wall_us_per_pair() / base.wall_us_per_pair()
            )
        },
    );
    println!(
        "{label:<34} {:>9.0} pairs/s {:>8.2} us/pair wall {:>8.2} us/pair cpu {:>6.1} allocs/pair {:>7.0} B/pair  {ratio}",
        figures.pairs_per_second(),
        figures.wall_us_per_pair(),
        figures.cpu_us_per_pair(),
        figures.allocations as f64 / figures.pairs as f64,
        figures.allocated_bytes as f64 / figures.pairs as f64,
    );
}

fn engine_on(store: Arc<dyn Store>) -> Arc<Engine> {
    Arc::new(Engine::new(
        store,
        Arc::new(SystemClock),
        Arc::new(PolicySet::default()),
        8 * 1024 * 1024,
    ))
}

async fn compare(label: &str, store: Arc<dyn Store>, concurrency: usize, budget: &Budget) {
    let (template, completed) = templates();
    let (template, completed) = (Arc::new(template), Arc::new(completed));
    let engine = engine_on(Arc::clone(&store));
    // Warm-up of both (allocator pools, the store's first pages).
    let short = Budget {
        duration: budget.duration / 5,
        min_pairs: budget.min_pairs / 5,
    };
    for pass in [&short, budget] {
        let floor_store = Arc::clone(&store);
        let (t, c) = (Arc::clone(&template), Arc::clone(&completed));
        let floor = measure("floor", concurrency, pass, move |key| {
            let (store, t, c) = (Arc::clone(&floor_store), Arc::clone(&t), Arc::clone(&c));
            async move { store_pair(&*store, &t, &c, key).await }
        })
        .await;
        let engine_for = Arc::clone(&engine);
        let measured = measure("engine", concurrency, pass, move |key| {
            let engine = Arc::clone(&engine_for);
            async move { engine_pair(&engine, key).await }
        })
        .await;
        if std::ptr::eq(pass, budget) {
            print_row(&format!("{label}: store floor"), &floor, None);
            print_row(&format!("{label}: engine"), &measured, Some(&floor));
            println!(
                "{label}: engine's own cost {:.2} us of CPU per pair",
                (measured.cpu_us_per_pair() - floor.cpu_us_per_pair()).max(0.0)
            );
        }
    }
}

fn main() {
    let benching = std::env::args().any(|arg| arg == "--bench");
    let budget = if benching {
        Budget {
            duration: Duration::from_secs(3),
            min_pairs: 2_000,
        }
    } else {
        Budget {
            duration: Duration::ZERO,
            min_pairs: 50,
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        compare(
            "memory, 1 in flight",
            Arc::new(MemoryStore::new()),
            1,
            &budget,
        )
        .await;
        let dir = tempfile::tempdir().expect("temp dir");
        let embedded =
            Arc::new(EmbeddedStore::open(&EmbeddedOptions::new(dir.path())).expect("open"));
        compare("embedded, 1 in flight", embedded.clone(), 1, &budget).await;
        compare("embedded, 64 in flight", embedded.clone(), 64, &budget).await;
        embedded.close().await.expect("close");
    });
}
