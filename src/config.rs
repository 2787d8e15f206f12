//! Configuration: command line and `IDEMD_*` environment for the process,
//! a TOML file for endpoint policies, validated into [`Settings`].
//!
//! Precedence, lowest first: built-in defaults → `--config` file (policies)
//! → `IDEMD_*` environment → command-line flags. Every flag has an
//! environment variable (shown by `idemd --help`). Invalid configuration is
//! refused at start with a message that names the field, e.g.
//! `endpoints."POST /v1/payments".lease: 2h exceeds ttl 1h`.
//!
//! The policy file:
//!
//! ```toml
//! [defaults]                    # applies to every endpoint
//! ttl = "24h"                   # dedup window when the Claim gives none
//! max_ttl = "7d"                # largest ttl a Claim may ask for
//! lease = "60s"                 # lease when the Claim gives none
//! max_wait = "10s"              # cap on a Claim's wait
//! max_response_bytes = 262144   # cap on a stored response
//! ignore_fields = []            # JSON Pointers dropped before fingerprinting
//! on_expired_lease = "reconcile" # or "takeover"
//! audit = false                 # append every transition to the audit log
//!
//! [endpoints."POST /v1/payments"] # overrides, inheriting from [defaults]
//! ttl = "72h"
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use crate::engine::{ExpiredLeasePolicy, Policy, PolicySet, validate};
use crate::fingerprint;
use crate::store::cql::{CqlConsistency, CqlOptions};

/// Largest `max_response_bytes` a policy may set: a stored response must fit
/// in one gRPC message with room to spare.
pub const MAX_RESPONSE_BYTES_LIMIT: usize = 4 * 1024 * 1024;

/// Longest `max_wait` a policy may set: a waiting Claim holds an RPC open.
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Default memory of the completed-record cache. Together with
/// [`DEFAULT_STORE_CACHE_BYTES`] this is most of what idemd's memory use
/// depends on: with both at their defaults a server under 1,000 concurrent
/// requests stays under 64 MiB resident (docs/benchmarks.md, P5). Replays of
/// keys that fall out of the cache are read from the store, not lost.
pub const DEFAULT_CACHE_BYTES: usize = 8 * 1024 * 1024;

/// Default page cache of the embedded store (redb's cache). Fresh keys are
/// written at random places in the B-trees, so a bigger cache mostly holds
/// pages that will not be touched again soon; the OS page cache, which is not
/// charged to idemd's resident memory, backs it.
pub const DEFAULT_STORE_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Smallest store page cache accepted: below a few hundred pages every
/// B-tree descent reads from the file.
pub const MIN_STORE_CACHE_BYTES: usize = 1024 * 1024;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// `idemd`: idempotency keys as a gRPC service.
#[derive(Debug, Parser)]
#[command(name = "idemd", version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to run; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Server flags when no subcommand is given.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands.
// Parsed once at start-up: the size difference between variants costs
// nothing, and boxing would only obscure the clap derive.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the gRPC API (the default).
    Serve(ServeArgs),
    /// Create the CQL keyspace and apply pending schema migrations.
    Migrate(MigrateArgs),
    /// Print audit events from a running server: one key's history
    /// (`--endpoint E --key K`) or the tenant's timeline (`--since 1h`).
    Audit(AuditArgs),
}

/// Flags of `idemd audit`. It is a gRPC client of a running server (the
/// embedded store has one owner, and the tenant must come from credentials
/// like any other call).
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// The server.
    #[arg(long, env = "IDEMD_TARGET", default_value = "http://127.0.0.1:50051")]
    pub target: String,
    /// Bearer token (the tenant is the token's).
    #[arg(long, env = "IDEMD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Tenant, for servers running with auth off (`x-tenant-id`).
    #[arg(long, env = "IDEMD_TENANT")]
    pub tenant: Option<String>,
    // No fallback to the system roots: idemd's certificates come from a
    // private CA (cert-manager, a mesh), and trusting every public CA would
    // accept far more than the operator meant. The client-side names differ
    // from the server's `--tls-*` flags so that `idemd audit` run in a
    // server pod never picks up the server's own `IDEMD_TLS_*` environment.
    /// PEM CA bundle that signed the server's certificate (required with an
    /// `https://` target).
    #[arg(long, env = "IDEMD_TARGET_CA")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for a server that requires mTLS (the tenant
    /// is then the certificate's; see `--tls-client-tenants`).
    #[arg(long, env = "IDEMD_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `--client-cert`.
    #[arg(long, env = "IDEMD_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// Only this endpoint (required with `--key`).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// One key's history.
    #[arg(long)]
    pub key: Option<String>,
    /// Only events since: a duration ago (`1h`, `7d`) or an RFC 3339
    /// instant (`2026-12-01T00:00:00Z`).
    #[arg(long)]
    pub since: Option<String>,
    /// Stop after this many events.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Which backend holds the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum StoreKind {
    /// One durable file in `--data-dir`; a single replica.
    #[default]
    Embedded,
    /// ScyllaDB or Cassandra (`--cql-nodes`); any number of replicas.
    Cql,
}

