//! Who is calling, and what they may do: the tenant of every request comes
//! from here.
//!
//! * With `--auth-tokens FILE`, callers send `authorization: Bearer <token>`.
//!   Each line of the file grants one token:
//!
//!   ```text
//!   TENANT SHA256_HEX_OF_TOKEN [ROLE [ENDPOINT_PREFIX, ENDPOINT_PREFIX...]]
//!   ```
//!
//!   so the server never stores a usable token (`#` starts a comment). ROLE
//!   is `service` (Claim, Complete, Fail, ExtendLease, Lookup), `reconciler`
//!   (adds ListPending, Reconcile and ListAuditEvents) or `admin`
//!   (everything). Without a role a line grants `reconciler`, which is what
//!   two-column files always granted, so old files keep working. The rest of
//!   the line after the role, if any, is a comma-separated allow-list of
//!   endpoint prefixes (`POST /v1/payments, POST /v1/refunds`); calls on
//!   other endpoints, and listings not narrowed to an allowed endpoint, get
//!   `PERMISSION_DENIED`. The file is re-read on SIGHUP and when it changes;
//!   a file that fails to parse keeps the previous table in force (and logs
//!   why), so a bad edit cannot lock every caller out.
//! * With mTLS and a client-tenants mapping (`--tls-client-tenants`, see
//!   [`client_cert`]), the caller is the mapping entry of its verified client
//!   certificate. With both a mapping and a tokens file, a call must carry
//!   both credentials, they must name the same tenant, and it gets the lesser
//!   role and only the endpoints both allow.
//! * Without either, auth is off, every caller is `admin`, and the tenant
//!   is the `x-tenant-id` metadata, or `default`. Whenever tokens or a
//!   certificate mapping are on, `x-tenant-id` is never read. Such a server
//!   answers loopback callers only unless told otherwise (protected mode,
//!   `auth/protected.rs`).
//!
//!
//! The tenant is never taken from a request field.
//!
//! The [`Authenticator`] and the tokens file are in `authenticator.rs`;
//! what a caller is and may do in `caller.rs`; protected mode in
//! `protected.rs`.
//!
//! Both files are re-read by [`crate::reload`] (on change and on SIGHUP);
//! a file that fails to parse keeps the previous table in force.

mod authenticator;
mod caller;
pub mod client_cert;
mod error;
mod protected;

pub use authenticator::{
    Authenticator, DEFAULT_TENANT, PeerCertificates, TENANT_HEADER, TokenFileError, parse_tokens,
};
pub use caller::{Action, Caller, Role};
pub use error::{ALLOW_REMOTE_FLAG, AuthError};
pub use protected::{Access, is_loopback};
