//! A session on the cluster and what every user of one shares: the options
//! (each default defined here, once), their validation, TLS, the driver
//! session, result rows read by column name ([`rows`]) and time in CQL
//! terms (day partitions, row TTLs).
//!
//! Public on purpose, and narrow: the audit log (`audit::cql`) opens its
//! own session with the store's options and reads its rows the same way,
//! without reaching into the record store or its pending index. Nothing
//! here knows a table of idemd's.

pub mod rows;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::policies::speculative_execution::SimpleSpeculativeExecutionPolicy;
use scylla::statement::{Consistency, SerialConsistency};

use crate::store::{StoreError, StoreResult};

/// Consistency of every statement: one choice, one serial level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CqlConsistency {
    /// QUORUM writes and reads, SERIAL for Paxos (one datacenter, or
    /// linearizable across datacenters at cross-DC latency).
    #[default]
    Quorum,
    /// LOCAL_QUORUM and LOCAL_SERIAL (multi-datacenter: each DC linearizable
    /// on its own; keys must be owned by one DC's callers).
    LocalQuorum,
}

impl CqlConsistency {
    pub(super) fn regular(self) -> Consistency {
        match self {
            CqlConsistency::Quorum => Consistency::Quorum,
            CqlConsistency::LocalQuorum => Consistency::LocalQuorum,
        }
    }

    pub(super) fn serial(self) -> SerialConsistency {
        match self {
            CqlConsistency::Quorum => SerialConsistency::Serial,
            CqlConsistency::LocalQuorum => SerialConsistency::LocalSerial,
        }
    }

    /// The consistency of a read that must see in-flight Paxos rounds.
    pub(super) fn serial_read(self) -> Consistency {
        match self {
            CqlConsistency::Quorum => Consistency::Serial,
            CqlConsistency::LocalQuorum => Consistency::LocalSerial,
        }
    }
}

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct CqlOptions {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    /// Keyspace holding the tables (created by `idemd migrate`).
    pub keyspace: String,
    /// Username for password authentication.
    pub username: Option<String>,
    /// Password for password authentication.
    pub password: Option<String>,
    /// PEM CA bundle: enables TLS to the cluster.
    pub tls_ca: Option<PathBuf>,
    /// Consistency of every statement.
    pub consistency: CqlConsistency,
    /// Preferred (local) datacenter for load balancing.
    pub local_datacenter: Option<String>,
    /// Client-side timeout of each statement.
    pub request_timeout: Duration,
    /// Client-side timeout of conditional (Paxos) writes, when it should
    /// differ from `request_timeout`. When it fires, the write's outcome is
    /// resolved by a SERIAL read.
    pub lwt_timeout: Option<Duration>,
    /// The longest ttl any policy allows.
    pub max_ttl: Duration,
    /// How far behind the clock the pending index's watermark is kept
    /// (`--cql-seal-grace`; see `store::cql::pending`).
    pub seal_grace: Duration,
}

/// Default contact point.
pub const DEFAULT_NODE: &str = "127.0.0.1:9042";

/// Default keyspace.
pub const DEFAULT_KEYSPACE: &str = "idemd";

/// Default client-side timeout of each statement.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of `--cql-seal-grace`: how far behind the clock the pending
/// index's watermark is kept. Must exceed the worst clock skew between
/// replicas plus the latency of one index write (at most the request
/// timeout, 5 s by default).
pub const DEFAULT_SEAL_GRACE: Duration = Duration::from_secs(15);

/// Milliseconds in a day: the width of one partition of the audit tables
/// and of migration 1's pending index.
pub const DAY_MS: i64 = 86_400_000;

/// The day partition holding `instant_ms`.
pub fn day_of(instant_ms: i64) -> i32 {
    i32::try_from(instant_ms.div_euclid(DAY_MS)).unwrap_or(i32::MAX)
}

/// The `USING TTL` of a row that must live until `expires_at_ms`: rounded
/// up, so the row outlives it (reads hide it from then on), and never zero
/// (zero means no TTL).
pub(super) fn ttl_seconds(expires_at_ms: i64, now_ms: i64) -> i32 {
    let remaining_ms = (expires_at_ms - now_ms).max(1);
    i32::try_from((remaining_ms + 999) / 1000).unwrap_or(i32::MAX)
}

