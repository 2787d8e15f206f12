//! Storage: the [`Store`] trait and its backends.
//!
//! The trait is the only seam between the engine and storage. It is shaped
//! after what a distributed store with lightweight transactions can do
//! atomically on one row, so that the embedded backend and the CQL backend
//! implement the same contract:
//!
//! * every write is conditional: insert-if-absent, replace-if, delete-if,
//!   with the condition being the row's state and lease token;
//! * expiry is native: a record whose `expires_at_ms` has passed is absent for
//!   every method, whether or not a sweeper has removed it yet;
//! * the pending index (records that need a decision) is maintained by the
//!   backend with the record, never by the caller.
//!
//! Backends never build a `tonic::Status`: they report [`StoreError`], which
//! distinguishes "nothing was applied" from "the outcome is unknown".
//!
//! Backends: [`embedded`] (one durable file, single node) and [`cql`]
//! (ScyllaDB / Cassandra lightweight transactions, many replicas); and
//! [`memory`], nothing durable, for the engine's unit tests and benchmarks.
//! What backends share sits here, above them: [`response`] (a stored
//! response's bytes, sealed or not), [`instrumented`] (metrics and spans
//! around any backend) and [`transfer`] (copying records from one store
//! into another as they are: the move from the embedded store to CQL).

//!
//! # Layout
//!
//! * [`record`]: what is stored per key (`Record`, `RecordKey`, states);
//! * [`contract`]: the [`Store`] trait, its conditions and outcomes, the
//!   pending queries and a backup's summary;
//! * [`error`]: [`StoreError`], the kinds of failure every method reports;
//!
//! each a ground floor that the backends below import directly; this file
//! only re-exports them, so `crate::store::Record` keeps meaning one type.

pub mod contract;
pub mod cql;
pub mod embedded;
pub mod error;
pub mod instrumented;
pub mod memory;
pub mod record;
pub mod response;
pub mod transfer;
#[cfg(test)]
mod transfer_tests;

pub use contract::{
    BackupSummary, CasOutcome, Expected, InsertOutcome, PendingCounts, PendingPage, PendingQuery,
    Store, StoreResult, count_pending,
};
pub use error::StoreError;
pub use record::{Record, RecordKey, RecordState, StoredResponse};
