//! The one error type of every store method. Backends never build a
//! `tonic::Status`: they say whether nothing was applied ([`StoreError::Unavailable`])
//! or the outcome is unknown ([`StoreError::Uncertain`]), and the API maps each kind
//! in one place (`api::status`).

/// What went wrong in a store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or refused the operation; nothing was
    /// applied. Safe to retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write may or may not have been applied and a read could not tell
    /// which. Never reported as success or as failure.
    #[error("store write outcome unknown: {0}")]
    Uncertain(String),
    /// A page token that this backend did not issue.
    #[error("invalid page token")]
    InvalidPageToken,
    /// Stored data could not be decoded.
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    /// A stored response is encrypted and cannot be decrypted with the
    /// configured keyring (missing key id, wrong key material, or a value
    /// moved from another record); see [`crate::crypto`]. The message names
    /// the key id and never carries key material or plaintext.
    #[error("stored response cannot be decrypted: {0}")]
    Undecryptable(String),
    /// The store is shutting down.
    #[error("store is closed")]
    Closed,
}
