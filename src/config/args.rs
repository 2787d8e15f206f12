//! The command line: every subcommand and flag, with its `IDEMD_*`
//! variable and its default (a constant of [`super`] or of the module it
//! configures).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::defaults::{
    DEFAULT_ALLOW_UNAUTHENTICATED_REMOTE, DEFAULT_CACHE_BYTES, DEFAULT_CLAIM_BURST,
    DEFAULT_CLAIM_RATE, DEFAULT_DATA_DIR, DEFAULT_DRAIN_TIMEOUT, DEFAULT_LISTEN, DEFAULT_LOG,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_METRICS_LISTEN, DEFAULT_METRICS_MAX_LABELS,
    DEFAULT_PROXY_LISTEN, DEFAULT_SWEEP_INTERVAL,
};
use super::error::ConfigError;
use crate::store::cql::{self, CqlConsistency, CqlOptions};
use crate::store::embedded;

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
    /// Serve an HTTP service through idemd: requests with an
    /// `Idempotency-Key` run once upstream and their answers are replayed.
    Proxy(ProxyArgs),
    /// Create the CQL keyspace and apply pending schema migrations.
    Migrate(MigrateArgs),
    /// Print audit events from a running server: one key's history
    /// (`--endpoint E --key K`) or the tenant's timeline (`--since 1h`).
    Audit(AuditArgs),
    /// Find and resolve stuck keys on a running server: `pending`, `get`,
    /// `reconcile`, `release`, `extend` (exit codes: 1 not found, 3
    /// refused, 4 transport or server error, 5 not confirmed).
    Keys(KeysArgs),
    /// Back up the embedded store of a running idemd without stopping it
    /// (through the admin socket in its data directory).
    Backup(BackupArgs),
    /// Check a backup and restore it into a data directory (idemd stopped).
    Restore(RestoreArgs),
    /// Copy every live record of a stopped embedded store into a CQL
    /// keyspace, as it is (state, lease, fingerprint, response, remaining
    /// ttl): the move to ScyllaDB (docs/deploy.md). Safe to run again
    /// (exit codes: 2 configuration or idemd still running, 3 the target
    /// holds different records, 4 a store failed).
    CopyToCql(CopyToCqlArgs),
}

/// How the client subcommands (`idemd audit`, `idemd keys`) reach a
/// running server. They are gRPC clients like any other: the embedded
/// store has one owner, and the tenant must come from credentials.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// The server.
    #[arg(
        long,
        env = "IDEMD_TARGET",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub target: String,
    /// Bearer token (the tenant is the token's).
    #[arg(long, env = "IDEMD_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Tenant, for servers running with auth off (`x-tenant-id`).
    #[arg(long, env = "IDEMD_TENANT", global = true)]
    pub tenant: Option<String>,
    // No fallback to the system roots: idemd's certificates come from a
    // private CA (cert-manager, a mesh), and trusting every public CA would
    // accept far more than the operator meant. The client-side names differ
    // from the server's `--tls-*` flags so that a client run in a server pod
    // never picks up the server's own `IDEMD_TLS_*` environment.
    /// PEM CA bundle that signed the server's certificate (required with an
    /// `https://` target).
    #[arg(long, env = "IDEMD_TARGET_CA", global = true)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for a server that requires mTLS (the tenant
    /// is then the certificate's; see `--tls-client-tenants`).
    #[arg(
        long,
        env = "IDEMD_CLIENT_CERT",
        requires = "client_key",
        global = true
    )]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `--client-cert`.
    #[arg(
        long,
        env = "IDEMD_CLIENT_KEY",
        requires = "client_cert",
        global = true
    )]
    pub client_key: Option<PathBuf>,
}

/// Flags of `idemd audit`.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// How to reach the server.
    #[command(flatten)]
    pub connect: ConnectArgs,
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

/// Output of `idemd keys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    /// An aligned table for people.
    #[default]
    Table,
    /// One JSON object per line (the proto3 JSON form), for scripts.
    Json,
}

