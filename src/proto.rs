//! Generated protobuf and gRPC code for `proto/idemd/v1/idempotency.proto`.
//!
//! Kept in its own module so that the rest of the crate refers to wire types
//! by one path (`proto::v1::...`) and lints on generated code stay local.

/// The `idemd.v1` package.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("idemd.v1");
}

/// Encoded `FileDescriptorSet` of the service, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("idemd_descriptor");
