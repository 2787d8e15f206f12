//! `idemd-bench compare`: every system and workload, the targets, and the
//! `.md`, `.json` and `.png` files.
//!
//! Every server starts once and stays up; `matrix` runs the measurements
//! round-robin over them. This module picks the systems (skipping the CQL
//! ones when no node answers), writes the settings in words, and decides
//! whether the run passed.

use anyhow::{Context, Result, bail};

use super::environment::environment;
use super::lineup::{cql_reachable, start_system, stop_all};
use super::matrix;
use super::options::{ALL_SYSTEMS, ALL_WORKLOADS, CompareArgs, SystemKind};
use crate::load::Workload;
use crate::report::{self, Report};
use crate::{chart, clients};

/// Runs the comparison; false when any run saw errors or violations.
pub async fn compare(args: CompareArgs) -> Result<bool> {
    let common = &args.common;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let started_at = report::timestamp();
    let systems: Vec<SystemKind> = if args.systems.is_empty() {
        ALL_SYSTEMS.to_vec()
    } else {
        args.systems.clone()
    };
    let workloads: Vec<Workload> = if args.workloads.is_empty() {
        ALL_WORKLOADS.to_vec()
    } else {
        args.workloads.clone()
    };
    let mut skipped = Vec::new();
    let cql_up = cql_reachable(&common.cql_nodes);
    if !cql_up && systems.iter().any(|s| s.needs_cql()) {
        if args.require_cql {
            bail!(
                "no CQL node answers at {} (start one: scripts/cassandra.sh start)",
                common.cql_nodes.join(",")
            );
        }
        for s in systems.iter().filter(|s| s.needs_cql()) {
            skipped.push((
                s.name().to_string(),
                format!("no CQL node at {}", common.cql_nodes.join(",")),
            ));
        }
    }
    let mut running = Vec::new();
    for kind in systems.iter().copied() {
        if kind.needs_cql() && !cql_up {
            continue;
        }
        eprintln!("idemd-bench: starting {}", kind.name());
        match start_system(kind, common).await {
            Ok(system) => running.push(system),
            Err(error) => {
                stop_all(running).await;
                return Err(error.context(format!("starting {}", kind.name())));
            }
        }
    }
    let outcome = matrix::measure_all(&args, &running, &workloads).await;
    let clients = match &outcome {
        Ok(_) if !args.no_clients => matrix::measure_clients(&args, &running).await,
        _ => Ok(None),
    };
    stop_all(running).await;
    let (measurements, rss_1000) = outcome?;
    let clients = clients?;

    let summaries = report::summarize(&measurements);
    let mut targets = report::targets(&summaries, rss_1000);
    if let Some(clients) = &clients {
        targets.extend(clients::targets(clients));
    }
    let settings = vec![
        (
            "load".to_string(),
            format!(
                "closed loop, {} operations in flight for every system except the CQL pair ({} in flight for raw-lwt, raw-lwt-indexed and idemd-cql alike: one Cassandra node times Paxos rounds out beyond that); {} gRPC connections (idemd, no-op), {} connections (Postgres, Redis), one driver session (raw LWT)",
                common.concurrency,
                common.cql_concurrency,
                common.connections,
                common.db_connections
            ),
        ),
        (
            "runs".to_string(),
            format!(
                "{} runs per system and workload, round-robin; {:?} measured after {:?} warm-up",
                args.runs, common.duration, common.warmup
            ),
        ),
        (
            "placement".to_string(),
            if common.pin {
                "servers pinned to core 0 (taskset), the bench client to core 1; while a CQL system is measured, Cassandra alone on core 1 and the bench (and idemd-cql) on core 0, as a deployment gives the database cores of its own".to_string()
            } else {
                "unpinned".to_string()
            },
        ),
        (
            "durability".to_string(),
            format!(
                "idemd-embedded fsyncs every acknowledged write (group commit); Postgres synchronous_commit=on, fsync=on; Redis appendonly yes, appendfsync everysec (not durable per operation); Cassandra commitlog_sync {} (scripts/cassandra.sh; raw-lwt and idemd-cql on the same node)",
                // What scripts/cassandra.sh wrote into the node's yaml.
                std::env::var("IDEMD_CASSANDRA_COMMITLOG_SYNC").unwrap_or_else(|_| "batch".into())
            ),
        ),
        (
            "workloads".to_string(),
            format!(
                "fresh = Claim + Complete on a unique key; replay = Claim of one of {} completed keys; conflict = {} consecutive claims race for each key, the winner completes (no-op not run: it enforces nothing); mixed = 90% fresh, 8% replay, 2% duplicate of a key claimed in flight",
                common.replay_keys, common.conflict_group
            ),
        ),
    ];
    let report = Report {
        started_at: started_at.clone(),
        command,
        environment: environment(common).await,
        settings,
        measurements,
        summaries,
        targets,
        skipped,
        clients,
    };
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let base = args.out_dir.join(&started_at);
    let png = base.with_extension("png");
    let chart_name = format!("{started_at}.png");
    let chart = match chart::draw(
        &png,
        &report.summaries,
        &format!("idemd benchmark {started_at}"),
    ) {
        Ok(()) => Some(chart_name.as_str()),
        Err(error) => {
            eprintln!("idemd-bench: no chart: {error:#}");
            None
        }
    };
    let markdown = report.markdown(chart);
    std::fs::write(base.with_extension("md"), &markdown)?;
    std::fs::write(
        base.with_extension("json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{markdown}");
    eprintln!("idemd-bench: wrote {}.{{md,json,png}}", base.display());
    // A baseline's own errors (Cassandra timing out Paxos rounds under
    // load) are reported in the tables but do not fail the run; a violation
    // anywhere, or an error from idemd or the no-op server, does.
    let clean = report.measurements.iter().all(|m| {
        let ours = m.system.starts_with("idemd") || m.system == "noop";
        m.violations == 0 && (!ours || m.errors + m.errors_outside_window == 0)
    });
    if !clean {
        eprintln!(
            "idemd-bench: FAILED: idemd or the no-op server saw errors, or a key had two winners"
        );
    }
    Ok(clean)
}
