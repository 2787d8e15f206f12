//! The PNG chart: throughput per workload and system (grouped bars, log
//! scale), and latency percentiles of the `fresh` workload per system.
//!
//! Drawn with plotters' bitmap backend and the DejaVu Sans font compiled in
//! (`dejavu` crate, registered through plotters' `ab_glyph` feature), so it
//! renders the same on a machine without any system fonts.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::load::Workload;
use crate::report::Summary;

const FONT: &str = "sans-serif";

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("chart: {e}")
}

/// Writes the chart of the closed-loop medians to `path`.
pub fn draw(path: &Path, summaries: &[Summary], title: &str) -> Result<()> {
    // Registering twice is harmless; the font lives for the process.
    plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow!("chart: cannot load the embedded font"))?;
    let closed: Vec<&Summary> = summaries.iter().filter(|s| s.mode == "closed").collect();
    let mut systems: Vec<String> = Vec::new();
    let mut workloads: Vec<Workload> = Vec::new();
    for s in &closed {
        if !systems.contains(&s.system) {
            systems.push(s.system.clone());
        }
        if !workloads.contains(&s.workload) {
            workloads.push(s.workload);
        }
    }
    let root = BitMapBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, (FONT, 26).into_font()).map_err(err)?;
    let (top, bottom) = root.split_vertically(520);

    // Throughput: one group per workload, one bar per system, log scale.
    let max = closed.iter().map(|s| s.throughput).fold(1.0_f64, f64::max);
    let min = closed
        .iter()
        .map(|s| s.throughput)
        .filter(|v| *v > 0.0)
        .fold(max, f64::min);
    let groups = workloads.len().max(1);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            "Throughput (closed loop, median; pairs/s for fresh, claims/s for replay and conflict, ops/s for mixed)",
            (FONT, 18),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..groups as f64, ((min / 2.0).max(1.0)..max * 2.0).log_scale())
        .map_err(err)?;
    let names = workloads.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&move |x| {
            let index = x.floor() as usize;
            if (x.fract() - 0.5).abs() < 0.01 && index < names.len() {
                names[index].name().to_string()
            } else {
                String::new()
            }
        })
        .y_desc("operations per second")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FONT, 15))
        .draw()
        .map_err(err)?;
    let width = 0.8 / systems.len().max(1) as f64;
    let floor = (min / 2.0).max(1.0);
    for (i, system) in systems.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let bars: Vec<Rectangle<(f64, f64)>> = workloads
            .iter()
            .enumerate()
            .filter_map(|(g, workload)| {
                let s = closed
                    .iter()
                    .find(|s| &s.system == system && s.workload == *workload)?;
                let x0 = g as f64 + 0.1 + i as f64 * width;
                Some(Rectangle::new(
                    [(x0, floor), (x0 + width * 0.9, s.throughput.max(floor))],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(system.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 15))
        .draw()
        .map_err(err)?;

    // Latency of `fresh`: p50, p90, p99, p99.9 per system.
    let fresh: Vec<&&Summary> = closed
        .iter()
        .filter(|s| s.workload == Workload::Fresh)
        .collect();
    let percentiles = ["p50", "p90", "p99", "p99.9"];
    let values = |s: &Summary| [s.p50_ms, s.p90_ms, s.p99_ms, s.p999_ms];
    let lat_max = fresh
        .iter()
        .flat_map(|s| values(s))
        .fold(0.01_f64, f64::max);
    let lat_min = fresh
        .iter()
        .flat_map(|s| values(s))
        .filter(|v| *v > 0.0)
        .fold(lat_max, f64::min);
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            "Latency of one fresh pair (Claim + Complete), closed loop, median",
            (FONT, 18),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(80)
        .build_cartesian_2d(
            -0.2..(percentiles.len() as f64 - 0.8),
            ((lat_min / 2.0).max(0.001)..lat_max * 2.0).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(percentiles.len() * 4)
        .x_label_formatter(&|x| {
            let rounded = x.round();
            if (x - rounded).abs() < 0.01 && rounded >= 0.0 {
                percentiles
                    .get(rounded as usize)
                    .map(|p| p.to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("milliseconds")
        .y_label_formatter(&|y| format!("{y}"))
        .label_style((FONT, 15))
        .draw()
        .map_err(err)?;
    for s in &fresh {
        let index = systems.iter().position(|n| n == &s.system).unwrap_or(0);
        let color = COLORS[index % COLORS.len()];
        let points: Vec<(f64, f64)> = values(s)
            .iter()
            .enumerate()
            .map(|(i, v)| (i as f64, v.max(0.001)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))
            .map_err(err)?
            .label(s.system.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color.stroke_width(3)));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 5, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 15))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
