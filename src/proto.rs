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

/// The proto3 JSON mapping of the service's messages (lowerCamelCase names,
/// `bytes` in base64, durations as `"1.5s"`, RFC 3339 timestamps, enums by
/// name), derived at run time from [`FILE_DESCRIPTOR_SET`] with
/// `prost-reflect` rather than written by hand. Used by the HTTP/JSON API
/// and by the CLI's `--output json`.
pub mod json {
    use std::sync::OnceLock;

    use prost::Message;
    use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

    /// Why a message could not be mapped.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    pub enum JsonError {
        /// The input is not the JSON form of the message.
        #[error("{0}")]
        Invalid(String),
        /// The build's descriptors lack the message (a bug, not input).
        #[error("{0}")]
        Internal(String),
    }

    fn descriptor(name: &str) -> Result<MessageDescriptor, JsonError> {
        static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
        let pool = POOL
            .get_or_init(|| {
                DescriptorPool::decode(super::FILE_DESCRIPTOR_SET).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| JsonError::Internal(format!("descriptor set: {e}")))?;
        pool.get_message_by_name(name)
            .ok_or_else(|| JsonError::Internal(format!("no descriptor for {name}")))
    }

    /// Parses `body` (empty means `{}`) as the JSON form of message `name`
    /// (e.g. `idemd.v1.ClaimRequest`).
    pub fn from_json<T: Message + Default>(name: &str, body: &[u8]) -> Result<T, JsonError> {
        let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            body
        };
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let dynamic = DynamicMessage::deserialize(descriptor(name)?, &mut deserializer)
            .map_err(|e| JsonError::Invalid(format!("not a valid {name} in JSON: {e}")))?;
        deserializer
            .end()
            .map_err(|e| JsonError::Invalid(format!("trailing data after the JSON object: {e}")))?;
        T::decode(dynamic.encode_to_vec().as_slice())
            .map_err(|e| JsonError::Invalid(format!("{name}: {e}")))
    }

    /// The JSON form of `message`, a message `name`.
    pub fn to_json<T: Message>(name: &str, message: &T) -> Result<serde_json::Value, JsonError> {
        let dynamic = DynamicMessage::decode(descriptor(name)?, message.encode_to_vec().as_slice())
            .map_err(|e| JsonError::Internal(format!("encoding {name}: {e}")))?;
        serde_json::to_value(&dynamic)
            .map_err(|e| JsonError::Internal(format!("encoding {name}: {e}")))
    }
}
