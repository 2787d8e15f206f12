//! The pending index: what ListPending reads instead of scanning
//! `records`. [`PendingIndex`] (`facade.rs`) is the store's entry point; it
//! owns the `Index` (`index.rs`: its statements, what this replica knows of
//! each tenant's index, the sealer's timing, and the entry a write adds
//! before the record write that makes a record due) and hands each call to
//! its pass: `Cleanup` deletes the entries a write made stale
//! ([`cleanup`], with the [`cleaner`] that runs off the reply path), `Scan`
//! serves ListPending ([`scan`]) and `Sealer` keeps every tenant's
//! watermark behind the clock ([`seal`], reading [`cursor`]s). What an
//! entry is and says is in [`entry`]; migration 1's `pending_index`, which
//! replicas of older releases still write during a rollout, in [`legacy`].
//! Entries are verified against the record table (`records::Records`)
//! wherever they are read, so the index may hold extra entries, never miss
//! one.
//!
//! # Layout (migration 3)
//!
//! An entry is `(due_at, endpoint, key)`: the instant its record starts to
//! need a decision. It lives in one of two tables:
//!
//! * `pending_buckets`, partition `(tenant, bucket, shard)`: entries of
//!   IN_PROGRESS records, `bucket = due_at / BUCKET_MS`, `shard` a stable
//!   hash of (endpoint, key) modulo [`SHARDS`]. A partition receives one
//!   bucket of one shard of a tenant's claims: at `r` claims/s,
//!   `r × BUCKET_MS / SHARDS` rows, live or dead, whatever the day's total.
//! * `pending_overdue`, partition `(tenant, shard)`: what is still pending
//!   when its bucket is sealed, and FAILED/UNKNOWN records (due at once, and
//!   rare: a handler that reported an uncertain outcome).
//!
//! Every tenant has a watermark (`pending_cursor`, LWT only). The sealer
//! ([`seal`]) keeps it `grace` behind the clock: it copies the entries
//! below the new watermark that may still be pending into
//! `pending_overdue`, advances the watermark with an LWT, and drops the
//! buckets wholly below it with one partition delete each. Readers read the
//! overdue partitions and the buckets from the watermark up, each slice
//! starting at the watermark, so no read walks the tombstones of the claims
//! completed before it: a reader walks at most the tombstones of the claims
//! due in the last `grace + step` (about 20 s at the defaults).
//!
//! # Why a crash never hides a pending record
//!
//! An entry is written before the record's conditional write that makes it
//! due, and deleted after the write that ends that: a crash between the two
//! leaves an extra entry (verified against `records` and dropped by readers),
//! never a missing one. The sealer copies before it advances and advances
//! before it drops: a crash between two of its writes leaves a duplicate
//! (same primary key in both tables, merged by readers) or a bucket below
//! the watermark that nobody reads and whose entries expire with their TTL.
//!
//! What the grace buys: an entry must never land in a bucket after that
//! bucket was sealed. Claims index `now + lease`, in the future; FAILED and
//! UNKNOWN entries go straight to `pending_overdue`, which is never sealed;
//! and a writer whose due instant is near the watermark it last saw writes to
//! `pending_overdue` too. So the grace must exceed a replica's clock skew
//! plus the latency of one index write (bounded by the request timeout).

mod cleaner;
mod cleanup;
mod cursor;
mod entry;
mod facade;
mod index;
pub(super) mod legacy;
mod scan;
mod seal;
mod statements;

pub use entry::{BUCKET_MS, SHARDS};
pub(super) use facade::PendingIndex;
pub use index::SealTiming;
pub use seal::SealReport;
