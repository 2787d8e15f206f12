//! [`measure`]: every probe through every client against each target, in
//! the order the module docs of [`super`] give.

use anyhow::Result;

use super::probe::{CLIENTS, ClientKind, ClientsReport, Figure, PROBES, Target, Tools};
use super::{ghz, go, rust};

/// Runs every probe through every client against every target, `runs`
/// times round-robin.
pub async fn measure(
    targets: &[Target<'_>],
    tools: &Tools,
    runs: usize,
    calls: usize,
) -> Result<ClientsReport> {
    let mut report = ClientsReport {
        calls,
        ..ClientsReport::default()
    };
    if tools.ghz.is_none() {
        report
            .skipped
            .push("ghz: not given (--ghz; `make bench` installs it)".into());
    }
    if tools.go_loop.is_none() {
        report
            .skipped
            .push("go-sdk: not given (--go-sdk-loop; `make bench` builds it)".into());
    }
    for run in 1..=runs.max(1) {
        for target in targets {
            let url = format!("http://{}", target.address);
            let mut rust = rust::connect(&url).await?;
            let replay_keys = rust::prepare_replay_keys(&mut rust, target.system).await?;
            for probe in PROBES {
                let replay_key = probe
                    .replay_bytes()
                    .and_then(|size| replay_keys.iter().find(|(s, _)| *s == size))
                    .map(|(_, key)| key.as_str());
                for client in CLIENTS {
                    if !client.supports(probe) {
                        continue;
                    }
                    let sample = match client {
                        ClientKind::Rust => {
                            Some(rust::sequence(&mut rust, probe, replay_key, calls).await?)
                        }
                        ClientKind::Ghz => match &tools.ghz {
                            Some(ghz) => Some(
                                ghz::sequence(ghz, tools.pin, target, probe, replay_key, calls)
                                    .await?,
                            ),
                            None => None,
                        },
                        ClientKind::GoSdk => match &tools.go_loop {
                            Some(bin) => Some(
                                go::sequence(bin, tools.pin, target, probe, replay_key, calls)
                                    .await?,
                            ),
                            None => None,
                        },
                    };
                    if let Some((p50_ms, p99_ms)) = sample {
                        let figure = Figure {
                            system: target.system.to_string(),
                            client,
                            probe,
                            run,
                            calls,
                            p50_ms,
                            p99_ms,
                        };
                        eprintln!(
                            "idemd-bench: 1 in flight run {run} {:<15} {:<7} {:<22} p50 {:.3} ms p99 {:.3} ms",
                            figure.system,
                            client.name(),
                            probe.name(),
                            p50_ms,
                            p99_ms
                        );
                        report.figures.push(figure);
                    }
                }
            }
            if let Some(ghz) = &tools.ghz {
                let parallel = ghz::parallel(ghz, tools, target, run).await?;
                eprintln!(
                    "idemd-bench: ghz 64 in flight run {run} {:<15} {:.0} claims/s p50 {:.3} ms errors {}",
                    parallel.system, parallel.throughput, parallel.p50_ms, parallel.errors
                );
                report.parallel.push(parallel);
            }
        }
    }
    Ok(report)
}
