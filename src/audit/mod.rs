//! The audit log: an append-only history of state transitions for the
//! endpoints whose policy sets `audit = true`.
//!
//! Every transition of an audited key (claimed, completed, failed, unknown,
//! released, taken over, reconciled) and every replay is appended as one
//! [`AuditEvent`]. Events hold hashes and prefixes, never a raw key or body:
//! the audit log answers "what happened to this key, when, and how long did
//! it take", not "what was in it".
//!
//! The log is a separate storage concern from the records, with its own
//! retention (`--audit-retention`, default 30 days) that outlives the key
//! TTL: an auditor asks about a payment after its dedup window closed.
//! Backends: [`embedded`] (its own redb file beside the records, so audit
//! writes never sit in the records' group commit) and [`cql`] (day-bucketed
//! tables with a TTL of the retention).
//!
//! Contract of an append: the events are durable when it returns `Ok`. The
//! engine appends after the transition is durable and before the RPC
//! answers; an append that fails is logged and counted
//! (`idemd_audit_write_errors_total`) but does not fail the RPC, because the
//! transition already happened and reporting it as failed would misinform
//! the caller. The audit log is evidence, not a gate.

//!
//! # Layout
//!
//! [`log`] holds what both backends share (the event, cursor and query
//! types, the [`AuditLog`] trait, the key hash and retention helpers): the
//! ground floor that [`embedded`] and [`cql`] import; this file re-exports it.

pub mod cql;
pub mod embedded;
pub mod log;

pub use log::{
    AuditCursor, AuditEvent, AuditLog, AuditQuery, DEFAULT_RETENTION, MAX_PAGE, key_sha256,
    new_event_id,
};
