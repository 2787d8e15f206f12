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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;

use super::error::CliError;
use crate::clock::{Clock, SystemClock};
use crate::config::{CopyToCqlArgs, Settings, StoreSettings};
use crate::store::cql::CqlStore;
use crate::store::cql::cutover::CutoverMark;
use crate::store::embedded::backup;
use crate::store::embedded::export::{self, EXPORT_PAGE, Export, OpenError};
use crate::store::embedded::moved::{BULK_COPIED_FILE, MovedMarker};
use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::store::transfer::{self, Change, CopyOptions, CopyReport, LeaseCredit};
use crate::store::{Store, StoreResult};

/// Pages read ahead of the writes: keeps the writes fed while the next page
/// is read, and bounds memory to a few pages.
const PAGES_AHEAD: usize = 4;

/// What one run of the command copies.
enum Step {
    /// Every live record of the stopped store (the long stop).
    Whole,
    /// Every live record of a backup, while idemd serves (the short
    /// cut-over's first step).
    Bulk(PathBuf),
    /// What changed from the backup the keyspace holds (`since`) to a
    /// later one (`backup`), while idemd serves: a catch-up, run as often
    /// as needed so that the stop carries only the changes since the last.
    Catchup {
        /// The later backup, the source.
        backup: PathBuf,
        /// The backup the keyspace holds.
        since: PathBuf,
    },
    /// What changed in the stopped store since the backup the keyspace
    /// holds (the short cut-over's stop).
    Since(PathBuf),
}

impl Step {
    fn from_args(args: &CopyToCqlArgs) -> Self {
        match (&args.from_backup, &args.since_backup) {
            (Some(backup), Some(since)) => Step::Catchup {
                backup: backup.clone(),
                since: since.clone(),
            },
            (Some(backup), None) => Step::Bulk(backup.clone()),
            (None, Some(since)) => Step::Since(since.clone()),
            (None, None) => Step::Whole,
        }
    }

    /// Whether idemd may serve the data directory meanwhile: the step
    /// reads a backup, never the data directory, so it credits no lease
    /// and marks nothing as moved.
    fn while_serving(&self) -> bool {
        matches!(self, Step::Bulk(_) | Step::Catchup { .. })
    }

    /// The store the step reads its records from.
    fn source<'a>(&'a self, data_dir: &'a Path) -> &'a Path {
        match self {
            Step::Bulk(backup) | Step::Catchup { backup, .. } => backup,
            Step::Whole | Step::Since(_) => data_dir,
        }
    }

    /// Refuses a step that the backups' marks say would leave the
    /// keyspace short of a record.
    fn check(&self, keyspace: &str) -> Result<(), CliError> {
        if let Some(since) = self.baseline() {
            check_bulk_copied(since, keyspace, self)?;
        }
        if let Step::Catchup { backup, since } = self {
            check_later(backup, since)?;
        }
        Ok(())
    }

