//! Reading every live record of a stopped embedded store, for `idemd
//! copy-to-cql` (`crate::cli::copy_to_cql`): the way out of one machine.
//!
//! # Contract
//!
//! The export sees exactly what a restarted store would serve, because it
//! *is* a restarted store: [`open_stopped`] opens it with
//! [`EmbeddedStore::open`] (the write-ahead log's tail replayed, the file
//! checked as at every start), and [`export_page`] reads the `records`
//! table through a redb read transaction merged with the overlay, like
//! every read of the store (the overlay is empty after open, since nothing
//! writes; it is merged anyway so that the export never depends on that).
//! Each record is decoded, its response opened with the keyring if it was
//! sealed, and records expired at the caller's clock are skipped: an
//! expired record is absent for every method of the store, so it is absent
//! here too.
//!
//! The store must be stopped: the data directory has one owner
//! ([`super::owner`]), and [`open_stopped`] reports a directory another
//! process owns as [`OpenError::Held`] rather than waiting or reading under
//! a live writer.
//!
//! # Memory
//!
//! Pages are read in key order, each in its own read transaction, resumed
//! after the last key of the previous page: memory is one page of records
//! ([`EXPORT_PAGE`]), whatever the store's size (10^7 records at a 24 h
//! TTL on one busy node).
//!
//! # Length
//!
//! Over 700 lines, half of them tests: the export and the merge of two
//! exports ([`Changes`]) share the page reader and the decoding, and the
//! merge's contract (one change per key, in key order, unchanged keys
//! counted without a decode) is tested against the export's.

use std::collections::btree_map;
use std::iter::Peekable;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;

use super::failure::storage_error;
use super::options::EmbeddedOptions;
use super::owner::{DirOwner, OwnerError};
use super::store::EmbeddedStore;
use super::tables::{RECORDS, decode_loaded};
use super::{codec, wal};
use crate::store::transfer::Change;
use crate::store::{Record, StoreError, StoreResult};

/// Entries of the `records` table read per page: a page of records of
/// the largest allowed response (4 MiB) would be large, but responses are
/// capped far lower by default (256 KiB) and typically a few KiB, so a
/// page is a few MiB at most in practice.
pub const EXPORT_PAGE: usize = 512;

/// An exclusive upper bound above every record key: a record key starts
/// with the 2-byte length of its tenant, and tenants are validated far
/// below 65,280 bytes, so no key starts with `ff ff`.
const RECORDS_END: [u8; 2] = [0xff, 0xff];

/// Why a store could not be opened for export.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The data directory holds no database file: nothing to export (and
    /// opening would create an empty store there, hiding a wrong path).
    #[error("{} does not exist: no embedded store in this data directory", .0.display())]
    Missing(PathBuf),
    /// Another process owns the data directory (a running idemd): the
    /// owner lock's message, naming it.
    #[error("{0} (the store is copied while no one writes to it)")]
    Held(String),
    /// The store failed to open (damaged file, unreadable log, ...).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Opens a stopped store for export: refuses a missing file, then opens
/// it as idemd's start would (the directory's owner lock taken, the log's
/// tail replayed); a directory another process owns is
/// [`OpenError::Held`]. Blocking: call it off the async threads.
pub fn open_stopped(options: &EmbeddedOptions) -> Result<EmbeddedStore, OpenError> {
    let path = EmbeddedStore::database_path(&options.data_dir);
    if !path.is_file() {
        return Err(OpenError::Missing(path));
    }
    // The owner lock first, to tell a held directory from any other
    // failure of the open, then handed to the open (taken once).
    let owner = match DirOwner::acquire(&options.data_dir, options.role) {
        Ok(owner) => owner,
        Err(OwnerError::Held(held)) => return Err(OpenError::Held(held)),
        Err(other) => return Err(OpenError::Store(other.into())),
    };
    Ok(EmbeddedStore::open_with(options, owner, None, false)?)
}

/// When an idemd last served the store in `data_dir` (its heartbeat,
/// [`super::alive`]): where a copy's lease credit starts. `None` when none
/// ever served there with a heartbeat (a release before it), or the file
/// is torn.
pub fn stopped_serving_at(data_dir: &std::path::Path) -> Option<i64> {
    super::alive::Heartbeat::last(data_dir)
}