/// Flags of `idemd keys`.
#[derive(Debug, Clone, Args)]
pub struct KeysArgs {
    /// How to reach the server.
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// `table` (default) or `json` (one object per line).
    #[arg(long, value_enum, default_value_t = OutputFormat::Table, global = true)]
    pub output: OutputFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// One key, named by its endpoint and key.
#[derive(Debug, Clone, Args)]
pub struct KeyRef {
    /// The key's endpoint (`POST /v1/payments`).
    #[arg(long)]
    pub endpoint: String,
    /// The idempotency key.
    #[arg(long)]
    pub key: String,
}

/// The verdict of `idemd keys reconcile`: exactly one.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false, id = "verdict")]
pub struct VerdictArgs {
    /// The operation committed: record this HTTP status as its response
    /// (with `--committed-body-file` and `--header`).
    #[arg(long, group = "verdict")]
    pub committed_status: Option<u16>,
    /// It never ran: release the key so a retry runs it.
    #[arg(long, group = "verdict")]
    pub released: bool,
    /// It failed for good: keep the key FAILED with this reason.
    #[arg(long, group = "verdict", value_name = "REASON")]
    pub failed: Option<String>,
    /// Take the key over to finish it yourself: prints a lease token.
    #[arg(long, group = "verdict")]
    pub takeover: bool,
}

/// `idemd keys` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum KeysCommand {
    /// Keys that need a decision: claims past their lease, unknown and
    /// failed outcomes (ListPending), oldest first.
    Pending {
        /// Only this endpoint.
        #[arg(long)]
        endpoint: Option<String>,
        /// Only keys claimed at least this long ago (`10m`).
        #[arg(long)]
        older_than: Option<humantime::Duration>,
        /// Stop after this many keys.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One key's record (Lookup).
    Get {
        /// The key.
        #[command(flatten)]
        key: KeyRef,
        /// Include the stored response.
        #[arg(long)]
        with_response: bool,
    },
    /// Record a verdict on a pending key (Reconcile).
    Reconcile {
        /// The key.
        #[command(flatten)]
        key: KeyRef,
        /// The verdict.
        #[command(flatten)]
        verdict: VerdictArgs,
        /// With `--committed-status`: the response body, from a file.
        #[arg(long, requires = "committed_status")]
        committed_body_file: Option<PathBuf>,
        /// With `--committed-status`: a response header `NAME: VALUE`
        /// (repeatable).
        #[arg(long = "header", requires = "committed_status")]
        headers: Vec<String>,
        /// With `--takeover`: the lease to take (default: the endpoint's).
        #[arg(long, requires = "takeover")]
        lease: Option<humantime::Duration>,
        /// Do not ask for confirmation on a terminal.
        #[arg(long)]
        yes: bool,
    },
    /// Release a pending key that never ran, so a retry runs it (the same
    /// as `reconcile --released`).
    Release {
        /// The key.
        #[command(flatten)]
        key: KeyRef,
        /// Do not ask for confirmation on a terminal.
        #[arg(long)]
        yes: bool,
    },
    /// Extend the lease of a claim you hold (e.g. after `reconcile
    /// --takeover`), with its lease token (ExtendLease).
    Extend {
        /// The key.
        #[command(flatten)]
        key: KeyRef,
        /// The lease token of the claim.
        #[arg(long)]
        lease_token: String,
        /// The new lease (default: the endpoint's).
        #[arg(long)]
        lease: Option<humantime::Duration>,
    },
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
        default_value = cql::DEFAULT_NODE
    )]
    pub cql_nodes: Vec<String>,
    /// Keyspace of idemd's tables.
    #[arg(long, env = "IDEMD_KEYSPACE", default_value = cql::DEFAULT_KEYSPACE)]
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
    #[arg(long, env = "IDEMD_CQL_REQUEST_TIMEOUT", default_value_t = cql::DEFAULT_REQUEST_TIMEOUT.into())]
    pub cql_request_timeout: humantime::Duration,
    /// Client-side timeout of conditional (Paxos) writes; defaults to
    /// `--cql-request-timeout`. A write that times out is resolved with a
    /// SERIAL read, never guessed.
    #[arg(long, env = "IDEMD_CQL_LWT_TIMEOUT")]
    pub cql_lwt_timeout: Option<humantime::Duration>,
    /// How far behind the clock the pending index is sealed. Must exceed
    /// the worst clock skew between idemd replicas plus one statement's
    /// latency (docs/scylla.md, "The pending index").
    #[arg(long, env = "IDEMD_CQL_SEAL_GRACE", default_value_t = cql::DEFAULT_SEAL_GRACE.into())]
    pub cql_seal_grace: humantime::Duration,
}

