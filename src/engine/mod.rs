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
//! * `facade`: the [`Engine`], the public face: one method per RPC, each
//!   handed to the core or to the view of its family;
//! * `core`: the `Core` every operation works on (the store, the clock,
//!   the caches, the waiters), the reads they share, Lookup and the sweeps,
//!   and the small helpers each operation's file uses;
//! * `claim` (`Claims`): Claim, takeover, waiting for an in-flight
//!   duplicate;
//! * `finish` (`LeaseHolder`): what a lease holder does: Complete, Fail,
//!   ExtendLease;
//! * `reconcile` (`Reconciler`): ListPending, Reconcile, the pending
//!   gauges' summary;
//! * `transitions` (`Trail`): the event of every transition and the audit
//!   trail;
//! * [`types`]: what the API layer hands in and gets back;
//! * [`skew`]: this replica's clock against the cluster's, and the
//!   takeovers it refuses while they may be too far apart;
//! * [`cache`], [`existing`], [`granted`], [`waiters`], [`limits`],
//!   [`policy`], [`validate`], [`error`]: the pieces those use.
//!
//! Each view borrows the core for one call, so the families share every
//! handle without a copy, each type's `impl` is in its own file, and no
//! two of these files import each other (CODE_STYLE.md).
//!
//! The unit tests (`tests.rs`, and `insert_first_tests.rs` for a store
//! that inserts before it reads) drive the engine over
//! [`crate::store::memory::MemoryStore`] with a manual clock: no network,
//! no disk.

pub mod cache;
mod core;
pub mod error;
pub mod existing;
mod facade;
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

pub use self::core::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, SWEEP_STEP};
pub use facade::Engine;