/// How many entries the `records` table holds, live or expired: the total
/// a progress line counts towards (expired entries are skipped, so the
/// copy may end below it).
pub fn stored_records(store: &EmbeddedStore) -> StoreResult<u64> {
    let stored = store.record_count()?;
    let overlay = store.overlay.snapshot();
    // Overlay writes of new keys add to it; an overestimate only makes the
    // progress line end short of 100 %.
    Ok(stored + overlay.records.len() as u64)
}

/// One page of an export.
#[derive(Debug, Default)]
pub struct ExportPage {
    /// The page's live records, in key order, responses opened.
    pub records: Vec<Record>,
    /// The stored key of each record of `records` (same order): what two
    /// exports are merged by ([`Changes`]).
    pub keys: Vec<Vec<u8>>,
    /// Where the next page starts (exclusive): the last key read, live or
    /// not. `None` when the table has no more entries.
    pub resume_after: Option<Vec<u8>>,
    /// Entries read, expired ones included.
    pub scanned: usize,
}

/// Up to `limit` entries of `records` after `after` (from the start when
/// `None`), as stored: what [`export_page`] decodes and [`Changes`]
/// compares. Blocking (redb reads).
#[derive(Debug, Default)]
struct RawPage {
    /// `(key, value)` in key order, live or not.
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// Where the next page starts (exclusive): the last key read. `None`
    /// when the table has no more entries.
    resume_after: Option<Vec<u8>>,
}

fn raw_page(store: &EmbeddedStore, after: Option<&[u8]>, limit: usize) -> StoreResult<RawPage> {
    let start = match after {
        Some(key) => Bound::Excluded(key),
        None => Bound::Unbounded,
    };
    let (overlay, txn) = store.overlay.read_view(&store.database)?;
    let table = txn
        .open_table(RECORDS)
        .map_err(|e| storage_error("open", e))?;
    let base = table
        .range::<&[u8]>((start, Bound::Excluded(RECORDS_END.as_slice())))
        .map_err(|e| storage_error("read", e))?
        .map(|entry| {
            entry
                .map(|(key, value)| (key.value().to_vec(), value.value().to_vec()))
                .map_err(|e| storage_error("read", e))
        });
    let changes = overlay
        .table(wal::LogTable::Records)
        .range::<[u8], _>((start, Bound::Unbounded));
    let entries = WithOverlay::new(base, changes)
        .take(limit)
        .collect::<StoreResult<Vec<_>>>()?;
    let resume_after = if entries.len() < limit {
        None
    } else {
        entries.last().map(|(key, _)| key.clone())
    };
    Ok(RawPage {
        entries,
        resume_after,
    })
}

/// The record stored as `value` under `key`, its response opened, if it is
/// live at `now_ms`.
fn decode_live(
    store: &EmbeddedStore,
    key: &[u8],
    value: &[u8],
    now_ms: i64,
) -> StoreResult<Option<Record>> {
    let id = codec::decode_record_key(key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    decode_loaded(&id, value, now_ms)?
        .map(|loaded| store.unseal(loaded))
        .transpose()
}

/// Reads up to `limit` entries of `records` after `after` (from the start
/// when `None`), keeping those live at `now_ms`. Blocking (redb reads).
pub fn export_page(
    store: &EmbeddedStore,
    after: Option<&[u8]>,
    limit: usize,
    now_ms: i64,
) -> StoreResult<ExportPage> {
    let raw = raw_page(store, after, limit)?;
    let mut page = ExportPage {
        scanned: raw.entries.len(),
        resume_after: raw.resume_after,
        ..ExportPage::default()
    };
    for (key, value) in raw.entries {
        if let Some(record) = decode_live(store, &key, &value, now_ms)? {
            page.records.push(record);
            page.keys.push(key);
        }
    }
    Ok(page)
}

/// Every live record of a store, page by page: an iterator of
/// [`export_page`]s, each read at the clock `now` gives when it starts.
/// Ends after the first error.
pub struct Export<'a, N: FnMut() -> i64> {
    /// The store read.
    store: &'a EmbeddedStore,
    /// The clock expiry is judged by.
    now: N,
    /// Where the next page starts; `None` before the first page.
    after: Option<Vec<u8>>,
    /// No page follows (the table ended, or a read failed).
    done: bool,
}

impl<'a, N: FnMut() -> i64> Export<'a, N> {
    /// An export of `store` from its first key.
    pub fn new(store: &'a EmbeddedStore, now: N) -> Self {
        Self {
            store,
            now,
            after: None,
            done: false,
        }
    }
}

