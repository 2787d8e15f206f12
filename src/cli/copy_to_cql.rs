//! `idemd copy-to-cql`: copies every live record of a stopped embedded
//! store into a CQL keyspace, the middle step of the move to ScyllaDB
//! (docs/deploy.md, "Moving from the embedded store to ScyllaDB").
//!
//! Named *copy*, not *move*: the embedded store is only read, so until the
//! new deployment takes its first write the old one is a rollback (start
//! it again), and the copy can be run again to resume or to check (a
//! second run writes nothing and finds every record present).
//!
//! Not a client of a running server like `audit` and `keys`: the source
//! must have no owner (the data directory's owner lock,
//! `store::embedded::owner`: a running idemd is refused, named), and the
//! target is opened as `idemd --store cql` opens it, from the same flags
//! and environment. Pages of records are read on a
//! blocking thread and written by [`crate::store::transfer`], which owns
//! what a copied record keeps and how conflicts are told apart from
//! records an earlier run copied.

use std::sync::Arc;

use futures::StreamExt;

use super::CliError;
use crate::clock::{Clock, SystemClock};
use crate::config::{CopyToCqlArgs, Settings, StoreSettings};
use crate::store::cql::CqlStore;
use crate::store::embedded::export::{self, Export, OpenError};
use crate::store::embedded::moved::MovedMarker;
use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::store::transfer::{self, CopyOptions, CopyReport};
use crate::store::{Record, Store, StoreResult};

/// Pages read ahead of the writes: keeps the writes fed while the next page
/// is read, and bounds memory to a few pages.
const PAGES_AHEAD: usize = 4;

/// Runs `idemd copy-to-cql`; the summary goes to stdout, progress to
/// stderr. Conflicts are an error, after the whole copy.
pub async fn run(args: &CopyToCqlArgs) -> Result<CopyReport, CliError> {
    let settings = Settings::from_copy_args(args)
        .map_err(|e| CliError::Usage(format!("invalid configuration: {e}")))?;
    let StoreSettings::Cql(cql) = &settings.store else {
        return Err(CliError::Usage("the target must be a CQL store".into()));
    };
    let keyring = settings
        .load_keyring()
        .map_err(|e| CliError::Usage(format!("invalid configuration: {e}")))?;

    let mut options = EmbeddedOptions::new(settings.data_dir.clone());
    options.cache_bytes = settings.store_cache_bytes;
    options.keyring = keyring.clone();
    options.role = "idemd copy-to-cql";
    let source = tokio::task::spawn_blocking(move || export::open_stopped(&options))
        .await
        .map_err(|e| CliError::Failed(format!("the store's open stopped: {e}")))?
        .map_err(|e| match e {
            OpenError::Missing(_) | OpenError::Held(_) => CliError::Usage(e.to_string()),
            OpenError::Store(e) => CliError::Failed(format!("cannot open the embedded store: {e}")),
        })?;
    let source = Arc::new(source);
    let total = export::stored_records(&source).map_err(failed("read the embedded store"))?;

    let target = CqlStore::open_with_keyring(cql, keyring)
        .await
        .map_err(failed("open the CQL store"))?;
    eprintln!(
        "copying up to {total} records from {} into keyspace {} ({} in flight)",
        EmbeddedStore::database_path(&settings.data_dir).display(),
        cql.keyspace,
        args.in_flight
    );
    let copy_options = CopyOptions {
        in_flight: args.in_flight,
        ..CopyOptions::default()
    };
    let copied = transfer::copy_records(
        records(Arc::clone(&source)),
        &target,
        &SystemClock,
        copy_options,
        |report| eprintln!("{}", progress_line(report, total)),
    )
    .await;
    let _ = target.close().await;
    let report = match copied {
        Ok(report) => report,
        Err(e) => {
            let _ = source.close().await;
            return Err(CliError::Failed(format!(
                "copy stopped: {e}; what was written stays, run the command again to resume"
            )));
        }
    };
    println!("{}", summary(&report));
    if report.conflicts > 0 {
        let _ = source.close().await;
        return Err(CliError::Refused(format!(
            "{} keys are held in the target by a different record and were not copied (first: {}); the target was written by something else than this copy: check it before starting idemd on it",
            report.conflicts,
            report.conflict_keys.join("; ")
        )));
    }
    // Every live record is in the keyspace: the embedded store is marked as
    // moved (store::embedded::moved) while this process still owns it, so
    // an embedded idemd started on it later refuses, naming the keyspace.
    // Nothing else was written to the source: closing it only stops its
    // threads.
    let marked = MovedMarker::now(&cql.keyspace, &cql.nodes).write(&settings.data_dir);
    let _ = source.close().await;
    marked.map_err(failed("mark the embedded store as moved"))?;
    eprintln!(
        "{} is marked as moved to keyspace {}: `idemd serve` refuses it from now on (--allow-moved-store to roll back before the cluster takes writes)",
        settings.data_dir.display(),
        cql.keyspace
    );
    Ok(report)
}

/// The live records of `store`, read a page at a time on a blocking
/// thread, [`PAGES_AHEAD`] pages ahead of the consumer.
fn records(
    store: Arc<EmbeddedStore>,
) -> impl futures::Stream<Item = StoreResult<Record>> + Unpin + Send {
    let (pages, received) = tokio::sync::mpsc::channel(PAGES_AHEAD);
    tokio::task::spawn_blocking(move || {
        for page in Export::new(&store, || SystemClock.now_ms()) {
            // A closed channel: the copy stopped; stop reading.
            if pages.blocking_send(page).is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(received).flat_map(|page| {
        let records: Vec<StoreResult<Record>> = match page {
            Ok(page) => page.records.into_iter().map(Ok).collect(),
            Err(error) => vec![Err(error)],
        };
        futures::stream::iter(records)
    })
}

/// A progress line: how far, how fast.
fn progress_line(report: &CopyReport, total: u64) -> String {
    let settled = report.settled();
    let percent = if total == 0 {
        100.0
    } else {
        settled as f64 * 100.0 / total as f64
    };
    format!(
        "{settled}/{total} records ({percent:.1}%), {:.0} records/s, {} copied, {} already present, {} conflicts",
        report.records_per_second(),
        report.copied,
        report.present,
        report.conflicts
    )
}

/// The final summary.
fn summary(report: &CopyReport) -> String {
    format!(
        "read {} live records in {:.1} s ({:.0} records/s): {} copied, {} already present, {} expired during the copy, {} conflicts",
        report.read,
        report.elapsed.as_secs_f64(),
        report.records_per_second(),
        report.copied,
        report.present,
        report.expired,
        report.conflicts
    )
}

/// Maps a store error to a failure naming what was being done.
fn failed(doing: &'static str) -> impl Fn(crate::store::StoreError) -> CliError {
    move |e| CliError::Failed(format!("cannot {doing}: {e}"))
}
