//! The embedded store: one durable redb file, for a single idemd node.
//!
//! # Envelope
//!
//! * One process owns the data directory ([`owner`]: a lock held for the
//!   process's life, as PostgreSQL's `postmaster.pid`): a second idemd, a
//!   restore or a copy pointed at the same `--data-dir` is refused, naming
//!   the holder. This backend is for a single replica; use the CQL backend
//!   to scale out.
//! * An acknowledged write survives `kill -9` and power loss: before any
//!   reply, the batch's changes are appended to a write-ahead log and
//!   `fdatasync`ed (see [`wal`]); the redb file itself is made durable by
//!   periodic checkpoints, and on open the log's frames newer than the last
//!   checkpoint are replayed into it.
//!
//! # Group commit
//!
//! All writes go through one writer thread ([`group`], [`writer`]). It
//! takes the first waiting operation, then everything else already queued
//! (up to [`MAX_BATCH`]), applies them in order inside one redb write
//! transaction while logging each change, appends the log frame and syncs
//! it (one fsync per batch), commits the transaction without durability
//! (the log has it) and only then replies to each. Under load many requests share one fsync; with one
//! request in flight the latency is one log append. Operations in a batch see
//! each other's effects, so the order of application is the linearization
//! order. A batch that changed nothing (every condition failed) needs no
//! fsync and is answered at once.
//!
//! Why not a durable redb commit per batch: it copies and rewrites every
//! B-tree page the batch touched (tens of scattered 4 KiB pages) and fsyncs
//! them, several times the cost of a sequential log append; that, not CPU,
//! bounded throughput. Checkpoints write each page once for many batches.
//!
//! Reads use redb's MVCC read transactions and never wait for the writer.
//! They cannot see a write before it is durable: the redb transaction is
//! committed (made visible) only after its log frame is synced.
//!
//! # Checkpoints beside the writer
//!
//! A checkpoint (a durable redb commit, after which a log segment is
//! reused) runs on its own thread ([`checkpoint`]), the last one at close
//! too. While it holds redb's write lock the writer does not wait for it:
//! batches are logged and synced as always, their changes kept in an
//! in-memory overlay that reads consult before redb, and folded into redb
//! once the checkpoint is durable ([`overlay`]; [`wal`] for the two log
//! segments that keep the frames written meanwhile apart from those the
//! checkpoint covers). A checkpoint that blocked the writer set the tail of
//! every write queued behind it; [`stages`] has the per-stage metrics that
//! show where writes wait.
//!
//! After a storage error in the write path (log sync, redb commit,
//! checkpoint) the writer stops accepting writes until a restart: after a
//! failed fsync the kernel may have dropped unwritten pages, so neither the
//! log nor the in-memory state can be trusted to match the disk, and redb
//! latches its own I/O errors until the file is reopened; the restart's
//! replay is the one consistent way back. The `idemd` binary exits then,
//! with a message saying what to do ([`failure`] classifies the errors and
//! words it).
//!
//! A full disk when the log is appended to is the exception: a frame that
//! could not be written whole is not in the log (its checksum cannot match)
//! and no sync failed, so the batch is refused with `UNAVAILABLE` (nothing
//! applied) and the writer goes on; writes resume by themselves once space
//! is freed. The log is reused in place after each checkpoint, so it
//! needs new space only when a burst outgrows its file.
//!
//! # Layout
//!
//! This file is the store's face (open, the [`Store`] methods, the read
//! side); [`group`] is the group-commit thread, [`writer`] its batches,
//! [`checkpoint`] the checkpoint thread, [`overlay`] the changes made while
//! one runs, [`fold`] the overlay readers share and its fold into redb,
//! [`failure`] what a storage failure means, [`tables`] the tables and the
//! four writes on them, [`recovery`] the replay on open, [`wal`] the log's
//! format, [`codec`] the bytes of keys and values.
//!
//! # Tables
//!
//! * `records`: record key → record (see [`codec`]).
//! * `expiry`: (expires_at, record key) → (): what the sweeper deletes.
//! * `pending`: (tenant, pending_since, endpoint, key) → (): what ListPending
//!   reads; maintained in the same transaction as the record, so it can only
//!   be stale for records that expired (filtered on read, swept later).
//!
//! # Encryption at rest
//!
//! With a keyring ([`EmbeddedOptions::keyring`]) the writer seals each
//! record's response as it encodes the record (see [`codec`]), so the
//! records table and the write-ahead log only ever hold sealed responses.
//! The writer never decrypts: conditions need only the clear fields, and a
//! value it could not decrypt must not fail the other operations of its
//! batch. Records it returns (an existing record, a conflict) carry their
//! sealed response out of the writer thread and are opened by the caller.

pub mod alive;
pub mod backup;
#[cfg(test)]
mod backup_tests;
mod blocks;
#[cfg(test)]
mod blocks_tests;
mod checkpoint;
pub mod codec;
pub mod export;
mod failure;
mod fold;
pub(crate) mod group;
pub mod moved;
mod options;
mod overlay;
pub mod owner;
mod recovery;
pub mod restore;
mod stages;
mod store;
pub mod swap;
mod tables;
#[cfg(test)]
mod tests;
pub mod wal;
mod writer;

pub use blocks::{DEFAULT_SCRUB_INTERVAL, DEFAULT_SCRUB_RATE, SUMS_FILE, ScrubOptions};
pub use failure::exit_on_storage_failure;
pub(crate) use failure::storage_error;
pub use options::{DATABASE_FILE, DEFAULT_CACHE_BYTES, EmbeddedOptions, SERVE_ROLE};
pub use store::{EmbeddedStore, MAX_BATCH};
pub use writer::WriterStats;
