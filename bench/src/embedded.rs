//! What the embedded-store subcommands (`growth`, `startup`, `cutover`)
//! share: the idemd binary they start, filling a store in-process (fast
//! set-up, not a measurement) and the wait for a started idemd's first
//! answered Claim (what their restart figures time).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt as _;
use idemd::store::embedded::EmbeddedStore;
use idemd::store::{InsertOutcome, Record, Store};
use std::net::SocketAddr;

use crate::servers::Server;
use crate::systems::{Client, Grpc};

/// `--idemd-bin`, or the `idemd` next to this binary.
pub fn idemd_bin(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(bin) => Ok(bin.to_path_buf()),
        None => std::env::current_exe()?
            .parent()
            .map(|dir| dir.join("idemd"))
            .context("no directory for the idemd binary"),
    }
}

/// Inserts `record(i)` for every `i` of `keys` into `store`, `in_flight` at
/// a time (so the writer fills its batches), printing progress every 5 s;
/// fails if a key existed already.
pub async fn fill(
    store: &Arc<EmbeddedStore>,
    keys: Range<u64>,
    in_flight: usize,
    record: impl Fn(u64) -> Record,
) -> Result<()> {
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let end = keys.end;
    let mut done = keys.start;
    let mut writes = futures::stream::iter(keys)
        .map(|i| {
            let store = Arc::clone(store);
            let record = record(i);
            async move { store.insert_if_absent(&record, now_ms).await }
        })
        .buffer_unordered(in_flight);
    let mut last_report = Instant::now();
    while let Some(outcome) = writes.next().await {
        if outcome? != InsertOutcome::Inserted {
            bail!("a fill key existed already");
        }
        done += 1;
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            eprintln!("  filling: {done}/{end} records");
        }
    }
    Ok(())
}

/// Time from `since` until a Claim on the gRPC port succeeds.
pub async fn wait_ready(
    server: &mut Server,
    address: SocketAddr,
    since: Instant,
) -> Result<Duration> {
    let url = format!("http://{address}");
    let probe = format!("ready-{}", crate::ids::run_id());
    loop {
        server.check_alive()?;
        if let Ok(client) = Grpc::connect(&url, 1).await
            && Client::Grpc(client).claim(&probe, 0).await.is_ok()
        {
            return Ok(since.elapsed());
        }
        if since.elapsed() > Duration::from_secs(600) {
            bail!("idemd not ready after 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
