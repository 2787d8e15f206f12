//! [`AuthError`]: why a caller was not authenticated, in words that name
//! what to fix.

use std::net::SocketAddr;

/// The flag that lets a server with auth off answer remote callers; named
/// by every protected-mode refusal.
pub const ALLOW_REMOTE_FLAG: &str = "--allow-unauthenticated-remote";

/// Why a caller was not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer` metadata.
    #[error("missing credentials: send 'authorization: Bearer <token>'")]
    Missing,
    /// The token is not in the tokens file.
    #[error("unknown token")]
    Unknown,
    /// Auth is off and the `x-tenant-id` value is not a valid tenant.
    #[error("invalid x-tenant-id: {0}")]
    BadTenantHeader(String),
    /// The token's role does not include this RPC.
    #[error("the token's role ({role}) does not allow this call")]
    RoleNotAllowed {
        /// The caller's role.
        role: &'static str,
    },
    /// The token's endpoint allow-list does not include this endpoint (or
    /// the listing is not narrowed to one endpoint).
    #[error("the token is not allowed on this endpoint (name an endpoint it is allowed on)")]
    EndpointNotAllowed,
    /// mTLS tenants are on and the connection has no client certificate.
    #[error("missing credentials: a client certificate is required")]
    MissingCertificate,
    /// The client certificate cannot be read.
    #[error("{0}")]
    BadCertificate(String),
    /// No SAN of the client certificate is in the client-tenants mapping.
    #[error("the client certificate maps to no tenant")]
    UnmappedCertificate,
    /// The client certificate's SANs map to different grants.
    #[error("the client certificate's names map to different tenants or roles")]
    AmbiguousCertificate,
    /// The token and the client certificate name different tenants.
    #[error("the token and the client certificate belong to different tenants")]
    TenantMismatch,
    /// Auth is off and the caller is not on the server's machine
    /// (protected mode).
    #[error(
        "authentication is off and this server answers loopback callers only (protected mode); {who} is not loopback: configure --auth-tokens or --tls-client-tenants, or start idemd with {ALLOW_REMOTE_FLAG} (IDEMD_ALLOW_UNAUTHENTICATED_REMOTE=true) if unauthenticated remote callers are intended",
        who = describe_peer(.peer)
    )]
    RemoteWithoutAuthentication {
        /// The caller's address, when known.
        peer: Option<SocketAddr>,
    },
}

/// A caller's address in a refusal (the port says nothing to the reader).
fn describe_peer(peer: &Option<SocketAddr>) -> String {
    match peer {
        Some(peer) => format!("caller {}", peer.ip()),
        None => "a caller of unknown address".to_string(),
    }
}
