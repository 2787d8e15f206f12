//! The changes acknowledged while a checkpoint runs, and the views that
//! read through them.
//!
//! A checkpoint is a durable redb commit: it holds redb's write lock while
//! it writes and syncs every page dirtied since the last one, long enough
//! to set the tail of every write queued behind it. So it runs on its own
//! thread ([`super::checkpoint`]), and meanwhile the writer goes on: it
//! appends and syncs each batch to the log as always, but keeps the batch's
//! changes here instead of in redb. Readers (and the writer's own
//! conditions) look here first, then in redb. Once the checkpoint is
//! durable the writer folds these changes into redb ([`super::fold`]) and
//! empties the overlay, in that order, so a reader that misses a change
//! here finds it in redb.
//!
//! The log holds every change kept here (it was synced before the batch was
//! answered), so a crash loses nothing: the replay on open rebuilds it.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::failure::storage_error;
use super::wal::LogTable;
use crate::store::StoreResult;

/// One table's changes: key → new value, `None` for a removal.
pub(super) type Changes = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// Changes to the three tables, newest value per key.
#[derive(Debug, Default, Clone)]
pub(super) struct Layer {
    /// `records`.
    pub(super) records: Changes,
    /// `expiry`.
    pub(super) expiry: Changes,
    /// `pending`.
    pub(super) pending: Changes,
}

impl Layer {
    /// The changes of `table`.
    pub(super) fn table(&self, table: LogTable) -> &Changes {
        match table {
            LogTable::Records => &self.records,
            LogTable::Expiry => &self.expiry,
            LogTable::Pending => &self.pending,
        }
    }

    /// The changes of `table`, to add to.
    pub(super) fn table_mut(&mut self, table: LogTable) -> &mut Changes {
        match table {
            LogTable::Records => &mut self.records,
            LogTable::Expiry => &mut self.expiry,
            LogTable::Pending => &mut self.pending,
        }
    }

    /// No change at all.
    pub(super) fn is_empty(&self) -> bool {
        self.records.is_empty() && self.expiry.is_empty() && self.pending.is_empty()
    }

    /// Adds `newer` on top of this layer.
    pub(super) fn absorb(&mut self, newer: Layer) {
        self.records.extend(newer.records);
        self.expiry.extend(newer.expiry);
        self.pending.extend(newer.pending);
    }

    /// What this layer says of `key` in `table`: `Some(None)` removed,
    /// `Some(Some(v))` written, `None` unchanged.
    pub(super) fn get(&self, table: LogTable, key: &[u8]) -> Option<Option<&[u8]>> {
        self.table(table).get(key).map(|value| value.as_deref())
    }

    /// The changes of `table` with keys in `[start, end)`, as
    /// (key, present) pairs in key order.
    pub(super) fn keys_in(
        &self,
        table: LogTable,
        start: &[u8],
        end: &[u8],
    ) -> Vec<(Vec<u8>, bool)> {
        if start >= end {
            return Vec::new();
        }
        self.table(table)
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
            .map(|(key, value)| (key.clone(), value.is_some()))
            .collect()
    }
}

/// Merges the keys of a base table (redb, in key order) with an overlay's
/// (key, present) changes: overlay entries win, removals hide base keys.
pub(super) struct MergedKeys<B: Iterator<Item = StoreResult<Vec<u8>>>> {
    /// The base keys.
    base: std::iter::Peekable<B>,
    /// The overlay's changes in the same range, in key order.
    overlay: std::iter::Peekable<std::vec::IntoIter<(Vec<u8>, bool)>>,
}

impl<B: Iterator<Item = StoreResult<Vec<u8>>>> MergedKeys<B> {
    /// Merges `base` with `overlay` (from [`Layer::keys_in`]).
    pub(super) fn new(base: B, overlay: Vec<(Vec<u8>, bool)>) -> Self {
        Self {
            base: base.peekable(),
            overlay: overlay.into_iter().peekable(),
        }
    }
}

impl<B: Iterator<Item = StoreResult<Vec<u8>>>> Iterator for MergedKeys<B> {
    type Item = StoreResult<Vec<u8>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.base.peek(), self.overlay.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) => return self.base.next(),
                (Some(Ok(_)), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(Ok(base)), Some((key, _))) => base.as_slice().cmp(key.as_slice()),
            };
            match order {
                std::cmp::Ordering::Less => return self.base.next(),
                std::cmp::Ordering::Equal => {
                    self.base.next();
                }
                std::cmp::Ordering::Greater => {}
            }
            if let Some((key, present)) = self.overlay.next()
                && present
            {
                return Some(Ok(key));
            }
        }
    }
}

/// The keys of a redb table in `[start, end)`, owned, in order.
pub(super) fn redb_keys<'a, V: redb::Value + 'static>(
    table: &'a impl redb::ReadableTable<&'static [u8], V>,
    start: &'a [u8],
    end: &'a [u8],
) -> StoreResult<impl Iterator<Item = StoreResult<Vec<u8>>> + 'a> {
    let range = if start < end {
        Some(
            table
                .range::<&[u8]>(start..end)
                .map_err(|e| storage_error("read", e))?,
        )
    } else {
        None
    };
    Ok(range.into_iter().flatten().map(|entry| {
        entry
            .map(|(key, _)| key.value().to_vec())
            .map_err(|e| storage_error("read", e))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_changes_win_over_the_base_keys() {
        let mut layer = Layer::default();
        layer.pending.insert(b"b".to_vec(), None);
        layer.pending.insert(b"c".to_vec(), Some(Vec::new()));
        layer.pending.insert(b"e".to_vec(), Some(Vec::new()));
        layer.pending.insert(b"z".to_vec(), Some(Vec::new()));
        let base = ["a", "b", "d", "e"]
            .into_iter()
            .map(|k| Ok(k.as_bytes().to_vec()));
        let merged: Vec<Vec<u8>> =
            MergedKeys::new(base, layer.keys_in(LogTable::Pending, b"a", b"y"))
                .collect::<StoreResult<_>>()
                .expect("merge");
        assert_eq!(
            merged,
            [b"a", b"c", b"d", b"e"].map(|k| k.to_vec()).to_vec(),
            "b removed, c added, e in both once, z out of range"
        );
    }
}
