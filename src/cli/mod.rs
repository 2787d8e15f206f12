//! Operator subcommands. `idemd audit` and `idemd keys` are clients of a
//! running server: gRPC clients like any other (the embedded store has one
//! owner, and the tenant must come from credentials), sharing the
//! connection flags of [`crate::config::ConnectArgs`]. `idemd backup` asks a running
//! server through the admin socket in its data directory instead (a
//! backup is every tenant's data, not an API call); `idemd restore` and
//! `idemd copy-to-cql` need the server stopped: they work on the embedded
//! store's files themselves ([`backup`], [`copy_to_cql`]). All share the
//! exit codes of [`CliError`].

pub mod audit;
pub mod backup;
mod connection;
pub mod copy_to_cql;
mod error;
pub mod keys;

pub use audit::{audit, parse_since};
pub use connection::Connection;
pub use error::CliError;
