//! The idempotency engine: the state machine of a key, independent of both
//! the wire protocol and the storage backend.
//!
//! ```text
//!             Claim (absent)                Complete (token)
//!   (none) ─────────────────▶ IN_PROGRESS ─────────────────▶ COMPLETED ──▶ expired
//!     ▲                        │   │  │ lease expires:                        (gone)
//!     │ Fail RELEASE /         │   │  │ Claim → pending (reconcile policy)
//!     │ Reconcile released     │   │  │       → takeover (attempt+1)
//!     └────────────────────────┘   │  └──────────────────┐
//!                 Fail UNKNOWN ────┘   Fail FAILED ──────▶ UNKNOWN / FAILED
//!                                                         │ Reconcile: committed →
//!                                                         │ COMPLETED, released →
//!                                                         │ (none), failed → FAILED,
//!                                                         │ takeover → IN_PROGRESS
//! ```
//!
//! Every write is a conditional write against the state and lease token the
//! engine read (see [`crate::store::Store`]); a lost race re-reads and
//! re-decides, so the same code is correct on a single-node store and on a
//! replicated one. The full diagram is in `docs/design.md`.
//!
//! # Layout
//!
//! * `core`: the [`Engine`] (its parts and the reads every operation
//!   shares), Lookup and the sweeper, and the helpers every operation's
//!   file uses; this file only declares the modules and re-exports;
//! * [`types`]: what the API layer hands in and gets back;
//! * `claim`: Claim, takeover, waiting for an in-flight duplicate;
//! * `finish`: what a lease holder does: Complete, Fail, ExtendLease;
//! * `reconcile`: ListPending, Reconcile, the pending gauges' summary;
//! * `transitions`: the event of every transition and the audit trail;
//! * [`skew`]: this replica's clock against the cluster's, and the
//!   takeovers it refuses while they may be too far apart;
//! * [`cache`], [`existing`], [`granted`], [`waiters`], [`limits`],
//!   [`policy`], [`validate`], [`error`]: the pieces those use.
//!
//! The unit tests (`tests.rs`, and `insert_first_tests.rs` for a store
//! that inserts before it reads) drive the engine over
//! [`crate::store::memory::MemoryStore`] with a manual clock: no network,
//! no disk.

pub mod cache;
mod core;
pub mod error;
pub mod existing;
pub mod granted;
pub mod limits;
pub mod policy;
pub mod skew;
pub mod validate;
pub mod waiters;

mod claim;
mod finish;
#[cfg(test)]
mod insert_first_tests;
mod reconcile;
#[cfg(test)]
mod tests;
mod transitions;
pub mod types;

pub use error::{EngineError, EngineResult, PreconditionReason};
pub use limits::ClaimLimiter;
pub use policy::{
    DEFAULT_MAX_CLOCK_SKEW, ExpiredLeasePolicy, MAX_CLOCK_SKEW_LIMIT, Policy, PolicySet,
};
pub use types::{
    AuditRequest, ClaimInput, ClaimOutcome, ClaimResult, Disposition, FingerprintInput, Lease,
    PendingInput, PendingSummary, ReconcileResult, Verdict,
};

pub use self::core::{DEFAULT_PAGE_SIZE, Engine, MAX_PAGE_SIZE, SWEEP_STEP};
