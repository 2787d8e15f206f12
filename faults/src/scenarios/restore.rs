//! `restore-guard`: `idemd restore` at the wrong moments, against the
//! release binary under load.
//!
//! 1. A backup under load, then `idemd restore --replace` pointed at the
//!    serving idemd's own data directory while clients keep writing: it
//!    must be refused (the data directory's owner lock), and the server
//!    must go on serving every key.
//! 2. The server killed (`kill -9`), then, on a copy of its data directory
//!    for each step of the restore's swap, the restore aborted there
//!    (`IDEMD_CRASH_AT`, as `kill -9`) and idemd started on what is left:
//!    every key acknowledged before the backup began must be there as
//!    acknowledged (the old store before the swap's journal, the restored
//!    one after it; never an empty store).

use std::time::Duration;

use anyhow::bail;

use crate::harness::history::{DataLoss, Verdict};
use crate::harness::report::Report;
use crate::harness::run::{Run, Setup};
use crate::harness::workload;
use crate::plumbing::server::Server;

/// The restore's crash points, in order (`store::embedded::swap` and
/// `store::embedded::backup` in the idemd crate).
const STEPS: [&str; 7] = [
    "restore-staged",
    "restore-checked",
    "restore-journaled",
    "restore-aside-first",
    "restore-aside",
    "restore-in-first",
    "restore-in",
];

/// The scenario (see the module docs).
pub async fn restore_guard(setup: &Setup<'_>) -> anyhow::Result<Report> {
    let mut run = Run::start(setup).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    run.history.phase("backup");
    let acknowledged = run.history.acknowledged_now();
    let scratch = tempfile::tempdir()?;
    let backup_dir = scratch.path().join("backup");
    let live_dir = run.servers[0].data_dir.clone();
    super::embedded::backup(setup.bin, &live_dir, &backup_dir).await?;

    // 1. A restore over the serving directory, clients still writing.
    run.history.phase("restore-over-serving");
    let over = restore(setup.bin, &backup_dir, &live_dir, None).await?;
    let said = String::from_utf8_lossy(&over.stderr).trim().to_string();
    let mut notes = Vec::new();
    if over.status.success() {
        run.history.unexpected(format!(
            "idemd restore over a serving idemd exited 0: {said}"
        ));
    } else if !said.contains("in use by idemd serve") {
        run.history.unexpected(format!(
            "idemd restore over a serving idemd failed without naming its owner: {said}"
        ));
    } else {
        notes.push(format!("restore over the serving idemd refused: {said}"));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.stop_clients().await?;
    // The server that was never disturbed still holds everything.
    run.history.phase("check-live");
    let live_finals = workload::finals(&run.servers[0].address, &run.history).await?;
    let live = run.history.verdict(&live_finals, DataLoss::IsLoss);
    run.servers[0].kill9().await?;

    // 2. A restore killed at each step.
    let mut verdict: Option<Verdict> = Some(live);
    for step in STEPS {
        run.history.phase(step);
        let dir = scratch.path().join(step);
        let copied = tokio::process::Command::new("cp")
            .arg("-a")
            .arg(&live_dir)
            .arg(&dir)
            .status()
            .await?;
        if !copied.success() {
            bail!("cp -a {} {}: {copied}", live_dir.display(), dir.display());
        }
        let killed = restore(setup.bin, &backup_dir, &dir, Some(step)).await?;
        if killed.status.code().is_some() {
            bail!(
                "the restore was to abort at {step}, it exited {}: {}",
                killed.status,
                String::from_utf8_lossy(&killed.stderr)
            );
        }
        let mut server = Server::new(setup.bin, &dir, setup.log_dir, Vec::new())?;
        server.start().await?;
        let finals = workload::finals(&server.address, &run.history).await?;
        let _ = server.stop().await;
        let step_verdict = run.history.verdict_as_of(&acknowledged, &finals);
        notes.push(format!(
            "killed at {step}: {} keys of the backup checked, {} lost",
            step_verdict.keys,
            step_verdict.lost.len()
        ));
        verdict = Some(merge(verdict.take(), step, step_verdict));
    }
    Ok(Report {
        scenario: "restore-guard".into(),
        injected: format!(
            "idemd restore --replace over a serving idemd under load; then a restore aborted at each of its {} steps, idemd started on what was left",
            STEPS.len()
        ),
        verdict: verdict.unwrap_or_default(),
        recovery_ms: Vec::new(),
        notes,
        seconds: run.started.elapsed().as_secs_f64(),
    })
}

/// `idemd restore --replace --from BACKUP --data-dir DIR`, aborting at
/// `crash_at` if given.
async fn restore(
    bin: &std::path::Path,
    from: &std::path::Path,
    data_dir: &std::path::Path,
    crash_at: Option<&str>,
) -> anyhow::Result<std::process::Output> {
    let mut command = tokio::process::Command::new(bin);
    command
        .arg("restore")
        .arg("--replace")
        .arg("--from")
        .arg(from)
        .arg("--data-dir")
        .arg(data_dir);
    if let Some(step) = crash_at {
        command.env("IDEMD_CRASH_AT", step);
    }
    Ok(command.output().await?)
}

/// `into` with `step`'s findings added, each named by its step.
pub(crate) fn merge(into: Option<Verdict>, step: &str, found: Verdict) -> Verdict {
    let Some(mut into) = into else {
        return found;
    };
    let named = |list: Vec<String>| list.into_iter().map(move |item| format!("{step}: {item}"));
    into.double.extend(named(found.double));
    into.lost.extend(named(found.lost));
    into.wrong_replays.extend(named(found.wrong_replays));
    into.unexpected.extend(
        found
            .unexpected
            .into_iter()
            .filter(|item| !into.unexpected.contains(item))
            .collect::<Vec<_>>(),
    );
    into
}