impl CqlArgs {
    /// Connection options, with `max_ttl` the longest ttl of any policy.
    pub fn options(&self, max_ttl: Duration) -> Result<CqlOptions, ConfigError> {
        let options = CqlOptions {
            nodes: self
                .cql_nodes
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            keyspace: self.keyspace.clone(),
            username: self.cql_username.clone(),
            password: self.cql_password.clone(),
            tls_ca: self.cql_tls_ca.clone(),
            consistency: self.cql_consistency,
            local_datacenter: self.cql_local_dc.clone(),
            request_timeout: self.cql_request_timeout.into(),
            lwt_timeout: self.cql_lwt_timeout.map(Into::into),
            max_ttl,
            seal_grace: self.cql_seal_grace.into(),
        };
        options
            .validate()
            .map_err(|(field, description)| ConfigError::new(field, description))?;
        Ok(options)
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

/// Flags of `idemd backup`.
#[derive(Debug, Clone, Args)]
pub struct BackupArgs {
    /// Data directory of the running idemd (its admin socket is there).
    #[arg(long, env = "IDEMD_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// New directory the backup is written to, by the server process (so
    /// on its file system, with its permissions).
    #[arg(long)]
    pub to: PathBuf,
}

/// Flags of `idemd restore`.
#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// The backup (a directory `idemd backup` wrote).
    #[arg(long)]
    pub from: PathBuf,
    /// Data directory to restore into; idemd must not be running on it.
    #[arg(long, env = "IDEMD_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Replace the store the data directory holds (its files are moved to
    /// a `replaced-<time>` directory there, not deleted).
    #[arg(long)]
    pub replace: bool,
}

/// Flags of `idemd copy-to-cql`: the source's data directory and the
/// target's flags, named and read from the environment as `idemd serve`
/// names them, so the new deployment's environment configures the target
/// exactly as `--store cql` would.
#[derive(Debug, Clone, Args)]
pub struct CopyToCqlArgs {
    /// The embedded store to copy (idemd stopped).
    #[arg(long, env = "IDEMD_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Page cache of the embedded store's database file, in bytes.
    #[arg(long, env = "IDEMD_STORE_CACHE_BYTES", default_value_t = embedded::DEFAULT_CACHE_BYTES)]
    pub store_cache_bytes: usize,
    /// The target cluster.
    #[command(flatten)]
    pub cql: CqlArgs,
    /// Keyring file (`--encryption-keys` of `idemd serve`): opens the
    /// responses the embedded store sealed and seals them in the cluster.
    /// The new deployment must use the same keyring.
    #[arg(long, env = "IDEMD_ENCRYPTION_KEYS")]
    pub encryption_keys: Option<PathBuf>,
    /// TOML policy file of `idemd serve` (the longest ttl of its policies
    /// bounds what the pending index keeps).
    #[arg(long, env = "IDEMD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Records written at once.
    #[arg(long, default_value_t = crate::store::transfer::DEFAULT_IN_FLIGHT)]
    pub in_flight: usize,
    /// The short cut-over's first step: copy the bulk from this backup
    /// (`idemd backup`, taken while idemd serves) and nothing else: the
    /// data directory is not read, its idemd keeps serving, and nothing is
    /// marked as moved. Then stop idemd and copy the rest with
    /// `--since-backup` and the same backup. With `--since-backup` too, a
    /// catch-up (still while idemd serves): only what changed between the
    /// two backups is written, and the stop then copies what changed since
    /// the later one.
    #[arg(long)]
    pub from_backup: Option<PathBuf>,
    /// The backup the keyspace holds (the last `--from-backup` copied
    /// into it). Alone, the short cut-over's last step (idemd stopped):
    /// only what changed in the data directory since it is written, so the
    /// stop lasts as long as the changes, not the store.
    #[arg(long)]
    pub since_backup: Option<PathBuf>,
    /// Added to the lease of every key IN_PROGRESS when idemd stopped,
    /// beyond the time it has been stopped: covers the wait from the end of
    /// the copy to the first replica serving on the cluster (a takeover
    /// must never happen because idemd was being moved).
    #[arg(long, default_value = crate::store::transfer::DEFAULT_LEASE_GRACE)]
    pub lease_grace: humantime::Duration,
    /// Log format.
    #[arg(long, env = "IDEMD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

/// Flags of `idemd serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, env = "IDEMD_LISTEN", default_value_t = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// The gRPC API over HTTP/JSON (`POST /v1/claim`, ...); `off` (the
    /// default) disables it. Same auth and TLS as the gRPC port.
    #[arg(long, env = "IDEMD_HTTP_LISTEN", default_value = "off")]
    pub http_listen: String,
    /// Store, auth, TLS, policy, limit, metrics and log flags.
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags of `idemd proxy`: the sidecar's own, then every flag of `serve`
/// but its listen addresses.
#[derive(Debug, Clone, Args)]
pub struct ProxyArgs {
    /// The proxy's listen address (HTTP/1.1; TLS with `--tls-cert`).
    #[arg(long, env = "IDEMD_PROXY_LISTEN", default_value_t = DEFAULT_PROXY_LISTEN)]
    pub listen: SocketAddr,
    /// The HTTP service requests are forwarded to (`http://host:port`).
    #[arg(long, env = "IDEMD_UPSTREAM")]
    pub upstream: String,
    /// TOML routes file: which methods and paths need an Idempotency-Key,
    /// their endpoints and limits (see `docs/proxy.md`). Without it, POST
    /// and PATCH on every path require a key.
    #[arg(long, env = "IDEMD_PROXY_ROUTES")]
    pub routes: Option<PathBuf>,
    /// Header whose bearer token names the tenant (looked up in
    /// `--auth-tokens`); a header other than `authorization` is not
    /// forwarded upstream.
    #[arg(
        long,
        env = "IDEMD_PROXY_TOKEN_HEADER",
        default_value = "authorization"
    )]
    pub token_header: String,
    /// Also serve the gRPC API on this address; `off` (the default) does not.
    #[arg(long, env = "IDEMD_GRPC_LISTEN", default_value = "off")]
    pub grpc_listen: String,
    /// Also serve the HTTP/JSON API on this address; `off` (the default)
    /// does not.
    #[arg(long, env = "IDEMD_HTTP_LISTEN", default_value = "off")]
    pub http_listen: String,
    /// Store, auth, TLS, policy, limit, metrics and log flags.
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags every serving command shares.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Where records live.
    #[arg(long, env = "IDEMD_STORE", value_enum, default_value_t = StoreKind::Embedded)]
    pub store: StoreKind,
    /// CQL connection flags (with `--store cql`).
    #[command(flatten)]
    pub cql: CqlArgs,
    /// Directory of the embedded store's database file.
    #[arg(long, env = "IDEMD_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Tokens file (`TENANT SHA256_HEX_OF_TOKEN [ROLE [ENDPOINT_PREFIX, ...]]`
    /// per line, see the `auth` module). Without it auth
    /// is off and the tenant comes from `x-tenant-id`.
    #[arg(long, env = "IDEMD_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,
    /// With authentication off, also serve callers from non-loopback
    /// addresses (any of them picks its tenant with `x-tenant-id`). Without
    /// it such a server answers only loopback callers; others get
    /// PERMISSION_DENIED (HTTP 403) naming this flag.
    #[arg(
        long,
        env = "IDEMD_ALLOW_UNAUTHENTICATED_REMOTE",
        default_value_t = DEFAULT_ALLOW_UNAUTHENTICATED_REMOTE,
        value_parser = clap::builder::BoolishValueParser::new(),
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub allow_unauthenticated_remote: bool,
    /// Embedded store: serve a data directory that `idemd copy-to-cql`
    /// marked as moved to a CQL keyspace (a rollback before the cluster
    /// took its first write); the mark is removed. Without it such a
    /// directory is refused, naming the keyspace.
    #[arg(
        long,
        env = "IDEMD_ALLOW_MOVED_STORE",
        value_parser = clap::builder::BoolishValueParser::new(),
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub allow_moved_store: bool,
    /// TOML file with default and per-endpoint policies.
    #[arg(long, env = "IDEMD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "IDEMD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,idemd=debug`).
    #[arg(long, env = "IDEMD_LOG", default_value = DEFAULT_LOG)]
    pub log: String,
    /// Longest time in-flight RPCs get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "IDEMD_DRAIN_TIMEOUT", default_value_t = DEFAULT_DRAIN_TIMEOUT.into())]
    pub drain_timeout: humantime::Duration,
    /// How often expired records are swept from the embedded store.
    #[arg(long, env = "IDEMD_SWEEP_INTERVAL", default_value_t = DEFAULT_SWEEP_INTERVAL.into())]
    pub sweep_interval: humantime::Duration,
    /// Memory for cached completed records (replays), in bytes.
    #[arg(long, env = "IDEMD_CACHE_BYTES", default_value_t = DEFAULT_CACHE_BYTES)]
    pub cache_bytes: usize,
    /// Page cache of the embedded store's database file, in bytes.
    #[arg(long, env = "IDEMD_STORE_CACHE_BYTES", default_value_t = embedded::DEFAULT_CACHE_BYTES)]
    pub store_cache_bytes: usize,
    /// Embedded store: bytes per second the background scrub reads to check
    /// every block of the database file; 0 turns it off (damage in a block
    /// no request reads then goes unnoticed until one does).
    #[arg(long, env = "IDEMD_STORE_SCRUB_RATE", default_value_t = embedded::DEFAULT_SCRUB_RATE)]
    pub store_scrub_rate: u64,
    /// Embedded store: pause between two scrub passes (one starts at open).
    #[arg(long, env = "IDEMD_STORE_SCRUB_INTERVAL", default_value_t = embedded::DEFAULT_SCRUB_INTERVAL.into())]
    pub store_scrub_interval: humantime::Duration,
    /// Prometheus `/metrics` address (separate from the gRPC port); `off`
    /// disables the exporter.
    #[arg(long, env = "IDEMD_METRICS_LISTEN", default_value = DEFAULT_METRICS_LISTEN)]
    pub metrics_listen: String,
    /// Distinct tenant label values in metrics before `_other`.
    #[arg(long, env = "IDEMD_METRICS_MAX_TENANTS", default_value_t = DEFAULT_METRICS_MAX_LABELS)]
    pub metrics_max_tenants: usize,
    /// Distinct endpoint label values in metrics before `_other`.
    #[arg(long, env = "IDEMD_METRICS_MAX_ENDPOINTS", default_value_t = DEFAULT_METRICS_MAX_LABELS)]
    pub metrics_max_endpoints: usize,
    /// How long audit events are kept (endpoints with `audit = true`),
    /// independently of the keys' ttl.
    #[arg(long, env = "IDEMD_AUDIT_RETENTION", default_value_t = crate::audit::DEFAULT_RETENTION.into())]
    pub audit_retention: humantime::Duration,
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
    /// it responses are stored in clear. Reloaded on SIGHUP and on change.
    #[arg(long, env = "IDEMD_ENCRYPTION_KEYS")]
    pub encryption_keys: Option<PathBuf>,
    /// New keys (Claims that create a record) per second per tenant; 0
    /// disables the limit.
    #[arg(long, env = "IDEMD_CLAIM_RATE", default_value_t = DEFAULT_CLAIM_RATE)]
    pub claim_rate: f64,
    /// Burst of new keys per tenant above `--claim-rate`.
    #[arg(long, env = "IDEMD_CLAIM_BURST", default_value_t = DEFAULT_CLAIM_BURST)]
    pub claim_burst: u32,
    /// RPCs in progress at once before new ones are shed with
    /// RESOURCE_EXHAUSTED; 0 disables the limit.
    #[arg(long, env = "IDEMD_MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// How often watched files (tokens, client tenants, TLS certificate and
    /// key, client CA, encryption keyring) are checked for changes; SIGHUP
    /// re-reads them at once.
    #[arg(long, env = "IDEMD_RELOAD_INTERVAL", default_value_t = crate::reload::DEFAULT_INTERVAL.into())]
    pub reload_interval: humantime::Duration,
}