/// Connection flags of the CQL backend (shared by `serve` and `migrate`).
#[derive(Debug, Clone, Args)]
pub struct CqlArgs {
    /// CQL contact points, comma-separated `host:port`.
    #[arg(
        long,
        env = "IDEMD_CQL_NODES",
        value_delimiter = ',',
        default_value = "127.0.0.1:9042"
    )]
    pub cql_nodes: Vec<String>,
    /// Keyspace of idemd's tables.
    #[arg(long, env = "IDEMD_KEYSPACE", default_value = "idemd")]
    pub keyspace: String,
    /// Username (password authentication).
    #[arg(long, env = "IDEMD_CQL_USERNAME")]
    pub cql_username: Option<String>,
    /// Password (password authentication); prefer the environment variable.
    #[arg(long, env = "IDEMD_CQL_PASSWORD", hide_env_values = true)]
    pub cql_password: Option<String>,
    /// PEM CA bundle; enables TLS to the cluster.
    #[arg(long, env = "IDEMD_CQL_TLS_CA")]
    pub cql_tls_ca: Option<PathBuf>,
    /// Consistency: `quorum` (QUORUM + SERIAL) or `local-quorum`
    /// (LOCAL_QUORUM + LOCAL_SERIAL, multi-datacenter).
    #[arg(long, env = "IDEMD_CQL_CONSISTENCY", value_enum, default_value_t = CqlConsistency::Quorum)]
    pub cql_consistency: CqlConsistency,
    /// Local datacenter (preferred for routing; use with local-quorum).
    #[arg(long, env = "IDEMD_CQL_LOCAL_DC")]
    pub cql_local_dc: Option<String>,
    /// Client-side timeout of each CQL statement.
    #[arg(long, env = "IDEMD_CQL_REQUEST_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub cql_request_timeout: Duration,
    /// Client-side timeout of conditional (Paxos) writes; defaults to
    /// `--cql-request-timeout`. A write that times out is resolved with a
    /// SERIAL read, never guessed.
    #[arg(long, env = "IDEMD_CQL_LWT_TIMEOUT", value_parser = humantime::parse_duration)]
    pub cql_lwt_timeout: Option<Duration>,
}

impl CqlArgs {
    /// Connection options, with `max_ttl` the longest ttl of any policy.
    pub fn options(&self, max_ttl: Duration) -> Result<CqlOptions, ConfigError> {
        crate::store::cql::validate_keyspace(&self.keyspace)
            .map_err(|e| ConfigError::new("keyspace", e))?;
        if self.cql_nodes.iter().all(|n| n.trim().is_empty()) {
            return Err(ConfigError::new(
                "cql_nodes",
                "at least one contact point is required",
            ));
        }
        if self.cql_username.is_some() != self.cql_password.is_some() {
            return Err(ConfigError::new(
                "cql_username",
                "username and password must be given together",
            ));
        }
        if self.cql_request_timeout.is_zero() || self.cql_lwt_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::new(
                "cql_request_timeout",
                "must be greater than zero",
            ));
        }
        Ok(CqlOptions {
            nodes: self
                .cql_nodes
                .iter()
                .map(|n| n.trim().to_string())
                .collect(),
            keyspace: self.keyspace.clone(),
            username: self.cql_username.clone(),
            password: self.cql_password.clone(),
            tls_ca: self.cql_tls_ca.clone(),
            consistency: self.cql_consistency,
            local_datacenter: self.cql_local_dc.clone(),
            request_timeout: self.cql_request_timeout,
            lwt_timeout: self.cql_lwt_timeout,
            max_ttl,
        })
    }
}

