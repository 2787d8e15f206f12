//! The gRPC layer: `idemd.v1.Idempotency` and `idemd.v1.Audit` handlers.
//!
//! Each handler authenticates the caller (the tenant comes from credentials
//! only), converts the protobuf request into an engine call, and converts the
//! result back. Errors become statuses in [`status`] and nowhere else. This
//! layer never sees a storage type beyond the engine's domain records.

pub mod audit;
pub mod batch;
pub mod convert;
pub mod idempotency;
pub mod status;

pub use convert::{
    MAX_REASON_BYTES, check_key, duration, duration_ms, record_to_pb, response_from_pb,
    std_duration, system_time,
};
pub use idempotency::{HasEndpoint, IdempotencyService};
