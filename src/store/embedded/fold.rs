//! The overlay as the writer and the readers share it, and its fold into
//! redb once a checkpoint is durable (see [`super::overlay`] for why
//! batches go there while a checkpoint runs). The fold writes through
//! [`RedbTables`], like a batch and the replay on open.

use std::sync::{Arc, RwLock};

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

    /// Writes the overlay's changes into redb (one non-durable commit, as a
    /// batch's, recording `seq` as the last frame redb holds), then empties
    /// it: in that order, so that a reader that no longer finds a change
    /// here finds it in redb. Only once a checkpoint is durable and before
    /// the next one, by the writer.
    pub(super) fn fold(&self, database: &Database, seq: u64) -> Result<(), Failure> {
        let layer = self.snapshot();
        if layer.is_empty() {
            return Ok(());
        }
        let mut txn = database
            .begin_write()
            .map_err(|e| Failure::storage("begin write", &e))?;
        txn.set_durability(Durability::None)
            .map_err(|e| Failure::other(storage_error("begin write", e).to_string()))?;
        {
            let mut tables = RedbTables::open(&txn).map_err(|e| Failure::other(e.to_string()))?;
            for table in [LogTable::Records, LogTable::Expiry, LogTable::Pending] {
                for (key, value) in layer.table(table) {
                    tables
                        .set(table, key, value.as_deref())
                        .map_err(|e| Failure::storage("write", &e))?;
                }
            }
            record_seq(&txn, seq).map_err(|e| Failure::other(e.to_string()))?;
        }
        txn.commit().map_err(|e| Failure::storage("commit", &e))?;
        *self.layer.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Layer::default());
        Ok(())
    }
}