/// Flags of `idemd migrate`.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// Connection flags.
    #[command(flatten)]
    pub cql: CqlArgs,
    /// Replication of the keyspace when it is created, as a CQL map. Use
    /// `{'class': 'NetworkTopologyStrategy', 'dc1': 3}` in production.
    #[arg(
        long,
        env = "IDEMD_REPLICATION",
        default_value = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )]
    pub replication: String,
    /// Log format.
    #[arg(long, env = "IDEMD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

/// Flags of `idemd serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where records live.
    #[arg(long, env = "IDEMD_STORE", value_enum, default_value_t = StoreKind::Embedded)]
    pub store: StoreKind,
    /// CQL connection flags (with `--store cql`).
    #[command(flatten)]
    pub cql: CqlArgs,
    /// gRPC listen address.
    #[arg(long, env = "IDEMD_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
    /// Directory of the embedded store's database file.
    #[arg(long, env = "IDEMD_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// Tokens file (`TENANT SHA256_HEX_OF_TOKEN [ROLE [ENDPOINT_PREFIX, ...]]`
    /// per line, see the `auth` module). Without it auth
    /// is off and the tenant comes from `x-tenant-id`.
    #[arg(long, env = "IDEMD_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,
    /// TOML file with default and per-endpoint policies.
    #[arg(long, env = "IDEMD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "IDEMD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,idemd=debug`).
    #[arg(long, env = "IDEMD_LOG", default_value = "info")]
    pub log: String,
    /// Longest time in-flight RPCs get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "IDEMD_DRAIN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// How often expired records are swept from the embedded store.
    #[arg(long, env = "IDEMD_SWEEP_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,
    /// Memory for cached completed records (replays), in bytes.
    #[arg(long, env = "IDEMD_CACHE_BYTES", default_value_t = DEFAULT_CACHE_BYTES)]
    pub cache_bytes: usize,
    /// Page cache of the embedded store's database file, in bytes.
    #[arg(long, env = "IDEMD_STORE_CACHE_BYTES", default_value_t = DEFAULT_STORE_CACHE_BYTES)]
    pub store_cache_bytes: usize,
    /// Prometheus `/metrics` address (separate from the gRPC port); `off`
    /// disables the exporter.
    #[arg(long, env = "IDEMD_METRICS_LISTEN", default_value = "0.0.0.0:9464")]
    pub metrics_listen: String,
    /// Distinct tenant label values in metrics before `_other`.
    #[arg(long, env = "IDEMD_METRICS_MAX_TENANTS", default_value_t = 100)]
    pub metrics_max_tenants: usize,
    /// Distinct endpoint label values in metrics before `_other`.
    #[arg(long, env = "IDEMD_METRICS_MAX_ENDPOINTS", default_value_t = 100)]
    pub metrics_max_endpoints: usize,
    /// How long audit events are kept (endpoints with `audit = true`),
    /// independently of the keys' ttl.
    #[arg(long, env = "IDEMD_AUDIT_RETENTION", default_value = "30d", value_parser = humantime::parse_duration)]
    pub audit_retention: Duration,
    /// PEM certificate chain of the gRPC port: turns TLS on (with
    /// `--tls-key`). Reloaded when the file changes.
    #[arg(long, env = "IDEMD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "IDEMD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: requires and verifies client certificates (mTLS).
    #[arg(long, env = "IDEMD_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// With mTLS: file mapping client-certificate SANs (SPIFFE URI or DNS
    /// name) to tenants and roles (see `docs/security.md`).
    #[arg(long, env = "IDEMD_TLS_CLIENT_TENANTS", requires = "tls_client_ca")]
    pub tls_client_tenants: Option<PathBuf>,
    /// Keyring file for encryption at rest of stored responses (AES-256-GCM;
    /// `KEY_ID BASE64_32_BYTES` per line, the last line encrypts). Without
    /// it responses are stored in clear.
    #[arg(long, env = "IDEMD_ENCRYPTION_KEYS")]
    pub encryption_keys: Option<PathBuf>,
    /// New keys (Claims that create a record) per second per tenant; 0
    /// disables the limit.
    #[arg(long, env = "IDEMD_CLAIM_RATE", default_value_t = 10_000.0)]
    pub claim_rate: f64,
    /// Burst of new keys per tenant above `--claim-rate`.
    #[arg(long, env = "IDEMD_CLAIM_BURST", default_value_t = 20_000)]
    pub claim_burst: u32,
    /// RPCs in progress at once before new ones are shed with
    /// RESOURCE_EXHAUSTED; 0 disables the limit.
    #[arg(long, env = "IDEMD_MAX_IN_FLIGHT", default_value_t = 10_000)]
    pub max_in_flight: usize,
}

