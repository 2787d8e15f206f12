//! `resize-kill`: the embedded store killed inside a resize of its database
//! file, under load.
//!
//! The store keeps a checksum of every block of the file; a growth writes
//! the checksums first, then the file, a shrink the other way round, so a
//! stop between the two leaves more checksums than blocks
//! (`store::embedded::blocks` in the idemd crate). For each crash point of a resize, growth and shrink,
//! between the two writes and after both (`IDEMD_CRASH_AT`, which aborts as
//! `kill -9`), idemd is restarted with the point set while the clients keep
//! calling, until it aborts there; then it is started without it: it must
//! start, keep serving while the scrub passes over the whole file (no false
//! damage), and at the end hold every acknowledged key. redb shrinks the
//! file only when its end is free at a durable commit, which this workload
//! may not bring about in the time given: a point not reached is reported,
//! not failed.

use std::time::Duration;

use crate::harness::report::Report;
use crate::harness::run::{Run, Setup};
use crate::plumbing::server::{Server, tail};

/// The crash points of a resize (`store::embedded::blocks::backend`).
const POINTS: [&str; 4] = [
    "resize-grow-sums",
    "resize-grow-data",
    "resize-shrink-sums",
    "resize-shrink-data",
];
/// How long a start with a crash point set may run before the point is
/// called not reached.
const REACH_LIMIT: Duration = Duration::from_secs(15);
/// How long each restart serves while the scrub passes (every 100 ms).
const SCRUBBED_FOR: Duration = Duration::from_millis(1500);

/// The scenario (see the module docs).
pub async fn resize_kill(setup: &Setup<'_>) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let server = Server::new(
        setup.bin,
        &dir.path().join("data"),
        setup.log_dir,
        vec!["--store-scrub-interval".into(), "100ms".into()],
    )?;
    let mut run = Run::start_with(vec![server], &setup.load, dir).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut notes = Vec::new();
    let mut recovery_ms = Vec::new();
    for point in POINTS {
        run.history.phase(point);
        let server = &mut run.servers[0];
        server.kill9().await?;
        server.set_env(vec![("IDEMD_CRASH_AT".into(), point.into())]);
        server.spawn()?;
        let exited = server.wait_exit(REACH_LIMIT).await?;
        server.set_env(Vec::new());
        match exited {
            Some(status) if status.success() => {
                run.history.unexpected(format!(
                    "{point}: idemd exited 0 while serving: {}",
                    tail(&server.log())
                ));
            }
            Some(_) => notes.push(format!("{point}: aborted there under load")),
            None => {
                server.kill9().await?;
                notes.push(format!(
                    "{point}: not reached in {} s (killed instead)",
                    REACH_LIMIT.as_secs()
                ));
            }
        }
        match server.start().await {
            Ok(took) => recovery_ms.push(u64::try_from(took.as_millis()).unwrap_or(u64::MAX)),
            Err(error) => {
                run.history
                    .unexpected(format!("{point}: the restart failed: {error:#}"));
                continue;
            }
        }
        tokio::time::sleep(SCRUBBED_FOR).await;
        if server.not_serving().await || server.log().contains("does not match its checksum") {
            run.history.unexpected(format!(
                "{point}: damage declared after the restart: {}",
                tail(&server.log())
            ));
        }
    }
    run.finish(
        "resize-kill",
        format!(
            "idemd aborted inside a resize of its database file under load, at each of {} points (sums resized, file not yet; both), then restarted",
            POINTS.len()
        ),
        recovery_ms,
        notes,
    )
    .await
}