    /// The backup the keyspace holds, which only the changes are written
    /// over.
    fn baseline(&self) -> Option<&Path> {
        match self {
            Step::Catchup { since, .. } | Step::Since(since) => Some(since),
            Step::Whole | Step::Bulk(_) => None,
        }
    }
}

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
    let step = Step::from_args(args);
    step.check(&cql.keyspace)?;

    let mut options = EmbeddedOptions::new(step.source(&settings.data_dir));
    options.cache_bytes = settings.store_cache_bytes;
    options.keyring = keyring.clone();
    options.role = "idemd copy-to-cql";
    // Every page the copy reads is checked against its sum as it is read
    // (store::embedded::blocks): a background scrub would read the same
    // file a second time, on the clock of the stop.
    options.scrub.rate = 0;
    let source = Arc::new(open_source(options.clone()).await?);
    let baseline = match step.baseline() {
        Some(since) => {
            let mut baseline = options.clone();
            baseline.data_dir = since.to_path_buf();
            baseline.role = "idemd copy-to-cql (reading the backup the keyspace holds)";
            Some(Arc::new(open_source(baseline).await?))
        }
        None => None,
    };
    let total = export::stored_records(&source).map_err(failed("read the embedded store"))?;
    // The leases held when idemd stopped get the time it has been stopped
    // (transfer, "Leases across the move"); a bulk copy runs while it
    // serves and the step after it writes the leases again.
    let lease_credit = if step.while_serving() {
        None
    } else {
        lease_credit(&settings.data_dir, args.lease_grace.into())
    };

    let target = CqlStore::open_with_keyring(cql, keyring)
        .await
        .map_err(failed("open the CQL store"))?;
    let marked = match &step {
        Step::Catchup { backup, since } => supersede(since, backup, &cql.keyspace),
        Step::Whole | Step::Bulk(_) | Step::Since(_) => Ok(()),
    };
    let marked = match marked {
        Ok(()) => mark_copying(&step, &settings.data_dir, cql, &target).await,
        Err(e) => Err(e),
    };
    let finished_before = match marked {
        Ok(finished_before) => finished_before,
        Err(e) => {
            let _ = target.close().await;
            return Err(e);
        }
    };
    eprintln!(
        "copying {} into keyspace {} ({} in flight; up to {total} records read)",
        match &step {
            Step::Whole => format!("every live record of {}", settings.data_dir.display()),
            Step::Bulk(backup) => format!("every live record of the backup {}", backup.display()),
            Step::Catchup { backup, since } => format!(
                "what changed from the backup {} to the backup {}",
                since.display(),
                backup.display()
            ),
            Step::Since(backup) => format!(
                "what changed in {} since the backup {}",
                settings.data_dir.display(),
                backup.display()
            ),
        },
        cql.keyspace,
        args.in_flight
    );
    let copy_options = CopyOptions {
        in_flight: args.in_flight,
        lease_credit,
        ..CopyOptions::default()
    };
    let copied = transfer::copy_changes(
        changes(Arc::clone(&source), baseline.clone()),
        &target,
        &SystemClock,
        copy_options,
        |report| eprintln!("{}", progress_line(report, total)),
    )
    .await;
    if let Some(baseline) = baseline {
        let _ = baseline.close().await;
    }
    let report = match copied {
        Ok(report) => report,
        Err(e) => {
            let _ = (source.close().await, target.close().await);
            return Err(CliError::Failed(format!(
                "copy stopped: {e}; what was written stays, run the command again to resume"
            )));
        }
    };
    println!("{}", summary(&report));
    if report.conflicts > 0 {
        let _ = (source.close().await, target.close().await);
        return Err(CliError::Refused(format!(
            "{} keys are held in the target by a different record and were not copied (first: {}); the target was written by something else than this copy: check it before starting idemd on it",
            report.conflicts,
            report.conflict_keys.join("; ")
        )));
    }
    let marked = mark(&step, &settings.data_dir, &cql.keyspace, &cql.nodes);
    let _ = source.close().await;
    marked?;
    // Every live record is in the keyspace: replicas may start on it.
    if !step.while_serving() && !finished_before {
        let cleared = CutoverMark::clear(target.session(), &cql.keyspace).await;
        cleared.map_err(failed("clear the keyspace's cut-over mark"))?;
        eprintln!(
            "keyspace {} is complete: idemd --store cql may start on it",
            cql.keyspace
        );
    }
    let _ = target.close().await;
    Ok(report)
}

/// Marks the keyspace as being copied into before the first record is
/// written (store::cql::cutover: no replica may start on it until the last
/// step finished). Not for a run over a store whose cut-over into this
/// keyspace already finished (a check run, or a resume after the new
/// deployment took writes): its replicas serve, and a mark left by a run
/// that then finds their writes as conflicts would keep every later
/// replica from starting. Returns whether it had finished.
async fn mark_copying(
    step: &Step,
    data_dir: &Path,
    cql: &crate::store::cql::CqlOptions,
    target: &CqlStore,
) -> Result<bool, CliError> {
    let finished_before = !step.while_serving()
        && MovedMarker::read(data_dir)
            .ok()
            .flatten()
            .is_some_and(|moved| moved.keyspace == cql.keyspace);
    if finished_before {
        return Ok(true);
    }
    let copying = CutoverMark {
        source: step.source(data_dir).display().to_string(),
        started_at_ms: SystemClock.now_ms(),
    };
    copying
        .write(target.session(), &cql.keyspace)
        .await
        .map_err(failed("mark the keyspace as being copied into"))?;
    Ok(false)
}

