//! The overlay as the writer and the readers share it, and its fold into
//! redb once a checkpoint is durable (see [`super::overlay`] for why
//! batches go there while a checkpoint runs). The fold writes through
//! [`RedbTables`], like a batch and the replay on open.
//!
//! # The fold in slices
//!
//! Folding the overlay re-applies, to redb's B-trees, every change the
//! batches made while the checkpoint ran (a ~100 ms checkpoint at 13,000
//! Claims/s leaves ~4,000 changes): 25-50 ms of the writer's time. Done at
//! once, every write queued behind it waited that long, and those waits were
//! the fresh-Claim p999 (docs/benchmarks.md, "idemd and diom"). So the writer
//! folds a bounded slice per batch ([`Folding`]), and its batches keep going
//! to the overlay until the fold has caught up:
//!
//! 1. a round freezes the overlay as it is (a reference count) and writes
//!    it into redb slice by slice, each a non-durable commit;
//! 2. once written, every change the overlay still holds unchanged leaves
//!    it (redb has it now; a key written again meanwhile keeps its newer
//!    value), in that order, so that a reader that no longer finds a change
//!    here finds it in redb;
//! 3. what the batches added meanwhile is the next round, until the overlay
//!    is empty; the writer then writes to redb again, and only then may the
//!    next checkpoint begin (it must cover every frame of its log segment).

use std::sync::{Arc, RwLock};

use std::ops::Bound;

use redb::{Database, Durability, ReadTransaction, ReadableDatabase};

use super::failure::{Failure, storage_error};
use super::overlay::Layer;
use super::tables::{RedbTables, record_seq};
use super::wal::LogTable;
use crate::store::StoreResult;

/// The overlay the writer and the readers share: the changes of the
/// batches acknowledged since the running checkpoint began, until folded
/// into redb. Cheap to clone (one shared layer).
#[derive(Debug, Clone, Default)]
pub(super) struct Overlay {
    /// Replaced whole when folded; copied on write only while a reader
    /// holds a snapshot.
    layer: Arc<RwLock<Arc<Layer>>>,
}

