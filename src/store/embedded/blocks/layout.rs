//! The geometry of the checksummed file (one sum per [`BLOCK`]) and the
//! lock helpers every file of `blocks` uses: the ground floor, so that the
//! sums ([`super::sums`]), the backend redb drives and the scrub share them
//! without importing one another or the folder's front door.

use std::sync::{Mutex, OnceLock, RwLock};

use crate::store::embedded::wal::crc32c;

/// Bytes per checksum: redb's page size, so a page read is checked by
/// whole blocks.
pub(in crate::store::embedded) const BLOCK: usize = 4096;

/// Whether `block`'s bit is set in `bits`.
pub(super) fn is_set(bits: &[u64], block: u64) -> bool {
    bits.get(to_index(block / 64))
        .is_some_and(|word| word & (1 << (block % 64)) != 0)
}

/// The sum of a whole block of zeros: what a block the file grew by holds.
pub(super) fn zero_sum() -> u32 {
    static ZERO: OnceLock<u32> = OnceLock::new();
    *ZERO.get_or_init(|| crc32c(&[0u8; BLOCK]))
}

/// Blocks of a file of `len` bytes (the last one may be short).
pub(super) fn block_count(len: u64) -> u64 {
    len.div_ceil(BLOCK as u64)
}

/// A block number as an index into the sums (a file has far fewer than
/// `usize::MAX` blocks on any platform idemd runs on).
pub(super) fn to_index(block: u64) -> usize {
    usize::try_from(block).unwrap_or(usize::MAX)
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}
