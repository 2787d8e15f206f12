//! What a run injects (the profile) and what a scenario reports: the
//! verdict with the scenario's notes, printed as a progress line and
//! written as JSON (`--json`, the shape docs/reliability.md and `make
//! faults` read).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::harness::history::Verdict;

/// How much of each fault a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// The subset inside `make test`: seconds per scenario.
    Short,
    /// `make faults`: minutes.
    Full,
}

impl Profile {
    /// The profile as `--profile` takes it (the partition scenarios pass it
    /// on to the suite they re-run in a namespace).
    pub fn flag(self) -> &'static str {
        match self {
            Profile::Short => "short",
            Profile::Full => "full",
        }
    }
}

/// The outcome of one scenario.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// What was injected, in words.
    pub injected: String,
    /// The checker's findings.
    pub verdict: Verdict,
    /// Restart (or recovery) times in ms, one per fault.
    pub recovery_ms: Vec<u64>,
    /// Anything else worth reporting (a refused start's message).
    pub notes: Vec<String>,
    /// Wall time of the scenario.
    pub seconds: f64,
}

impl Report {
    /// Whether the scenario passed.
    pub fn passed(&self) -> bool {
        self.verdict.passed()
    }

    /// The report's progress lines, on stderr: the verdict's counts, the
    /// statuses per phase, the recovery times, the notes and the first
    /// problems.
    pub fn print(&self) {
        let v = &self.verdict;
        let calls: u64 = v.statuses.values().flat_map(|codes| codes.values()).sum();
        eprintln!(
            "idemd-faults: {:<12} {} in {:.1}s: {} RPCs, {} keys, {} acked, lost {}, double {}, wrong replays {}, undecided {}, unexpected {}, data loss {}",
            self.scenario,
            if self.passed() { "PASS" } else { "FAIL" },
            self.seconds,
            calls,
            v.keys,
            v.acked,
            v.lost.len(),
            v.double.len(),
            v.wrong_replays.len(),
            v.undecided,
            v.unexpected.len(),
            v.data_loss,
        );
        for (phase, codes) in &v.statuses {
            let codes: Vec<String> = codes
                .iter()
                .map(|(code, n)| format!("{code} {n}"))
                .collect();
            eprintln!("idemd-faults:   phase {phase:<9} {}", codes.join(", "));
        }
        if !self.recovery_ms.is_empty() {
            let mut sorted = self.recovery_ms.clone();
            sorted.sort_unstable();
            eprintln!(
                "idemd-faults:   recovery: {} faults, median {} ms, max {} ms",
                sorted.len(),
                sorted[sorted.len() / 2],
                sorted[sorted.len() - 1]
            );
        }
        for note in &self.notes {
            eprintln!("idemd-faults:   note: {note}");
        }
        for problem in v
            .double
            .iter()
            .chain(&v.lost)
            .chain(&v.wrong_replays)
            .chain(&v.unexpected)
            .take(10)
        {
            eprintln!("idemd-faults:   problem: {problem}");
        }
    }
}

/// `duration` in whole milliseconds, as reports carry times.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