/// Leaves the mark of a finished step: the backup's after a bulk copy (what
/// `--since-backup` checks), the data directory's after the last step
/// (`idemd serve` refuses a moved store).
fn mark(step: &Step, data_dir: &Path, keyspace: &str, nodes: &[String]) -> Result<(), CliError> {
    let marker = MovedMarker::now(keyspace, nodes);
    match step {
        Step::Bulk(backup) | Step::Catchup { backup, .. } => {
            marker
                .write_as(backup, BULK_COPIED_FILE)
                .map_err(failed("mark the backup as copied"))?;
            eprintln!(
                "the keyspace {keyspace} holds the backup {}; idemd still serves {}: either take a newer backup and catch up with --from-backup NEWER --since-backup {} (while it serves; the stop then carries only what changed since NEWER), or stop it and run the same command with only --since-backup {} (it copies what changed since the backup)",
                backup.display(),
                data_dir.display(),
                backup.display(),
                backup.display()
            );
        }
        // Every live record is in the keyspace: the embedded store is
        // marked as moved (store::embedded::moved) while this process still
        // owns it, so an embedded idemd started on it later refuses,
        // naming the keyspace. Nothing else was written to the source.
        Step::Whole | Step::Since(_) => {
            marker
                .write(data_dir)
                .map_err(failed("mark the embedded store as moved"))?;
            eprintln!(
                "{} is marked as moved to keyspace {keyspace}: `idemd serve` refuses it from now on (--allow-moved-store to roll back before the cluster takes writes)",
                data_dir.display()
            );
        }
    }
    Ok(())
}

/// Refuses a `--since-backup` whose backup the keyspace does not hold:
/// one no `--from-backup` copied whole into `keyspace` (the step writes
/// only what changed since the backup, so without the bulk the keyspace
/// would miss every other record), or one a catch-up has since brought the
/// keyspace past (what the catch-up wrote would be missed). A catch-up run
/// again over the same two backups (a resume) is allowed.
fn check_bulk_copied(since: &Path, keyspace: &str, step: &Step) -> Result<(), CliError> {
    let mark = match MovedMarker::read_as(since, BULK_COPIED_FILE) {
        Ok(Some(mark)) if mark.keyspace == keyspace => mark,
        Ok(Some(mark)) => {
            return Err(CliError::Refused(format!(
                "the backup {} was copied into keyspace {}, not {keyspace}: --since-backup writes only what changed since it",
                since.display(),
                mark.keyspace
            )));
        }
        Ok(None) => {
            return Err(CliError::Refused(format!(
                "no `idemd copy-to-cql --from-backup {}` finished into keyspace {keyspace}: --since-backup writes only what changed since the backup, so copy the backup first (while idemd serves)",
                since.display()
            )));
        }
        Err(e) => return Err(failed("read the backup's copy mark")(e)),
    };
    let resuming = |later: &str| match step {
        Step::Catchup { backup, .. } => same_dir(Path::new(later), backup),
        Step::Whole | Step::Bulk(_) | Step::Since(_) => false,
    };
    match mark.superseded_by {
        Some(later) if !resuming(&later) => Err(CliError::Refused(format!(
            "keyspace {keyspace} no longer holds the backup {}: a catch-up to the backup {later} began since; finish it (run it again: --from-backup {later} --since-backup {}), then give --since-backup {later}",
            since.display(),
            since.display()
        ))),
        _ => Ok(()),
    }
}

/// Refuses a catch-up whose source is not a later backup than the one the
/// keyspace holds: two names of one backup, or the two given the wrong way
/// round (the keyspace would go back in time, and later steps, trusting
/// the marks, would build on that).
fn check_later(backup: &Path, since: &Path) -> Result<(), CliError> {
    if same_dir(backup, since) {
        return Err(CliError::Usage(format!(
            "--from-backup and --since-backup name the same backup {}: a catch-up copies what changed from the backup the keyspace holds to a newer one",
            backup.display()
        )));
    }
    let manifest =
        |dir: &Path| backup::read_manifest(dir).map_err(|e| CliError::Usage(format!("{e}")));
    let (later, earlier) = (manifest(backup)?, manifest(since)?);
    if later.started_at_ms <= earlier.started_at_ms {
        return Err(CliError::Refused(format!(
            "the backup {} was taken before the backup {} the keyspace holds: a catch-up goes from the backup the keyspace holds to a newer one (swap the two, or take a new backup)",
            backup.display(),
            since.display()
        )));
    }
    Ok(())
}

