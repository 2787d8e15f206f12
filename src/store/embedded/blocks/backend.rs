//! [`VerifiedFile`]: the storage backend redb is given. Every read is
//! checked against the block sums before redb sees it, every write summed;
//! a sync writes the sums before the data (what makes the sums of redb's
//! last durable commit hold after any stop: see [`super`]).

use std::io;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::{BackendError, StorageBackend};

use super::layout::{BLOCK, block_count, lock, to_index, write_lock, zero_sum};
use super::sidecar::Header;
use super::sums::Blocks;
use crate::store::embedded::wal::crc32c;

/// The storage backend redb is given: the file of [`Blocks`], every read
/// checked, every write summed.
#[derive(Debug)]
pub(in crate::store::embedded) struct VerifiedFile(pub(in crate::store::embedded) Arc<Blocks>);

impl StorageBackend for VerifiedFile {
    fn len(&self) -> Result<u64, io::Error> {
        self.0.data.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let blocks = &self.0;
        let block = BLOCK as u64;
        let end = offset + out.len() as u64;
        let len = blocks.len.load(Ordering::Acquire);
        let (start, stop) = (offset / block * block, end.div_ceil(block) * block);
        if start == offset && (stop == end || end == len) {
            blocks.data.read(offset, out)?;
            return blocks.check(offset, out, "a read");
        }
        // Not whole blocks (redb's header reads): read the blocks around.
        let stop = stop.min(len.max(end));
        let mut whole = vec![0u8; usize::try_from(stop - start).unwrap_or(0)];
        blocks.data.read(start, &mut whole)?;
        blocks.check(start, &mut whole, "a read")?;
        let at = usize::try_from(offset - start).unwrap_or(0);
        out.copy_from_slice(&whole[at..at + out.len()]);
        Ok(())
    }

    fn set_len(&self, new_len: u64) -> Result<(), io::Error> {
        let blocks = &self.0;
        let _io = lock(&blocks.io);
        let old_len = blocks.len.load(Ordering::Acquire);
        let count = block_count(new_len);
        // New blocks read as zeros (the backend's contract, and what the
        // file system gives): their sums are known without reading them,
        // so growing a 4 GB file by 4 GB costs a write of 4 MB of sums. A
        // short last block changes with the length: summed again after.
        let kept = if old_len.is_multiple_of(BLOCK as u64) {
            block_count(old_len)
        } else {
            old_len / BLOCK as u64
        }
        .min(count);
        let zeros = zero_sum();
        let added = vec![zeros; to_index(count - kept)];
        // Whichever way, the sums are never shorter than the file at a
        // stop between the two: more sums than blocks, which the next open
        // cuts back (see `load`). Growing: the sums first (the new blocks'
        // are known: zeros). Shrinking: the file first, since an open
        // gives blocks beyond the sums the zero sum, and the tail a shrink
        // cuts holds old pages, not zeros (issue 50: a stop between the
        // sums and the file was reported as damage by the next scrub).
        // The fault suite's `resize-kill` stops after each step.
        if new_len >= old_len {
            blocks.sidecar.set_entry_count(count)?;
            blocks.sidecar.write_entries(kept, &added)?;
            crate::crash::crash_point("resize-grow-sums");
            blocks.data.set_len(new_len)?;
            crate::crash::crash_point("resize-grow-data");
        } else {
            blocks.data.set_len(new_len)?;
            crate::crash::crash_point("resize-shrink-data");
            blocks.sidecar.set_entry_count(count)?;
            blocks.sidecar.write_entries(kept, &added)?;
            crate::crash::crash_point("resize-shrink-sums");
        }
        blocks.len.store(new_len, Ordering::Release);
        let mut sums = write_lock(&blocks.sums);
        sums.truncate(to_index(kept));
        sums.extend(added);
        drop(sums);
        // Blocks that are not whole blocks of zeros or untouched: the old
        // short last block, now longer; the new short last block.
        let mut partial = Vec::new();
        if !old_len.is_multiple_of(BLOCK as u64) && kept < count {
            partial.push(kept);
        }
        if !new_len.is_multiple_of(BLOCK as u64) && count > 0 {
            partial.push(count - 1);
        }
        partial.dedup();
        let mut buffer = vec![0u8; BLOCK];
        for block in partial {
            let sum = blocks.sum_on_disk(block, &mut buffer)?;
            blocks.sidecar.write_entries(block, &[sum])?;
            write_lock(&blocks.sums)[to_index(block)] = sum;
            blocks.note_written(block, block + 1);
        }
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let blocks = &self.0;
        let _io = lock(&blocks.io);
        blocks.write_back.check()?;
        // Everything written is summed: nothing is in flight across a sync.
        blocks.sidecar.mark_in_flight(0, 0)?;
        blocks.sidecar.sync()?;
        blocks.data.sync_data()?;
        blocks.write_back.synced();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let blocks = &self.0;
        let _io = lock(&blocks.io);
        let first = offset / BLOCK as u64;
        let last = (offset + data.len() as u64).div_ceil(BLOCK as u64);
        blocks.sidecar.mark_in_flight(first, last - first)?;
        blocks.note_written(first, last);
        blocks.write_back.wrote();
        blocks.data.write(offset, data)?;
        let mut changed = Vec::with_capacity(to_index(last - first));
        let mut buffer = Vec::new();
        for block in first..last {
            let start = block * BLOCK as u64;
            let covered = start >= offset && start + BLOCK as u64 <= offset + data.len() as u64;
            changed.push(if covered {
                let at = to_index(start - offset);
                crc32c(&data[at..at + BLOCK])
            } else {
                // Partly written (redb's header): the block as it is now.
                buffer.resize(BLOCK, 0);
                blocks.sum_on_disk(block, &mut buffer)?
            });
        }
        blocks.sidecar.write_entries(first, &changed)?;
        let mut sums = write_lock(&blocks.sums);
        let end = to_index(last);
        if sums.len() < end {
            sums.resize(end, 0);
        }
        sums[to_index(first)..end].copy_from_slice(&changed);
        Ok(())
    }

    fn close(&self) -> Result<(), io::Error> {
        let blocks = &self.0;
        let closing = {
            let _io = lock(&blocks.io);
            let header = lock(&blocks.header).clone();
            if header.complete && blocks.damage.get().is_none() {
                blocks.write_back.check()?;
                blocks.data.sync_data()?;
                blocks.sidecar.mark_in_flight(0, 0)?;
                blocks.persist_header(Header {
                    clean: true,
                    ..header
                })
            } else {
                Ok(())
            }
        };
        let closed = blocks.data.close();
        closing.and(closed)
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.data.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.0.data.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.data.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.data.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.data.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.data.query_lock_range(start, end)
    }
}