/// TLS of the gRPC port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// CA bundle for client certificates (mTLS); `None` = server TLS only.
    pub client_ca: Option<PathBuf>,
    /// SAN → tenant mapping for mTLS callers.
    pub client_tenants: Option<PathBuf>,
}

/// Admission limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitSettings {
    /// New keys per second per tenant; 0 = unlimited.
    pub claim_rate: f64,
    /// Bucket size of the per-tenant new-key limit.
    pub claim_burst: u32,
    /// RPCs in progress before shedding; 0 = unlimited.
    pub max_in_flight: usize,
}

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            claim_rate: 10_000.0,
            claim_burst: 20_000,
            max_in_flight: 10_000,
        }
    }
}

/// A configuration problem, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {description}")]
pub struct ConfigError {
    /// Path of the offending setting.
    pub field: String,
    /// What is wrong.
    pub description: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// The store a server runs on.
#[derive(Debug, Clone)]
pub enum StoreSettings {
    /// The embedded file store in `Settings::data_dir`.
    Embedded,
    /// A CQL cluster.
    Cql(CqlOptions),
}

/// Validated settings of the server.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where records live.
    pub store: StoreSettings,
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// Embedded store directory.
    pub data_dir: PathBuf,
    /// Tokens file; `None` = auth off.
    pub auth_tokens: Option<PathBuf>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log: String,
    /// Drain bound on shutdown.
    pub drain_timeout: Duration,
    /// Sweeper period.
    pub sweep_interval: Duration,
    /// Completed-record cache size.
    pub cache_bytes: usize,
    /// Embedded store page cache size.
    pub store_cache_bytes: usize,
    /// Endpoint policies.
    pub policies: PolicySet,
    /// Prometheus exporter address; `None` disables it.
    pub metrics_listen: Option<SocketAddr>,
    /// Label cardinality caps (tenants, endpoints).
    pub metrics_label_caps: (usize, usize),
    /// How long audit events are kept.
    pub audit_retention: Duration,
    /// TLS of the gRPC port; `None` = plaintext.
    pub tls: Option<TlsSettings>,
    /// Keyring for encryption at rest; `None` = responses stored in clear.
    pub encryption_keys: Option<PathBuf>,
    /// Rate and concurrency limits.
    pub limits: LimitSettings,
}

