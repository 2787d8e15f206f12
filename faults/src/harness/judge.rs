//! Measures scenarios judge by, on top of the shared checker: the share of
//! calls that failed in some phases, and how soon calls succeeded again
//! after a fault was healed. The bounds themselves are each scenario's.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::harness::history::Verdict;
use crate::harness::report::{Report, millis};
use crate::harness::run::Run;

/// Non-OK answers over all answers in `phases`, from the verdict's counts.
pub fn error_rate(verdict: &Verdict, phases: &[&str]) -> f64 {
    let (mut errors, mut all) = (0u64, 0u64);
    for phase in phases {
        for (code, n) in verdict.statuses.get(*phase).into_iter().flatten() {
            all += n;
            if code != "ok" {
                errors += n;
            }
        }
    }
    if all == 0 {
        0.0
    } else {
        errors as f64 / all as f64
    }
}

/// Waits until `ok` (a count of successful calls) grows; the time since
/// `since` that took, at most `limit`.
async fn until_calls_succeed(
    ok: impl Fn() -> u64,
    since: Instant,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let mut seen = ok();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = ok();
        if now > seen {
            return Ok(since.elapsed());
        }
        seen = now;
        if since.elapsed() > limit {
            bail!("no call succeeded within {} s", limit.as_secs());
        }
    }
}

/// How long after `since` a call succeeded again (in ms, at most 30 s),
/// or a note that none did: through any of `run`'s replicas, or through
/// `replica` only.
pub async fn recovery(
    run: &Run,
    since: Instant,
    replica: Option<usize>,
) -> (Vec<u64>, Vec<String>) {
    let ok = || match replica {
        Some(replica) => run.history.ok_count_via(replica),
        None => run.history.ok_count(),
    };
    match until_calls_succeed(ok, since, Duration::from_secs(30)).await {
        Ok(took) => (vec![millis(took)], Vec::new()),
        Err(error) => (Vec::new(), vec![error.to_string()]),
    }
}

/// Fails `report` with `failure` unless it has a recovery time, i.e. a
/// call succeeded within the 30 s [`recovery`] waits.
pub fn require_recovery(report: &mut Report, failure: &str) {
    if report.recovery_ms.is_empty() {
        report.verdict.unexpected.push(failure.to_string());
    }
}