impl Overlay {
    /// The overlay as it is now (cheap: a reference count).
    pub(super) fn snapshot(&self) -> Arc<Layer> {
        Arc::clone(&*self.layer.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// What a reader that scans sees: the overlay, then a redb read
    /// transaction, in that order. A fold writes redb before it empties the
    /// overlay, so a change that left this snapshot is in the transaction:
    /// nothing acknowledged falls between the two.
    pub(super) fn read_view(
        &self,
        database: &Database,
    ) -> StoreResult<(Arc<Layer>, ReadTransaction)> {
        let layer = self.snapshot();
        let txn = database
            .begin_read()
            .map_err(|e| storage_error("begin read", e))?;
        Ok((layer, txn))
    }

    /// Adds a durable batch's changes, for readers to see.
    pub(super) fn publish(&self, delta: Layer) {
        let mut layer = self.layer.write().unwrap_or_else(|e| e.into_inner());
        Arc::make_mut(&mut layer).absorb(delta);
    }

    /// The first round of a fold; `None` when there is nothing to fold.
    pub(super) fn begin_fold(&self) -> Option<Folding> {
        let layer = self.snapshot();
        (!layer.is_empty()).then(|| Folding::of(layer))
    }

    /// Writes up to `max` more changes of the round into redb (one
    /// non-durable commit, as a batch's, recording `seq`, the writer's last
    /// frame: redb holds every frame up to it once the overlay is empty, and
    /// nothing is durable before then): how many it wrote, and whether the
    /// round is written.
    pub(super) fn fold_slice(
        &self,
        database: &Database,
        folding: &mut Folding,
        max: usize,
        seq: u64,
    ) -> Result<(usize, bool), Failure> {
        let mut txn = database
            .begin_write()
            .map_err(|e| Failure::storage("begin write", &e))?;
        txn.set_durability(Durability::None)
            .map_err(|e| Failure::other(storage_error("begin write", e).to_string()))?;
        let mut written = 0;
        {
            let mut tables = RedbTables::open(&txn).map_err(|e| Failure::other(e.to_string()))?;
            while written < max && folding.table < FOLD_ORDER.len() {
                let table = FOLD_ORDER[folding.table];
                let after = match &folding.after {
                    Some(key) => Bound::Excluded(key.as_slice()),
                    None => Bound::Unbounded,
                };
                let mut last = None;
                for (key, value) in folding
                    .frozen
                    .table(table)
                    .range::<[u8], _>((after, Bound::Unbounded))
                    .take(max - written)
                {
                    tables
                        .set(table, key, value.as_deref())
                        .map_err(|e| Failure::storage("write", &e))?;
                    written += 1;
                    last = Some(key);
                }
                match last {
                    Some(key) if written == max => folding.after = Some(key.clone()),
                    // This table is written: the next one, from its start.
                    _ => {
                        folding.table += 1;
                        folding.after = None;
                    }
                }
            }
            record_seq(&txn, seq).map_err(|e| Failure::other(e.to_string()))?;
        }
        txn.commit().map_err(|e| Failure::storage("commit", &e))?;
        Ok((written, folding.table == FOLD_ORDER.len()))
    }

    /// Ends a written round: every change of it the overlay still holds
    /// unchanged leaves the overlay (redb has it). The next round, or
    /// `None` once the overlay is empty.
    pub(super) fn next_round(&self, written: Folding) -> Option<Folding> {
        let mut layer = self.layer.write().unwrap_or_else(|e| e.into_inner());
        if Arc::ptr_eq(&layer, &written.frozen) {
            // Nothing was added since the round froze it.
            *layer = Arc::new(Layer::default());
            return None;
        }
        let current = Arc::make_mut(&mut layer);
        for table in FOLD_ORDER {
            let changes = current.table_mut(table);
            for (key, value) in written.frozen.table(table) {
                if changes.get(key) == Some(value) {
                    changes.remove(key);
                }
            }
        }
        (!current.is_empty()).then(|| Folding::of(Arc::clone(&layer)))
    }
}

/// The order a round writes the tables in.
const FOLD_ORDER: [LogTable; 3] = [LogTable::Records, LogTable::Expiry, LogTable::Pending];

/// One round of a fold in slices (see the module docs): the overlay as it
/// was when the round began, and how far it is written.
#[derive(Debug)]
pub(super) struct Folding {
    /// The frozen overlay this round writes; the readers' copy moves on.
    frozen: Arc<Layer>,
    /// The table of [`FOLD_ORDER`] the next slice starts in.
    table: usize,
    /// The last key written in that table; `None` from its start.
    after: Option<Vec<u8>>,
}

impl Folding {
    fn of(frozen: Arc<Layer>) -> Self {
        Self {
            frozen,
            table: 0,
            after: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableTable;

    use super::*;
    use crate::store::embedded::tables::{META, META_WAL_SEQ, RECORDS};

    fn layer(records: &[(&str, Option<&str>)]) -> Layer {
        let mut layer = Layer::default();
        for (key, value) in records {
            layer.records.insert(
                key.as_bytes().to_vec(),
                value.map(|v| v.as_bytes().to_vec()),
            );
        }
        layer
    }

    fn redb_records(database: &Database) -> Vec<(String, String)> {
        let txn = database.begin_read().expect("read");
        let table = txn.open_table(RECORDS).expect("records");
        table
            .iter()
            .expect("iter")
            .map(|entry| {
                let (key, value) = entry.expect("entry");
                let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
                (text(key.value()), text(value.value()))
            })
            .collect()
    }

    /// A fold in slices with batches between them: every slice is bounded,
    /// a key written again during the fold keeps its newer value in the
    /// overlay (and then in redb), and the overlay ends empty with redb
    /// holding every change and the writer's last frame.
    #[test]
    fn a_fold_in_slices_keeps_what_batches_wrote_meanwhile() {
        let dir = tempfile::tempdir().expect("dir");
        let database = Database::create(dir.path().join("db")).expect("create");
        let txn = database.begin_write().expect("begin");
        {
            let mut tables = RedbTables::open(&txn).expect("tables");
            tables
                .set(LogTable::Records, b"c", Some(b"old"))
                .expect("c");
        }
        txn.commit().expect("commit");

        let overlay = Overlay::default();
        overlay.publish(layer(&[("a", Some("1")), ("b", Some("2")), ("c", None)]));
        let mut folding = overlay.begin_fold().expect("something to fold");
        assert_eq!(
            overlay
                .fold_slice(&database, &mut folding, 1, 7)
                .expect("slice"),
            (1, false)
        );
        assert_eq!(
            redb_records(&database).len(),
            2,
            "one change per slice: a, and the old c"
        );
        // A batch while the fold runs: a again, and d.
        overlay.publish(layer(&[("a", Some("9")), ("d", Some("4"))]));
        while !overlay
            .fold_slice(&database, &mut folding, 1, 8)
            .expect("slice")
            .1
        {}
        let next = overlay.next_round(folding).expect("a second round");
        let left = overlay.snapshot();
        assert_eq!(
            left.records.keys().cloned().collect::<Vec<_>>(),
            [b"a".to_vec(), b"d".to_vec()],
            "b and c are in redb now; a changed meanwhile, d is new"
        );
        assert_eq!(left.get(LogTable::Records, b"a"), Some(Some(&b"9"[..])));

        let mut folding = next;
        while !overlay
            .fold_slice(&database, &mut folding, 1, 9)
            .expect("slice")
            .1
        {}
        assert!(overlay.next_round(folding).is_none(), "the overlay drained");
        assert!(overlay.snapshot().is_empty());
        assert_eq!(
            redb_records(&database),
            [("a", "9"), ("b", "2"), ("d", "4")].map(|(k, v)| (k.to_string(), v.to_string()))
        );
        let txn = database.begin_read().expect("read");
        let meta = txn.open_table(META).expect("meta");
        assert_eq!(
            meta.get(META_WAL_SEQ).expect("get").map(|v| v.value()),
            Some(9)
        );
    }
}