impl Settings {
    /// Settings for tests and embedding: defaults, given data dir.
    pub fn for_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            store: StoreSettings::Embedded,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: data_dir.into(),
            auth_tokens: None,
            log_format: LogFormat::Human,
            log: "info".to_string(),
            drain_timeout: Duration::from_secs(20),
            sweep_interval: Duration::from_secs(30),
            cache_bytes: DEFAULT_CACHE_BYTES,
            store_cache_bytes: DEFAULT_STORE_CACHE_BYTES,
            policies: PolicySet::default(),
            metrics_listen: None,
            metrics_label_caps: (100, 100),
            audit_retention: crate::audit::DEFAULT_RETENTION,
            tls: None,
            encryption_keys: None,
            limits: LimitSettings::default(),
        }
    }

    /// Builds and validates settings from parsed flags.
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        let policies = match &args.config {
            Some(path) => load_policies(path)?,
            None => PolicySet::default(),
        };
        let max_ttl = policies
            .endpoints
            .values()
            .map(|p| p.max_ttl)
            .chain([policies.default.max_ttl])
            .max()
            .unwrap_or_default();
        let store = match args.store {
            StoreKind::Embedded => StoreSettings::Embedded,
            StoreKind::Cql => StoreSettings::Cql(args.cql.options(max_ttl)?),
        };
        let settings = Self {
            store,
            listen: args.listen,
            data_dir: args.data_dir.clone(),
            auth_tokens: args.auth_tokens.clone(),
            log_format: args.log_format,
            log: args.log.clone(),
            drain_timeout: args.drain_timeout,
            sweep_interval: args.sweep_interval,
            cache_bytes: args.cache_bytes,
            store_cache_bytes: args.store_cache_bytes,
            policies,
            metrics_listen: match args.metrics_listen.trim() {
                "off" | "" => None,
                address => Some(address.parse().map_err(|e| {
                    ConfigError::new("metrics_listen", format!("{address:?}: {e}"))
                })?),
            },
            metrics_label_caps: (args.metrics_max_tenants, args.metrics_max_endpoints),
            audit_retention: args.audit_retention,
            tls: match (&args.tls_cert, &args.tls_key) {
                (Some(cert), Some(key)) => Some(TlsSettings {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: args.tls_client_ca.clone(),
                    client_tenants: args.tls_client_tenants.clone(),
                }),
                _ => None,
            },
            encryption_keys: args.encryption_keys.clone(),
            limits: LimitSettings {
                claim_rate: args.claim_rate,
                claim_burst: args.claim_burst,
                max_in_flight: args.max_in_flight,
            },
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Checks every setting; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sweep_interval.is_zero() {
            return Err(ConfigError::new(
                "sweep_interval",
                "must be greater than zero",
            ));
        }
        if self.store_cache_bytes < MIN_STORE_CACHE_BYTES {
            return Err(ConfigError::new(
                "store_cache_bytes",
                format!("must be at least {MIN_STORE_CACHE_BYTES} (1 MiB)"),
            ));
        }
        if self.audit_retention < Duration::from_secs(1) {
            return Err(ConfigError::new("audit_retention", "must be at least 1s"));
        }
        if !self.limits.claim_rate.is_finite() || self.limits.claim_rate < 0.0 {
            return Err(ConfigError::new(
                "claim_rate",
                "must be a non-negative number (0 disables the limit)",
            ));
        }
        if self.limits.claim_rate > 0.0 && self.limits.claim_burst == 0 {
            return Err(ConfigError::new(
                "claim_burst",
                "must be at least 1 when claim_rate is set",
            ));
        }
        validate_policy("defaults", &self.policies.default)?;
        for (endpoint, policy) in &self.policies.endpoints {
            let field = format!("endpoints.{endpoint:?}");
            validate::endpoint(endpoint)
                .map_err(|e| ConfigError::new(field.clone(), e.to_string()))?;
            validate_policy(&field, policy)?;
        }
        Ok(())
    }
}

fn validate_policy(prefix: &str, policy: &Policy) -> Result<(), ConfigError> {
    let field = |name: &str| format!("{prefix}.{name}");
    let show = |d: Duration| humantime::format_duration(d).to_string();
    for (name, value) in [
        ("ttl", policy.ttl),
        ("max_ttl", policy.max_ttl),
        ("lease", policy.lease),
    ] {
        if value < Duration::from_millis(1) {
            return Err(ConfigError::new(field(name), "must be at least 1ms"));
        }
    }
    if policy.ttl > policy.max_ttl {
        return Err(ConfigError::new(
            field("ttl"),
            format!(
                "{} exceeds max_ttl {}",
                show(policy.ttl),
                show(policy.max_ttl)
            ),
        ));
    }
    if policy.lease > policy.ttl {
        return Err(ConfigError::new(
            field("lease"),
            format!("{} exceeds ttl {}", show(policy.lease), show(policy.ttl)),
        ));
    }
    if policy.max_wait > MAX_WAIT_LIMIT {
        return Err(ConfigError::new(
            field("max_wait"),
            format!("at most {}", show(MAX_WAIT_LIMIT)),
        ));
    }
    if policy.max_response_bytes == 0 || policy.max_response_bytes > MAX_RESPONSE_BYTES_LIMIT {
        return Err(ConfigError::new(
            field("max_response_bytes"),
            format!("must be between 1 and {MAX_RESPONSE_BYTES_LIMIT}"),
        ));
    }
    let pointers: Vec<&str> = policy.ignore_fields.iter().map(String::as_str).collect();
    fingerprint::parse_ignore_fields(&pointers)
        .map_err(|e| ConfigError::new(field("ignore_fields"), e.to_string()))?;
    Ok(())
}