impl<N: FnMut() -> i64> Iterator for Export<'_, N> {
    type Item = StoreResult<ExportPage>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let now_ms = (self.now)();
        let page = export_page(self.store, self.after.as_deref(), EXPORT_PAGE, now_ms);
        match &page {
            Ok(page) => match &page.resume_after {
                Some(key) => self.after = Some(key.clone()),
                None => self.done = true,
            },
            Err(_) => self.done = true,
        }
        Some(page)
    }
}

/// A stored `(key, value)` of the `records` table.
type RawEntry = (Vec<u8>, Vec<u8>);

/// Raw pages of one store read ahead on a thread of their own, so that the
/// two sides of a [`Changes`] are read at once (two cores) while the merge
/// compares.
struct RawEntries {
    /// Pages from the reading thread; closed after the last one or the
    /// first error.
    pages: std::sync::mpsc::Receiver<StoreResult<Vec<RawEntry>>>,
    /// The rest of the current page.
    page: std::vec::IntoIter<RawEntry>,
    /// The entry [`Self::peek`] returned, not taken yet.
    peeked: Option<RawEntry>,
}

/// Raw pages read ahead of the merge per side: a few MiB.
const RAW_PAGES_AHEAD: usize = 4;

impl RawEntries {
    /// Starts reading `store` from its first key. The thread ends after the
    /// last page, at the first error, or when this is dropped.
    fn read(store: Arc<EmbeddedStore>) -> Self {
        let (sender, pages) = std::sync::mpsc::sync_channel(RAW_PAGES_AHEAD);
        let failed = sender.clone();
        let reader = move || {
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = raw_page(&store, after.as_deref(), EXPORT_PAGE);
                let (entries, next) = match page {
                    Ok(page) => (Ok(page.entries), page.resume_after),
                    Err(error) => (Err(error), None),
                };
                if sender.send(entries).is_err() || next.is_none() {
                    return;
                }
                after = next;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("idemd-export".into())
            .spawn(reader);
        if let Err(e) = spawned {
            let _ = failed.send(Err(storage_error("cannot start a reader thread", e)));
        }
        Self {
            pages,
            page: Vec::new().into_iter(),
            peeked: None,
        }
    }

    /// The next entry's key, waiting for the next page when this one is
    /// done.
    fn peek(&mut self) -> StoreResult<Option<&[u8]>> {
        while self.peeked.is_none() {
            if let Some(entry) = self.page.next() {
                self.peeked = Some(entry);
                break;
            }
            match self.pages.recv() {
                Err(_) => return Ok(None),
                Ok(page) => self.page = page?.into_iter(),
            }
        }
        Ok(self.peeked.as_ref().map(|(key, _)| key.as_slice()))
    }

    fn take(&mut self) -> Option<RawEntry> {
        self.peeked.take()
    }
}

/// What changed in a store since `baseline`, a backup of it whose records
/// an earlier copy wrote into the target (`idemd copy-to-cql
/// --since-backup`): both read page by page in key order, each on a thread
/// of its own, and merged, one [`Change`] per key either holds live.
/// Memory is a few pages per side.
///
/// It runs while idemd is stopped, over every key of the store, so a key
/// the two hold with the same bytes (nearly all: a backup copies the
/// stored bytes) costs a byte comparison and a peek at two fields
/// ([`codec::peek_record_value`]), not a decode: such keys come out
/// counted, as [`Change::Unchanged`], unless IN_PROGRESS (a lease to
/// credit, [`Change::Same`]). Keys whose bytes differ are decoded, and
/// equal records among them are `Same` too (a response sealed twice).
pub struct Changes<N: FnMut() -> i64> {
    /// The backup: what the target holds from the earlier copy.
    before: RawEntries,
    /// The store: what the target must hold.
    after: RawEntries,
    /// The stores, to decode with (their keyrings open sealed responses).
    stores: (Arc<EmbeddedStore>, Arc<EmbeddedStore>),
    /// The clock expiry is judged by.
    now: N,
    /// Unchanged keys met since the last item.
    unchanged: u64,
    /// A change met while `unchanged` was still to be yielded.
    held: Option<Change>,
    /// A read failed: no item follows the error.
    failed: bool,
}

/// Unchanged keys counted into one item at most, so that progress moves
/// through a long unchanged stretch.
const UNCHANGED_PER_ITEM: u64 = 4_096;

impl<N: FnMut() -> i64> Changes<N> {
    /// The changes from `baseline` to `store`.
    pub fn new(baseline: Arc<EmbeddedStore>, store: Arc<EmbeddedStore>, now: N) -> Self {
        Self {
            before: RawEntries::read(Arc::clone(&baseline)),
            after: RawEntries::read(Arc::clone(&store)),
            stores: (baseline, store),
            now,
            unchanged: 0,
            held: None,
            failed: false,
        }
    }

