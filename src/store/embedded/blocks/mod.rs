//! Block checksums of the database file: every read redb makes is checked
//! before redb sees it, so start-up does not have to read the whole file.
//!
//! # Why
//!
//! redb checks its pages' checksums only in `check_integrity`, which reads
//! every page: 46.5 s at 10^7 records, a minute with a cold page cache. Not
//! checking would let a damaged page be served as a record (a replay of the
//! wrong bytes, or a Claim granted on a key whose entry was garbled). So the
//! file goes through [`VerifiedFile`], a redb storage backend that keeps a
//! CRC-32C of each 4 KiB block in a file beside the database
//! ([`sidecar`]), updates it on every write and checks it on every read:
//! damaged bytes never reach redb, whenever they were damaged, and an open
//! reads only what redb and the log replay touch.
//!
//! A block nobody reads is checked by the scrub ([`scrub`]): a background
//! pass over the whole file at a bounded rate, so damage is found before a
//! request (or a backup) needs the block.
//!
//! Between checkpoints the file's dirty pages are written back a little at
//! a time ([`writeback`]), so a checkpoint's sync is not one long burst the
//! log's syncs queue behind.
//!
//! # When the sums can be trusted
//!
//! They describe the file as this process last wrote it, and after a
//! clean close they describe every block. After an unclean stop (kill -9,
//! OOM, a power loss, or a disk image: a VolumeSnapshot, an LVM or EBS
//! snapshot, a copied loop device) they still describe every block of
//! redb's **last durable commit**, whatever the boot:
//!
//! - every durable commit is two-phase (quick repair implies it): its pages
//!   are written, then synced, and only then is the header pointing at them
//!   written; a sync here writes the sums before the data
//!   ([`StorageBackend::sync_data`] for [`VerifiedFile`]), so the sums of
//!   those pages were on the disk before anything referred to them;
//! - redb never writes a page of its last durable commit again (pages are
//!   freed only by a later durable commit), so neither those pages nor
//!   their sums change until the next one is on the disk;
//! - after the stop, redb opens that commit and reads only its pages, and
//!   pages it writes afterwards (summed by this process).
//!
//! Blocks written after the last sync are another matter: data reach the
//! disk whenever the kernel writes them back (every 50 ms here:
//! [`writeback`]), their sums only at the next sync, and an image or a
//! power loss keeps whatever subset the disk had. Such a block may not
//! match its sum, but it belongs to no durable commit, so redb does not
//! read it before writing it again. Which blocks they are is not recorded
//! (that would cost a sync before every write), so after an unclean stop
//! the sums are **unsettled**: reads (redb's) stay checked, since they only
//! reach blocks whose sums hold; the scrub, which reads every block, does
//! not call a mismatch damage in a block this process has not written,
//! and counts it instead. A scrub pass that finds every block matching
//! settles the sums again (recorded in the checksum file, so a restart in
//! between stays lenient). This replaced a decision by the kernel's boot
//! id (same boot: the page cache survived), which a disk image restored on
//! the machine that took it defeats: 4 of 5 such images were refused as
//! damaged for good.
//!
//! The write in flight at the stop is named by the sidecar
//! ([`sidecar::Sidecar::in_flight`]), so its blocks are summed again on
//! open. The whole file is checked (redb's full integrity check, then one
//! read) when there are no sums (first start of this release on a file),
//! when their computation did not finish, when a clean close left a length
//! the sums do not cover, and when the file's first block (redb's header)
//! no longer matches its sum: another program, e.g. an older idemd,
//! committed to it since (or the stop came between a header write and its
//! sync: the check is then only slow, never wrong).
//!
//! # Damage
//!
//! A block that does not match its sum, read by redb or by the scrub, is
//! checked once more under the write lock (to rule out a race with a write
//! of that block) and then is damage: it is recorded in the sidecar (so a
//! restart refuses the file with the same message instead of serving it),
//! logged, counted ([`crate::metrics::EMBEDDED_DAMAGED_BLOCKS`]) and turns
//! the store's answers into `DATA_LOSS` and its health to NOT_SERVING.
//! The first block is not checked: redb rewrites it in place on every
//! commit and protects it itself (two commit slots, each with a checksum).

mod backend;
mod layout;
mod scrub;
pub(super) mod sidecar;
mod sums;
mod writeback;

pub(super) use backend::VerifiedFile;
#[cfg(test)]
pub(super) use layout::BLOCK;
pub(crate) use scrub::Scrubber;
pub use scrub::{DEFAULT_SCRUB_INTERVAL, DEFAULT_SCRUB_RATE, ScrubOptions};
pub(crate) use sums::Blocks;
pub use sums::SUMS_FILE;
pub(super) use sums::Trust;
pub(super) use writeback::WRITE_BACK_INTERVAL;