/// One policy table of the file; absent fields inherit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default, with = "humantime_serde")]
    ttl: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    max_ttl: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    lease: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    max_wait: Option<Duration>,
    max_response_bytes: Option<usize>,
    ignore_fields: Option<Vec<String>>,
    on_expired_lease: Option<ExpiredLeasePolicy>,
    audit: Option<bool>,
}

impl PolicyFile {
    fn over(&self, base: &Policy) -> Policy {
        Policy {
            ttl: self.ttl.unwrap_or(base.ttl),
            max_ttl: self.max_ttl.unwrap_or(base.max_ttl),
            lease: self.lease.unwrap_or(base.lease),
            max_wait: self.max_wait.unwrap_or(base.max_wait),
            max_response_bytes: self.max_response_bytes.unwrap_or(base.max_response_bytes),
            ignore_fields: self
                .ignore_fields
                .clone()
                .unwrap_or_else(|| base.ignore_fields.clone()),
            on_expired_lease: self.on_expired_lease.unwrap_or(base.on_expired_lease),
            audit: self.audit.unwrap_or(base.audit),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    defaults: PolicyFile,
    #[serde(default)]
    endpoints: HashMap<String, PolicyFile>,
}

/// Parses policy TOML text.
pub fn parse_policies(text: &str) -> Result<PolicySet, ConfigError> {
    let file: ConfigFile = toml::from_str(text)
        .map_err(|e| ConfigError::new("config", e.to_string().trim_end().replace('\n', " ")))?;
    let default = file.defaults.over(&Policy::default());
    let endpoints = file
        .endpoints
        .iter()
        .map(|(name, policy)| (name.clone(), policy.over(&default)))
        .collect();
    Ok(PolicySet { default, endpoints })
}

fn load_policies(path: &Path) -> Result<PolicySet, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("config", format!("cannot read {}: {e}", path.display())))?;
    parse_policies(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_with(text: &str) -> Result<Settings, ConfigError> {
        let mut settings = Settings::for_data_dir("unused");
        settings.policies = parse_policies(text)?;
        settings.validate()?;
        Ok(settings)
    }

    #[test]
    fn endpoints_inherit_defaults() {
        let settings = settings_with(
            "[defaults]\nlease = \"30s\"\n[endpoints.\"POST /v1/payments\"]\nttl = \"72h\"\non_expired_lease = \"takeover\"\n",
        )
        .expect("valid");
        let policy = settings.policies.for_endpoint("POST /v1/payments");
        assert_eq!(policy.ttl, Duration::from_secs(72 * 3600));
        assert_eq!(policy.lease, Duration::from_secs(30));
        assert_eq!(policy.on_expired_lease, ExpiredLeasePolicy::Takeover);
        assert_eq!(
            settings.policies.for_endpoint("other").lease,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn errors_name_the_field() {
        let err = settings_with("[endpoints.\"POST /x\"]\nttl = \"1h\"\nlease = \"2h\"\n")
            .expect_err("lease > ttl");
        assert_eq!(err.field, "endpoints.\"POST /x\".lease");
        let err = settings_with("[defaults]\nttl = \"30d\"\n").expect_err("ttl > max");
        assert_eq!(err.field, "defaults.ttl");
        let err = settings_with("[defaults]\nignore_fields = [\"nope\"]\n").expect_err("pointer");
        assert_eq!(err.field, "defaults.ignore_fields");
        let err = settings_with("[defaults]\nleese = \"1s\"\n").expect_err("typo");
        assert!(err.description.contains("leese"), "{err}");
        let err = settings_with("[defaults]\nmax_response_bytes = 0\n").expect_err("zero");
        assert_eq!(err.field, "defaults.max_response_bytes");
    }

    #[test]
    fn store_cache_has_a_floor() {
        let mut settings = Settings::for_data_dir("unused");
        settings.store_cache_bytes = MIN_STORE_CACHE_BYTES - 1;
        let err = settings.validate().expect_err("below the floor");
        assert_eq!(err.field, "store_cache_bytes");
        settings.store_cache_bytes = MIN_STORE_CACHE_BYTES;
        settings.validate().expect("at the floor");
    }
}