/// Marks `since` as superseded by `backup` before the catch-up writes its
/// first record: from then on the keyspace may hold records of either, so
/// `--since-backup since` refuses until the catch-up finished (then
/// `--since-backup backup` is the step).
fn supersede(since: &Path, backup: &Path, keyspace: &str) -> Result<(), CliError> {
    let read = MovedMarker::read_as(since, BULK_COPIED_FILE);
    let mut mark = read
        .map_err(failed("read the backup's copy mark"))?
        .ok_or_else(|| CliError::Failed(format!("the copy mark of {} is gone", since.display())))?;
    debug_assert_eq!(mark.keyspace, keyspace);
    mark.superseded_by = Some(backup.display().to_string());
    mark.write_as(since, BULK_COPIED_FILE)
        .map_err(failed("mark the backup the keyspace held as superseded"))
}

/// Whether two paths name one directory (either may not exist yet).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The lease credit of a copy from `data_dir`, from its last heartbeat.
fn lease_credit(data_dir: &Path, grace: std::time::Duration) -> Option<LeaseCredit> {
    match export::stopped_serving_at(data_dir) {
        Some(stopped_at_ms) => Some(LeaseCredit {
            stopped_at_ms,
            grace,
        }),
        None => {
            eprintln!(
                "{} has no heartbeat (no idemd of this release served it): leases are copied with the deadlines they had",
                data_dir.display()
            );
            None
        }
    }
}

/// Opens a stopped store (the data directory or a backup) off the async
/// threads.
async fn open_source(options: EmbeddedOptions) -> Result<EmbeddedStore, CliError> {
    tokio::task::spawn_blocking(move || export::open_stopped(&options))
        .await
        .map_err(|e| CliError::Failed(format!("the store's open stopped: {e}")))?
        .map_err(|e| match e {
            OpenError::Missing(_) | OpenError::Held(_) => CliError::Usage(e.to_string()),
            OpenError::Store(e) => CliError::Failed(format!("cannot open the embedded store: {e}")),
        })
}

/// The changes to write, read on a blocking thread [`PAGES_AHEAD`] pages
/// ahead of the consumer: every live record of `store`, or, with a
/// `baseline`, what changed since it ([`export::Changes`]).
fn changes(
    store: Arc<EmbeddedStore>,
    baseline: Option<Arc<EmbeddedStore>>,
) -> impl futures::Stream<Item = StoreResult<Change>> + Unpin + Send {
    let (pages, received) = tokio::sync::mpsc::channel(PAGES_AHEAD);
    tokio::task::spawn_blocking(move || {
        let now = || SystemClock.now_ms();
        let send = |batch: StoreResult<Vec<Change>>| pages.blocking_send(batch).is_ok();
        match baseline {
            None => {
                for page in Export::new(&store, now) {
                    let batch = page.map(|page| {
                        let puts = page.records.into_iter();
                        puts.map(|after| Change::Put {
                            before: None,
                            after,
                        })
                        .collect()
                    });
                    // A closed channel: the copy stopped; stop reading.
                    if !send(batch) {
                        return;
                    }
                }
            }
            Some(baseline) => {
                let mut merged = export::Changes::new(baseline, store, now);
                loop {
                    let batch: StoreResult<Vec<Change>> =
                        merged.by_ref().take(EXPORT_PAGE).collect();
                    let last = matches!(&batch, Ok(batch) if batch.is_empty()) || batch.is_err();
                    if !send(batch) || last {
                        return;
                    }
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(received).flat_map(|batch| {
        let changes: Vec<StoreResult<Change>> = match batch {
            Ok(batch) => batch.into_iter().map(Ok).collect(),
            Err(error) => vec![Err(error)],
        };
        futures::stream::iter(changes)
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
        "read {} live records in {:.1} s ({:.0} records/s): {} copied, {} removed, {} unchanged since the backup, {} already present, {} expired during the copy, {} conflicts; {} leases credited with the stop",
        report.read,
        report.elapsed.as_secs_f64(),
        report.records_per_second(),
        report.copied,
        report.removed,
        report.unchanged,
        report.present,
        report.expired,
        report.conflicts,
        report.leases_credited
    )
}

/// Maps a store error to a failure naming what was being done.
fn failed(doing: &'static str) -> impl Fn(crate::store::StoreError) -> CliError {
    move |e| CliError::Failed(format!("cannot {doing}: {e}"))
}
