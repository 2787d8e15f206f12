//! `idemd-bench peers`: idemd beside its closest peer, svix/diom (Rust, fjall and
//! Raft; an idempotency API over HTTP/JSON), in the same run, with the
//! same client.
//!
//! Both servers run on core 0 for the whole run (their stores grow alike),
//! the client on core 1: `peer-load` (`bench/go/peerload`), one Go program
//! that speaks idemd's gRPC and diom's HTTP/JSON, written for this bench so
//! that neither server's own client measures it. Rounds interleave the
//! systems (the first one alternates), each cell a window of `--duration`
//! after `--warmup`; the table shows the medians over the rounds.
//!
//! Workloads, at 64 and 1 in flight: `pair` (fresh key claimed then
//! completed), `claim` (fresh key claimed and left in progress: what a
//! side effect still running costs), `replay` (a completed key claimed
//! again). idemd runs with its defaults except `--claim-rate 0` and
//! `--max-in-flight 0`: diom has neither a per-tenant rate limit nor load
//! shedding, and this compares the stores' request paths.
//!
//! diom is not on crates.io: `bench/scripts/diom.sh` builds it once from
//! the source the user names (`IDEMD_DIOM`); without it this prints that
//! diom was skipped and succeeds.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::report;
use crate::servers::{self, DIOM_TOKEN};
use crate::targets::median;

/// `idemd-bench peers`.
#[derive(Debug, Args)]
pub struct PeersArgs {
    /// The idemd binary (default: `idemd` next to this binary).
    #[arg(long)]
    pub idemd_bin: Option<PathBuf>,
    /// svix/diom's `diom-server` (bench/scripts/diom.sh prints it); without
    /// it diom is skipped.
    #[arg(long)]
    pub diom_bin: Option<PathBuf>,
    /// The client (bench/scripts/tools.sh builds it).
    #[arg(long)]
    pub peer_load: PathBuf,
    /// Rounds over every cell; the table shows medians.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Measured window of each cell.
    #[arg(long, default_value = "10s")]
    pub duration: humantime::Duration,
    /// Unmeasured window before it.
    #[arg(long, default_value = "2s")]
    pub warmup: humantime::Duration,
    /// Writes `<time>-peers.md` and `.json` here.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// The workloads, in the order they run.
const MODES: [&str; 3] = ["pair", "claim", "replay"];
/// Operations in flight.
const IN_FLIGHT: [usize; 2] = [64, 1];

/// One cell of one round, as `peer-load` prints it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cell {
    system: String,
    mode: String,
    in_flight: usize,
    ops_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    errors: u64,
    first_error: String,
}

/// Medians of one (mode, in flight, system) over the rounds.
#[derive(Debug, Clone, Serialize)]
struct Row {
    mode: String,
    in_flight: usize,
    system: String,
    ops_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    errors: u64,
}

/// Runs the side-by-side; false when a window saw errors.
pub async fn run(args: PeersArgs) -> Result<bool> {
    let Some(diom_bin) = &args.diom_bin else {
        println!(
            "idemd-bench peers: diom skipped: no diom-server given (set IDEMD_DIOM to diom's \
             source tarball, a source directory or a built diom-server; docs/benchmarks.md)"
        );
        return Ok(true);
    };
    let idemd_bin = crate::embedded::idemd_bin(args.idemd_bin.as_deref())?;
    let limits_off = ["--claim-rate", "0", "--max-in-flight", "0"].map(String::from);
    let (mut idemd, idemd_at) = servers::start_idemd(&idemd_bin, &limits_off, true).await?;
    crate::embedded::wait_ready(&mut idemd, idemd_at, std::time::Instant::now()).await?;
    let (diom, diom_at) = match servers::start_diom(diom_bin, true).await {
        Ok(started) => started,
        Err(error) => {
            idemd.stop().await?;
            return Err(error);
        }
    };
    let systems = [("diom", diom_at), ("idemd", idemd_at)];
    let mut cells = Vec::new();
    let measured = measure(&args, &systems, &mut cells).await;
    idemd.stop().await?;
    diom.stop().await?;
    measured?;

    let rows = medians(&cells);
    let table = table(&rows, &args);
    println!("{table}");
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir)?;
        let stem = dir.join(format!("{}-peers", report::timestamp()));
        std::fs::write(stem.with_extension("md"), &table)?;
        let json = serde_json::json!({ "cells": cells, "medians": rows });
        std::fs::write(
            stem.with_extension("json"),
            serde_json::to_vec_pretty(&json)?,
        )?;
        println!("idemd-bench peers: wrote {}.{{md,json}}", stem.display());
    }
    Ok(rows.iter().all(|row| row.errors == 0))
}

