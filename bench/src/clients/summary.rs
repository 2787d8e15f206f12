//! What the one-in-flight phase reports: medians per (system, client,
//! probe), the targets C1 and C2, and the markdown section.

use std::fmt::Write as _;

use super::probe::{CLIENTS, ClientKind, ClientsReport, Figure, PROBES, Probe, WARMUP_CALLS};
use crate::targets::{Target, median, ratio_target};

/// Medians over the runs of one (system, client, probe).
pub fn median_of(
    report: &ClientsReport,
    system: &str,
    client: ClientKind,
    probe: Probe,
) -> Option<(f64, f64)> {
    let rows: Vec<&Figure> = report
        .figures
        .iter()
        .filter(|f| f.system == system && f.client == client && f.probe == probe)
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some((
        median(rows.iter().map(|f| f.p50_ms).collect()),
        median(rows.iter().map(|f| f.p99_ms).collect()),
    ))
}

/// Median ghz throughput at 64 in flight of `system`.
pub fn parallel_median(report: &ClientsReport, system: &str) -> Option<f64> {
    let values: Vec<f64> = report
        .parallel
        .iter()
        .filter(|p| p.system == system)
        .map(|p| p.throughput)
        .collect();
    (!values.is_empty()).then(|| median(values))
}

/// The goals for this phase: per client and probe, idemd's p50 at
/// one in flight at most 1.5x the no-op server's; ghz at 64 in flight at
/// least 0.6x the no-op server's fresh Claims/s.
pub fn targets(report: &ClientsReport) -> Vec<Target> {
    let mut out = Vec::new();
    for client in CLIENTS {
        for probe in PROBES.into_iter().filter(|&p| client.supports(p)) {
            let side = |system: &str| {
                median_of(report, system, client, probe)
                    .map(|(p50, _)| (p50, format!("{system} p50 {p50:.3} ms")))
            };
            let (idemd, noop) = (side("idemd-embedded"), side("noop"));
            if idemd.is_none() && noop.is_none() {
                continue;
            }
            out.push(ratio_target(
                &format!("C1 {}", client.name()),
                &format!("1 in flight, {}, p50 vs no-op", probe.name()),
                idemd,
                noop,
                None,
                Some(1.5),
            ));
        }
    }
    let parallel = |system: &str| {
        parallel_median(report, system).map(|t| (t, format!("{system} {t:.0} claims/s")))
    };
    if !report.parallel.is_empty() {
        out.push(ratio_target(
            "C2 ghz",
            "64 in flight over 4 connections, fresh Claims/s vs no-op",
            parallel("idemd-embedded"),
            parallel("noop"),
            Some(0.6),
            None,
        ));
    }
    out
}

impl ClientsReport {
    /// The one-in-flight section of the markdown page.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(
            md,
            "\n## One request in flight, per client (median over the runs)\n\n\
             {} sequential calls per sequence after {WARMUP_CALLS} unmeasured ones (ghz: no \
             warm-up); latencies in ms; ratio = idemd p50 / no-op p50.\n",
            self.calls
        );
        let _ = writeln!(
            md,
            "| client | probe | idemd p50 | idemd p99 | no-op p50 | no-op p99 | ratio p50 |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for client in CLIENTS {
            for probe in PROBES.into_iter().filter(|&p| client.supports(p)) {
                let idemd = median_of(self, "idemd-embedded", client, probe);
                let noop = median_of(self, "noop", client, probe);
                if idemd.is_none() && noop.is_none() {
                    continue;
                }
                let part = |v: Option<(f64, f64)>, p99: bool| {
                    v.map_or(String::new(), |(p50, p99_ms)| {
                        format!("{:.3}", if p99 { p99_ms } else { p50 })
                    })
                };
                let ratio = match (idemd, noop) {
                    (Some((a, _)), Some((b, _))) if b > 0.0 => format!("{:.2}", a / b),
                    _ => String::new(),
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    client.name(),
                    probe.name(),
                    part(idemd, false),
                    part(idemd, true),
                    part(noop, false),
                    part(noop, true),
                    ratio
                );
            }
        }
        if !self.parallel.is_empty() {
            let _ = writeln!(
                md,
                "\nghz, fresh Claims at 64 in flight over 4 connections, 10 s: idemd {:.0}/s, \
                 no-op {:.0}/s (medians).",
                parallel_median(self, "idemd-embedded").unwrap_or(0.0),
                parallel_median(self, "noop").unwrap_or(0.0)
            );
        }
        for why in &self.skipped {
            let _ = writeln!(md, "\n- skipped {why}");
        }
        md
    }
}
