//! What `compare` measures, once every server is up: the closed-loop
//! matrix (run 1 of every system and workload, then run 2, ...: slow drift
//! on a shared machine spreads over all systems instead of biasing
//! whichever ran last), the P3 open-loop runs, the P5 run, and the
//! one-in-flight phase. The servers settle before each measurement.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::lineup::Running;
use super::options::{CompareArgs, SystemKind};
use super::placement::StoreApart;
use crate::clients::{self, ClientsReport};
use crate::load::{self, Workload};
use crate::report::Measurement;
use crate::sampling;
use crate::systems::{Client, Grpc};
use crate::targets::median;

/// CPU (in cores) under which the suite's servers count as idle: an idle
/// Cassandra JVM still uses a few percent of a core for gossip and timers.
const SETTLED_CORES: f64 = 0.15;
/// Longest wait for the servers to go idle before a measurement; past it
/// the measurement runs anyway (and says it waited).
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// The one-in-flight phase (`clients`) against the no-op server and
/// idemd-embedded, when both run; the servers settle first.
pub(super) async fn measure_clients(
    args: &CompareArgs,
    running: &[Running],
) -> Result<Option<ClientsReport>> {
    let address = |kind: SystemKind| running.iter().find(|s| s.kind == kind)?.grpc;
    let (Some(noop), Some(idemd)) = (
        address(SystemKind::Noop),
        address(SystemKind::IdemdEmbedded),
    ) else {
        eprintln!("idemd-bench: one-in-flight phase skipped: it needs noop and idemd-embedded");
        return Ok(None);
    };
    let pids = sampled_pids(running);
    sampling::settle(&pids, SETTLED_CORES, SETTLE_LIMIT).await;
    let targets = [
        clients::Target {
            system: "noop",
            address: noop,
        },
        clients::Target {
            system: "idemd-embedded",
            address: idemd,
        },
    ];
    let tools = clients::Tools {
        ghz: args.ghz.clone(),
        go_loop: args.go_sdk_loop.clone(),
        pin: args.common.pin,
        parallel_for: args.ghz_duration,
    };
    clients::measure(&targets, &tools, args.runs, args.client_calls)
        .await
        .map(Some)
}

/// The closed-loop matrix, then the P3 open-loop runs and the P5 run.
pub(super) async fn measure_all(
    args: &CompareArgs,
    running: &[Running],
    workloads: &[Workload],
) -> Result<(Vec<Measurement>, Option<f64>)> {
    let common = &args.common;
    let mut measurements = Vec::new();
    // Every server and store process of the suite: all stay up throughout.
    let pids = sampled_pids(running);
    let settle = |before: String| {
        let pids = pids.clone();
        async move {
            let waited = sampling::settle(&pids, SETTLED_CORES, SETTLE_LIMIT).await;
            if waited > Duration::from_secs(2) {
                eprintln!(
                    "idemd-bench: waited {waited:.1?} for the servers to go idle before {before}"
                );
            }
        }
    };
    for run in 1..=args.runs.max(1) {
        for &workload in workloads {
            for system in running {
                if workload == Workload::Conflict && !system.kind.exclusive() {
                    continue;
                }
                settle(format!("{} {}", system.kind.name(), workload.name())).await;
                let spec = system.spec(common, workload);
                let apart = if common.pin && system.kind.needs_cql() {
                    StoreApart::enter(system.server.as_ref().and_then(|s| s.pid()))?
                } else {
                    None
                };
                let result = load::run(Arc::clone(&system.client), &spec).await;
                drop(apart);
                let result = result?;
                let m = Measurement::new(
                    system.kind.name(),
                    workload,
                    run,
                    None,
                    spec.concurrency,
                    system.connections,
                    &result,
                );
                eprintln!("{}", m.line());
                measurements.push(m);
            }
        }
    }

    // P3: replay p99 at 50% of idemd's max replay load, idemd and no-op at
    // the same offered rate.
    let find = |kind: SystemKind| running.iter().find(|s| s.kind == kind);
    if !args.no_open_loop
        && workloads.contains(&Workload::Replay)
        && let (Some(idemd), Some(noop)) = (find(SystemKind::IdemdEmbedded), find(SystemKind::Noop))
    {
        let max = median(
            measurements
                .iter()
                .filter(|m| m.system == "idemd-embedded" && m.workload == Workload::Replay)
                .map(|m| m.throughput)
                .collect(),
        );
        let rate = (max * 0.5).max(1.0);
        for run in 1..=args.runs.max(1) {
            for system in [idemd, noop] {
                settle(format!("{} open-loop replay", system.kind.name())).await;
                let mut spec = system.spec(common, Workload::Replay);
                spec.rate = Some(rate);
                let result = load::run(Arc::clone(&system.client), &spec).await?;
                let m = Measurement::new(
                    system.kind.name(),
                    Workload::Replay,
                    run,
                    Some(rate),
                    spec.concurrency,
                    system.connections,
                    &result,
                );
                eprintln!("{} (open loop at {rate:.0}/s)", m.line());
                measurements.push(m);
            }
        }
    }

    // P5: idemd-embedded RSS with 1,000 requests in flight. h2 servers
    // allow a limited number of concurrent streams per connection, so the
    // load is spread over enough connections for every request to be in
    // flight at the server, not queued in the client.
    let mut rss_1000 = None;
    if args.p5_inflight > 0
        && let Some(idemd) = find(SystemKind::IdemdEmbedded)
        && let Some(address) = idemd.grpc
    {
        let connections = args.p5_inflight.div_ceil(100).max(1);
        let client = Arc::new(Client::Grpc(
            Grpc::connect(&format!("http://{address}"), connections).await?,
        ));
        let mut spec = idemd.spec(common, Workload::Fresh);
        spec.concurrency = args.p5_inflight;
        let result = load::run(client, &spec).await?;
        let mut m = Measurement::new(
            "idemd-embedded",
            Workload::Fresh,
            1,
            None,
            args.p5_inflight,
            connections,
            &result,
        );
        m.mode = format!("closed loop, {} in flight", args.p5_inflight);
        eprintln!("{} ({} in flight)", m.line(), args.p5_inflight);
        rss_1000 = m.server_rss_mib;
        measurements.push(m);
    }
    Ok((measurements, rss_1000))
}

/// Every server and store process the suite samples, once each (the CQL
/// systems share one Cassandra).
fn sampled_pids(running: &[Running]) -> Vec<u32> {
    let mut pids: Vec<u32> = running
        .iter()
        .flat_map(|system| system.sample.iter().map(|(_, pid)| *pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}