    /// The next key's change; `Ok(None)` once both sides ended, and
    /// `Ok(Some(None))` for a key with nothing to write (counted in
    /// `unchanged` or expired on both sides).
    fn step(&mut self) -> StoreResult<Option<Option<Change>>> {
        let order = match (self.before.peek()?, self.after.peek()?) {
            (None, None) => return Ok(None),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(before), Some(after)) => before.cmp(after),
        };
        let now_ms = (self.now)();
        let (baseline, store) = (&self.stores.0, &self.stores.1);
        let decode = |store: &EmbeddedStore, entry: Option<RawEntry>| match entry {
            Some((key, value)) => decode_live(store, &key, &value, now_ms),
            None => Ok(None),
        };
        let change = match order {
            std::cmp::Ordering::Less => {
                decode(baseline, self.before.take())?.map(|before| Change::Remove { before })
            }
            std::cmp::Ordering::Greater => {
                decode(store, self.after.take())?.map(|after| Change::Put {
                    before: None,
                    after,
                })
            }
            std::cmp::Ordering::Equal => {
                let (before, after) = (self.before.take(), self.after.take());
                match (&before, &after) {
                    (Some((_, old)), Some((key, new))) if old == new => {
                        let peek = codec::peek_record_value(new)
                            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                        if now_ms >= peek.expires_at_ms {
                            None
                        } else if peek.in_progress {
                            decode_live(store, key, new, now_ms)?.map(Change::Same)
                        } else {
                            self.unchanged += 1;
                            None
                        }
                    }
                    _ => match (decode(baseline, before)?, decode(store, after)?) {
                        (Some(before), Some(after)) if before == after => Some(Change::Same(after)),
                        (before, Some(after)) => Some(Change::Put { before, after }),
                        (Some(before), None) => Some(Change::Remove { before }),
                        (None, None) => None,
                    },
                }
            }
        };
        Ok(Some(change))
    }

    /// The unchanged keys counted so far, as an item.
    fn counted(&mut self) -> Option<Change> {
        let keys = std::mem::take(&mut self.unchanged);
        (keys > 0).then_some(Change::Unchanged { keys })
    }
}

impl<N: FnMut() -> i64> Iterator for Changes<N> {
    type Item = StoreResult<Change>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(held) = self.held.take() {
            return Some(Ok(held));
        }
        if self.failed {
            return None;
        }
        loop {
            match self.step() {
                Ok(None) => return self.counted().map(Ok),
                Ok(Some(None)) if self.unchanged >= UNCHANGED_PER_ITEM => {
                    return self.counted().map(Ok);
                }
                Ok(Some(None)) => {}
                Ok(Some(Some(change))) => match self.counted() {
                    Some(counted) => {
                        self.held = Some(change);
                        return Some(Ok(counted));
                    }
                    None => return Some(Ok(change)),
                },
                Err(error) => {
                    self.failed = true;
                    return Some(Err(error));
                }
            }
        }
    }
}

/// The entries of a redb range merged with the overlay's changes in the
/// same range: an overlay entry wins over the base's, a removal hides it.
/// ([`super::overlay::MergedKeys`] merges keys only; an export needs the
/// values, and reading each key again would double the reads.)
struct WithOverlay<'o, B: Iterator<Item = StoreResult<(Vec<u8>, Vec<u8>)>>> {
    /// `records` entries from redb, in key order.
    base: Peekable<B>,
    /// The overlay's changes of `records` in the same range, in key order.
    changes: Peekable<btree_map::Range<'o, Vec<u8>, Option<Vec<u8>>>>,
}

impl<'o, B: Iterator<Item = StoreResult<(Vec<u8>, Vec<u8>)>>> WithOverlay<'o, B> {
    fn new(base: B, changes: btree_map::Range<'o, Vec<u8>, Option<Vec<u8>>>) -> Self {
        Self {
            base: base.peekable(),
            changes: changes.peekable(),
        }
    }
}