impl CqlOptions {
    /// Checks the options; the error names the flag's field
    /// (`keyspace`, `cql_nodes`, ...) and says what is wrong.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        validate_keyspace(&self.keyspace).map_err(|e| ("keyspace", e))?;
        if self.nodes.iter().all(|n| n.trim().is_empty()) {
            return Err((
                "cql_nodes",
                "at least one contact point is required".to_string(),
            ));
        }
        if self.username.is_some() != self.password.is_some() {
            return Err((
                "cql_username",
                "username and password must be given together".to_string(),
            ));
        }
        if self.request_timeout.is_zero() {
            return Err((
                "cql_request_timeout",
                "must be greater than zero".to_string(),
            ));
        }
        if self.lwt_timeout.is_some_and(|t| t.is_zero()) {
            return Err(("cql_lwt_timeout", "must be greater than zero".to_string()));
        }
        if self.seal_grace < Duration::from_secs(1) {
            return Err((
                "cql_seal_grace",
                "must be at least 1s (more than the clock skew between replicas plus one \
                 statement's latency)"
                    .to_string(),
            ));
        }
        Ok(())
    }

    /// Options for a local test cluster.
    pub fn local(keyspace: &str) -> Self {
        Self {
            nodes: vec![DEFAULT_NODE.to_string()],
            keyspace: keyspace.to_string(),
            username: None,
            password: None,
            tls_ca: None,
            consistency: CqlConsistency::Quorum,
            local_datacenter: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            lwt_timeout: None,
            // The default policy's max_ttl (`engine::Policy`); tests use it.
            max_ttl: Duration::from_secs(7 * 24 * 3600),
            seal_grace: DEFAULT_SEAL_GRACE,
        }
    }
}

pub(super) fn unavailable(context: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{context}: {error}"))
}

/// Keyspace names are interpolated into CQL: only plain identifiers.
pub fn validate_keyspace(keyspace: &str) -> Result<(), String> {
    let valid = !keyspace.is_empty()
        && keyspace.len() <= 48
        && keyspace.starts_with(|c: char| c.is_ascii_alphabetic())
        && keyspace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{keyspace:?} is not a valid keyspace name (letter, then letters, digits or '_', at most 48)"
        ))
    }
}

fn tls_config(path: &std::path::Path) -> Result<Arc<rustls::ClientConfig>, StoreError> {
    let pem = std::fs::read(path)
        .map_err(|e| unavailable(&format!("cannot read CQL CA bundle {}", path.display()), e))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| unavailable("invalid certificate in CQL CA bundle", e))?;
        roots
            .add(cert)
            .map_err(|e| unavailable("unusable certificate in CQL CA bundle", e))?;
    }
    if roots.is_empty() {
        return Err(StoreError::Unavailable(format!(
            "no certificates in CQL CA bundle {}",
            path.display()
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| unavailable("TLS configuration", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// How often each connection sends a CQL `OPTIONS` probe. A node that is
/// alive to the kernel but does not answer (a stopped process, a long GC
/// pause, a stalled VM) keeps its TCP connections open, so only a probe
/// tells it from a slow one; the driver's default (30 s) kept sending a
/// third of the requests of a 3-node cluster into such a node for the
/// whole pause (`idemd-faults`' `cql-node-pause`, docs/reliability.md).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);

/// How long a probe may go unanswered before its connection is closed and
/// the node left out of query plans until it answers a new connection.
/// Longer than any healthy answer to `OPTIONS` (no disk, no Paxos).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// When an idempotent statement (never an LWT) is sent again to another
/// node while the first has not answered: far above a healthy read's or
/// plain write's latency, so a loaded cluster is not sent double work.
pub const SPECULATIVE_AFTER: Duration = Duration::from_millis(250);

/// Connects a session with the options' consistency, timeouts, TLS and
/// credentials.
pub async fn connect(options: &CqlOptions) -> StoreResult<Session> {
    let mut policy = DefaultPolicy::builder();
    if let Some(datacenter) = &options.local_datacenter {
        policy = policy.prefer_datacenter(datacenter.clone());
    }
    let profile = ExecutionProfile::builder()
        .consistency(options.consistency.regular())
        .serial_consistency(Some(options.consistency.serial()))
        .request_timeout(Some(options.request_timeout))
        .load_balancing_policy(policy.build())
        // Only statements marked idempotent (reads and the index's plain
        // writes, see `store::cql::statements`) are ever sent twice.
        .speculative_execution_policy(Some(Arc::new(SimpleSpeculativeExecutionPolicy {
            max_retry_count: 2,
            retry_interval: SPECULATIVE_AFTER,
        })))
        .build();
    let mut builder = SessionBuilder::new()
        .known_nodes(&options.nodes)
        .connection_timeout(Duration::from_secs(5))
        .keepalive_interval(KEEPALIVE_INTERVAL)
        .keepalive_timeout(KEEPALIVE_TIMEOUT)
        .default_execution_profile_handle(profile.into_handle());
    if let (Some(user), Some(password)) = (&options.username, &options.password) {
        builder = builder.user(user.clone(), password.clone());
    }
    if let Some(ca) = &options.tls_ca {
        builder = builder.tls_context(Some(tls_config(ca)?));
    }
    builder.build().await.map_err(|e| {
        unavailable(
            &format!("cannot connect to CQL nodes {}", options.nodes.join(",")),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_covers_the_remaining_window() {
        assert_eq!(ttl_seconds(10_000, 0), 10);
        assert_eq!(ttl_seconds(10_001, 0), 11);
        assert_eq!(ttl_seconds(5, 10), 1, "never zero (zero means no TTL)");
    }
}
