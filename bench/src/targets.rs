//! The targets (P1–P5 of the matrix, C1–C2 of the one-in-flight
//! phase): a goal on the ratio of two medians measured in the same run,
//! evaluated.
//!
//! A leaf of its own because both the matrix's report and the clients'
//! phase state targets, and the report holds the clients' section: with
//! the target type in either, each would import the other.

use serde::Serialize;

/// One of the targets, evaluated.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// `P1a`, `P2`, ...
    pub id: String,
    /// What is compared.
    pub description: String,
    /// The goal, e.g. `>= 2.0`.
    pub goal: String,
    /// The measured figures behind the ratio.
    pub figures: String,
    /// The ratio (or absolute value for P5), when both sides were measured.
    pub value: Option<f64>,
    /// Whether the goal is met (None when not measured).
    pub met: Option<bool>,
}

/// Median of the values (mean of the middle two for an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// A target on `numerator / denominator`, each side a figure and its words
/// for the table; "not measured" when a side is missing (or the
/// denominator is zero). The goal is `at_least`, else `at_most`, else none
/// (a ratio reported for what it explains).
pub fn ratio_target(
    id: &str,
    description: &str,
    numerator: Option<(f64, String)>,
    denominator: Option<(f64, String)>,
    at_least: Option<f64>,
    at_most: Option<f64>,
) -> Target {
    let goal = match (at_least, at_most) {
        (Some(min), _) => format!(">= {min}"),
        (_, Some(max)) => format!("<= {max}"),
        _ => String::new(),
    };
    match (numerator, denominator) {
        (Some((n, n_text)), Some((d, d_text))) if d > 0.0 => {
            let value = n / d;
            let met =
                at_least.is_none_or(|min| value >= min) && at_most.is_none_or(|max| value <= max);
            Target {
                id: id.into(),
                description: description.into(),
                goal,
                figures: format!("{n_text} / {d_text}"),
                value: Some(value),
                met: Some(met),
            }
        }
        _ => Target {
            id: id.into(),
            description: description.into(),
            goal,
            figures: "not measured in this run".into(),
            value: None,
            met: None,
        },
    }
}