impl<B: Iterator<Item = StoreResult<(Vec<u8>, Vec<u8>)>>> Iterator for WithOverlay<'_, B> {
    type Item = StoreResult<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.base.peek(), self.changes.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) | (Some(Ok(_)), None) => return self.base.next(),
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(Ok((base, _))), Some((key, _))) => base.as_slice().cmp(key.as_slice()),
            };
            match order {
                std::cmp::Ordering::Less => return self.base.next(),
                std::cmp::Ordering::Equal => {
                    self.base.next();
                }
                std::cmp::Ordering::Greater => {}
            }
            if let Some((key, Some(value))) = self.changes.next()
                && key.as_slice() < RECORDS_END.as_slice()
            {
                return Some(Ok((key.clone(), value.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::crypto::Keyring;
    use crate::store::embedded::tests::{NOW, completed};
    use crate::store::{InsertOutcome, RecordState, Store};

    const KEYS: &str = "k1 AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";

    fn options(dir: &std::path::Path) -> EmbeddedOptions {
        let mut options = EmbeddedOptions::new(dir);
        options.keyring = Some(std::sync::Arc::new(
            Keyring::parse(std::path::Path::new("keys"), KEYS).expect("keyring"),
        ));
        options
    }

    #[tokio::test]
    async fn every_live_record_comes_out_once_in_pages_with_its_response_opened() {
        let dir = tempfile::tempdir().expect("dir");
        let store = EmbeddedStore::open(&options(dir.path())).expect("open");
        let live = EXPORT_PAGE * 2 + 7;
        for i in 0..live + 3 {
            // The last three expire at NOW: absent for the export.
            let expires = if i < live { NOW + 60_000 } else { NOW };
            let record = completed(
                &format!("key-{i:05}"),
                format!("body {i}").as_bytes(),
                expires,
            );
            let outcome = store
                .insert_if_absent(&record, NOW - 1)
                .await
                .expect("insert");
            assert_eq!(outcome, InsertOutcome::Inserted);
        }
        store.close().await.expect("close");
        drop(store);

        let store = open_stopped(&options(dir.path())).expect("open stopped");
        assert_eq!(stored_records(&store).expect("count"), (live + 3) as u64);
        let pages: Vec<ExportPage> = Export::new(&store, || NOW)
            .collect::<StoreResult<_>>()
            .expect("export");
        assert!(pages.len() >= 3, "paged: {} pages", pages.len());
        assert!(pages.iter().all(|page| page.records.len() <= EXPORT_PAGE));
        let records: Vec<Record> = pages.into_iter().flat_map(|page| page.records).collect();
        assert_eq!(records.len(), live, "expired records are skipped");
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.id.key, format!("key-{i:05}"), "key order, each once");
            let body = record.response.as_ref().map(|r| r.body.clone());
            assert_eq!(body, Some(format!("body {i}").into_bytes()), "opened");
        }
    }

    #[tokio::test]
    async fn a_missing_or_held_store_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = open_stopped(&options(&dir.path().join("none")));
        assert!(matches!(missing, Err(OpenError::Missing(_))), "{missing:?}");
        assert!(!dir.path().join("none").exists(), "nothing created");

        let running = EmbeddedStore::open(&options(dir.path())).expect("open");
        let held = open_stopped(&options(dir.path()));
        assert!(matches!(held, Err(OpenError::Held(_))), "{held:?}");
        let message = held.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("in use by idemd serve") && message.contains("stop it first"),
            "{message}"
        );
        running.close().await.expect("close");
        drop(running);
        assert!(
            open_stopped(&options(dir.path())).is_ok(),
            "free once stopped"
        );
    }

    /// With a keyring (responses sealed anew, so no two values share their
    /// bytes: every key is decoded) and without (a key unchanged shares its
    /// bytes: only counted, unless IN_PROGRESS).
    #[tokio::test]
    async fn changes_since_a_baseline_name_each_key_once_in_key_order() {
        for sealed in [true, false] {
            changes_name_each_key_once(sealed).await;
        }
    }

    async fn changes_name_each_key_once(sealed: bool) {
        let options = |dir: &std::path::Path| {
            if sealed {
                options(dir)
            } else {
                EmbeddedOptions::new(dir)
            }
        };
        let (old_dir, new_dir) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let later = NOW + 60_000;
        // Enough keys for several pages on each side.
        let keys = EXPORT_PAGE * 2 + 5;
        let old = EmbeddedStore::open(&options(old_dir.path())).expect("open");
        let new = EmbeddedStore::open(&options(new_dir.path())).expect("open");
        for i in 0..keys {
            let key = format!("key-{i:05}");
            let mut record = completed(&key, b"same", later);
            // Every 11th unchanged key is IN_PROGRESS (its lease may need
            // crediting); the last one expired on both sides.
            if i % 11 == 0 {
                record.state = RecordState::InProgress;
                record.response = None;
                record.completed_at_ms = None;
            }
            if i == keys - 1 {
                record.expires_at_ms = NOW;
            }
            // Every 3rd key only in the baseline (removed), every 5th
            // changed, every 7th new (not in the baseline).
            if i % 7 != 0 {
                old.insert_if_absent(&record, NOW - 1)
                    .await
                    .expect("insert");
            }
            if i % 3 == 0 && i % 7 != 0 {
                continue;
            }
            let record = if i % 5 == 0 {
                completed(&key, b"changed", later)
            } else {
                record
            };
            new.insert_if_absent(&record, NOW - 1)
                .await
                .expect("insert");
        }
        for store in [old, new] {
            store.close().await.expect("close");
        }
        let old = open_stopped(&options(old_dir.path())).expect("open stopped");
        let new = open_stopped(&options(new_dir.path())).expect("open stopped");
        let changes: Vec<Change> = Changes::new(Arc::new(old), Arc::new(new), || NOW)
            .collect::<StoreResult<_>>()
            .expect("changes");
        let same = |i: usize| !i.is_multiple_of(3) && !i.is_multiple_of(5) && !i.is_multiple_of(7);
        let mut i = 0;
        let mut counted = 0;
        for change in &changes {
            let key = format!("key-{i:05}");
            match change {
                Change::Remove { before } => {
                    assert!(i % 3 == 0 && i % 7 != 0, "{key} removed");
                    assert_eq!(before.id.key, key);
                }
                Change::Put {
                    before: None,
                    after,
                } => {
                    assert!(i % 7 == 0, "{key} new");
                    assert_eq!(after.id.key, key);
                }
                Change::Put {
                    before: Some(before),
                    after,
                } => {
                    assert!(i % 5 == 0, "{key} changed");
                    assert_eq!(
                        (before.id.key.as_str(), after.id.key.as_str()),
                        (key.as_str(), key.as_str())
                    );
                    assert_ne!(before.response, after.response);
                }
                Change::Same(record) => {
                    assert!(same(i), "{key} same");
                    assert!(sealed || i % 11 == 0, "{key}: only IN_PROGRESS decoded");
                    assert_eq!(record.id.key, key);
                }
                Change::Unchanged { keys } => {
                    assert!(!sealed, "sealed twice, no two values are equal");
                    let counted_keys = (i..i + *keys as usize).collect::<Vec<_>>();
                    assert!(
                        counted_keys.iter().all(|&k| same(k) && k % 11 != 0),
                        "counted: {counted_keys:?}"
                    );
                    counted += keys;
                    i += *keys as usize;
                    continue;
                }
            }
            i += 1;
        }
        // The expired key is the last and unchanged: absent.
        assert_eq!(i, keys - 1, "one change per live key (sealed: {sealed})");
        if !sealed {
            assert!(counted > (keys / 3) as u64, "{counted} counted");
        }
    }

    #[test]
    fn overlay_entries_win_and_removals_hide_base_entries() {
        let entry = |k: &str, v: &str| Ok((k.as_bytes().to_vec(), v.as_bytes().to_vec()));
        let base = vec![entry("a", "1"), entry("b", "1"), entry("d", "1")];
        let mut changes: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        changes.insert(b"b".to_vec(), None);
        changes.insert(b"c".to_vec(), Some(b"2".to_vec()));
        changes.insert(b"d".to_vec(), Some(b"2".to_vec()));
        let merged: Vec<(Vec<u8>, Vec<u8>)> =
            WithOverlay::new(base.into_iter(), changes.range::<[u8], _>(..))
                .collect::<StoreResult<_>>()
                .expect("merge");
        let shown: Vec<(&[u8], &[u8])> = merged
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        assert_eq!(
            shown,
            [(&b"a"[..], &b"1"[..]), (b"c", b"2"), (b"d", b"2")],
            "b removed, c added, d replaced"
        );
    }
}