/// Every round over every cell, systems interleaved.
async fn measure(
    args: &PeersArgs,
    systems: &[(&str, SocketAddr); 2],
    cells: &mut Vec<Cell>,
) -> Result<()> {
    for round in 0..args.rounds {
        for mode in MODES {
            for in_flight in IN_FLIGHT {
                for turn in 0..systems.len() {
                    let (system, address) = systems[(turn + round) % systems.len()];
                    let cell = one(args, system, address, mode, in_flight).await?;
                    eprintln!(
                        "round {} {mode:<6} {in_flight:>2} in flight  {system:<5} {:>8.0} ops/s  \
                         p50 {:.2}  p99 {:.2}  p999 {:.2} ms  errors {}",
                        round + 1,
                        cell.ops_per_s,
                        cell.p50_ms,
                        cell.p99_ms,
                        cell.p999_ms,
                        cell.errors
                    );
                    cells.push(cell);
                }
            }
        }
    }
    Ok(())
}

/// One window of `peer-load` on core 1.
async fn one(
    args: &PeersArgs,
    system: &str,
    address: SocketAddr,
    mode: &str,
    in_flight: usize,
) -> Result<Cell> {
    let mut command = tokio::process::Command::new("taskset");
    command
        .args(["-c", "1"])
        .arg(&args.peer_load)
        .args(["-system", system, "-mode", mode])
        .args(["-addr", &address.to_string()])
        .args(["-in-flight", &in_flight.to_string()])
        .args(["-duration", &seconds(args.duration.into())])
        .args(["-warmup", &seconds(args.warmup.into())])
        .args(["-token", DIOM_TOKEN])
        .kill_on_drop(true);
    let output = command
        .output()
        .await
        .with_context(|| format!("running {}", args.peer_load.display()))?;
    if !output.status.success() {
        anyhow::bail!(
            "peer-load against {system} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "reading peer-load's output: {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// A duration as Go's `time.ParseDuration` reads it.
fn seconds(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// Medians per (mode, in flight, system), in the table's order.
fn medians(cells: &[Cell]) -> Vec<Row> {
    let mut rows = Vec::new();
    for mode in MODES {
        for in_flight in IN_FLIGHT {
            for system in ["diom", "idemd"] {
                let group: Vec<&Cell> = cells
                    .iter()
                    .filter(|c| c.mode == mode && c.in_flight == in_flight && c.system == system)
                    .collect();
                if group.is_empty() {
                    continue;
                }
                let of = |f: fn(&Cell) -> f64| median(group.iter().map(|c| f(c)).collect());
                rows.push(Row {
                    mode: mode.to_string(),
                    in_flight,
                    system: system.to_string(),
                    ops_per_s: of(|c| c.ops_per_s),
                    p50_ms: of(|c| c.p50_ms),
                    p99_ms: of(|c| c.p99_ms),
                    p999_ms: of(|c| c.p999_ms),
                    errors: group.iter().map(|c| c.errors).sum(),
                });
            }
        }
    }
    rows
}

/// The markdown table, with idemd's figures as ratios to diom's (throughput
/// idemd/diom, latency diom/idemd: above 1 means idemd leads).
fn table(rows: &[Row], args: &PeersArgs) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## idemd and diom, side by side ({} rounds of {} after {} warm-up, medians; servers on \
         core 0, peer-load on core 1)\n",
        args.rounds, args.duration, args.warmup
    );
    let _ = writeln!(
        md,
        "| workload | in flight | system | ops/s | p50 ms | p99 ms | p999 ms | errors | idemd leads by (ops, p50, p99, p999) |\n|---|---|---|---|---|---|---|---|---|"
    );
    for row in rows {
        let lead = (row.system == "idemd")
            .then(|| {
                rows.iter().find(|d| {
                    d.system == "diom" && d.mode == row.mode && d.in_flight == row.in_flight
                })
            })
            .flatten()
            .map(|d| {
                format!(
                    "{:.2}×, {:.2}×, {:.2}×, {:.2}×",
                    row.ops_per_s / d.ops_per_s,
                    d.p50_ms / row.p50_ms,
                    d.p99_ms / row.p99_ms,
                    d.p999_ms / row.p999_ms
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.3} | {:.2} | {:.2} | {} | {lead} |",
            row.mode,
            row.in_flight,
            row.system,
            row.ops_per_s,
            row.p50_ms,
            row.p99_ms,
            row.p999_ms,
            row.errors
        );
    }
    md
}
