//! Configuration: command line and `IDEMD_*` environment for the process,
//! a TOML file for endpoint policies, validated into [`Settings`].
//!
//! Precedence, lowest first: built-in defaults → `--config` file (policies)
//! → `IDEMD_*` environment → command-line flags. Every flag has an
//! environment variable (shown by `idemd --help`). Invalid configuration is
//! refused at start with a message that names the field, e.g.
//! `endpoints."POST /v1/payments".lease: 2h exceeds ttl 1h`, and exit
//! status 2.
//!
//! # Where things are defined
//!
//! Each default is a constant defined once, next to what it configures
//! (the `DEFAULT_*` constants below, [`crate::store::embedded`] and
//! [`crate::store::cql`] for their backends, [`Policy::default`] for
//! policies); clap's `default_value_t`, [`Settings::for_data_dir`] and the
//! README's flag table show those constants (`tests/it/docs.rs` checks the
//! table against `idemd serve --help`). Every check of a combination of
//! settings is in [`Settings::validate`]; files named by settings (tokens,
//! certificates, mappings, keyring) are read at start-up by the modules that
//! own them, and their errors exit 2 as well (`ServerError::is_configuration`).
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
//! max_clock_skew = "100ms"      # takeover waits this long past expiry
//! audit = false                 # append every transition to the audit log
//!
//! [endpoints."POST /v1/payments"] # overrides, inheriting from [defaults]
//! ttl = "72h"
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::engine::{PolicySet, validate};
use crate::store::cql::CqlOptions;
use crate::store::embedded;

mod args;
mod defaults;
mod error;
mod policies;
pub mod routes;

pub use args::{
    AuditArgs, BackupArgs, Cli, Command, ConnectArgs, CopyToCqlArgs, CqlArgs, KeyRef, KeysArgs,
    KeysCommand, LogFormat, MigrateArgs, OutputFormat, ProxyArgs, RestoreArgs, ServeArgs,
    ServerArgs, StoreKind, VerdictArgs,
};
pub use defaults::{
    DEFAULT_ALLOW_UNAUTHENTICATED_REMOTE, DEFAULT_CACHE_BYTES, DEFAULT_CLAIM_BURST,
    DEFAULT_CLAIM_RATE, DEFAULT_DATA_DIR, DEFAULT_DRAIN_TIMEOUT, DEFAULT_LISTEN, DEFAULT_LOG,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_METRICS_LISTEN, DEFAULT_METRICS_MAX_LABELS,
    DEFAULT_PROXY_LISTEN, DEFAULT_SWEEP_INTERVAL, MAX_RESPONSE_BYTES_LIMIT, MAX_WAIT_LIMIT,
    MIN_RELOAD_INTERVAL, MIN_STORE_CACHE_BYTES,
};
pub use error::ConfigError;
pub use policies::parse_policies;
use policies::{load_policies, validate_policy};

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
            claim_rate: DEFAULT_CLAIM_RATE,
            claim_burst: DEFAULT_CLAIM_BURST,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

/// An address flag that may be `off` (or empty).
fn optional_address(field: &str, value: &str) -> Result<Option<SocketAddr>, ConfigError> {
    match value.trim() {
        "off" | "" => Ok(None),
        address => address
            .parse()
            .map(Some)
            .map_err(|e| ConfigError::new(field, format!("{address:?}: {e}"))),
    }
}

/// The store a server runs on.
// Built once at start-up and never moved in bulk: boxing the CQL options
// would only make every reader unwrap them.
#[allow(clippy::large_enum_variant)]
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
    /// gRPC listen address; `None` = no gRPC port (`idemd proxy` without
    /// `--grpc-listen`).
    pub listen: Option<SocketAddr>,
    /// HTTP/JSON API listen address; `None` = off.
    pub http_listen: Option<SocketAddr>,
    /// `idemd proxy`'s settings; `None` = not a proxy.
    pub proxy: Option<routes::ProxySettings>,
    /// Embedded store directory.
    pub data_dir: PathBuf,
    /// Tokens file; `None` = auth off.
    pub auth_tokens: Option<PathBuf>,
    /// With auth off, whether callers from non-loopback addresses are
    /// served: an explicit opt-out of protected mode, because without
    /// credentials any caller that reaches the port picks its tenant.
    pub allow_unauthenticated_remote: bool,
    /// Embedded store: serve a directory marked as moved to a CQL keyspace
    /// (`store::embedded::moved`), removing the mark; off refuses it.
    pub allow_moved_store: bool,
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
    /// Embedded store: pace of the background check of every block.
    pub store_scrub: embedded::ScrubOptions,
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
    /// How often watched files are checked for changes.
    pub reload_interval: Duration,
}

impl Settings {
    /// Loads the encryption keyring `encryption_keys` names, if any: what
    /// the server seals responses with and what `idemd copy-to-cql` opens
    /// and seals them with (the same file, read the same way).
    pub fn load_keyring(
        &self,
    ) -> Result<Option<std::sync::Arc<crate::crypto::Keyring>>, crate::crypto::KeyringError> {
        let Some(path) = &self.encryption_keys else {
            return Ok(None);
        };
        let keyring = crate::crypto::Keyring::load(path)?;
        tracing::info!(
            path = %path.display(),
            active_key_id = keyring.active_key_id(),
            keys = keyring.key_ids().len(),
            "encryption at rest of stored responses is on"
        );
        Ok(Some(std::sync::Arc::new(keyring)))
    }

    /// Settings for tests and embedding: defaults, given data dir.
    pub fn for_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            store: StoreSettings::Embedded,
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            http_listen: None,
            proxy: None,
            data_dir: data_dir.into(),
            auth_tokens: None,
            allow_unauthenticated_remote: DEFAULT_ALLOW_UNAUTHENTICATED_REMOTE,
            allow_moved_store: false,
            log_format: LogFormat::Human,
            log: DEFAULT_LOG.to_string(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            cache_bytes: DEFAULT_CACHE_BYTES,
            store_cache_bytes: embedded::DEFAULT_CACHE_BYTES,
            store_scrub: embedded::ScrubOptions::default(),
            policies: PolicySet::default(),
            metrics_listen: None,
            metrics_label_caps: (DEFAULT_METRICS_MAX_LABELS, DEFAULT_METRICS_MAX_LABELS),
            audit_retention: crate::audit::DEFAULT_RETENTION,
            tls: None,
            encryption_keys: None,
            limits: LimitSettings::default(),
            reload_interval: crate::reload::DEFAULT_INTERVAL,
        }
    }

    /// Builds and validates settings from the flags of `idemd serve`.
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut settings = Self::from_server_args(&args.server)?;
        settings.listen = Some(args.listen);
        settings.http_listen = optional_address("http_listen", &args.http_listen)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Builds and validates settings from the flags of `idemd proxy`.
    pub fn from_proxy_args(args: &ProxyArgs) -> Result<Self, ConfigError> {
        let mut settings = Self::from_server_args(&args.server)?;
        settings.listen = optional_address("grpc_listen", &args.grpc_listen)?;
        settings.http_listen = optional_address("http_listen", &args.http_listen)?;
        let token_header =
            http::HeaderName::from_bytes(args.token_header.trim().to_ascii_lowercase().as_bytes())
                .map_err(|_| {
                    ConfigError::new(
                        "token_header",
                        format!("{:?} is not a header name", args.token_header),
                    )
                })?;
        settings.proxy = Some(routes::ProxySettings {
            listen: args.listen,
            upstream: args.upstream.clone(),
            routes: match &args.routes {
                Some(path) => routes::Routes::load(path)?,
                None => routes::Routes::default(),
            },
            token_header,
        });
        settings.validate()?;
        Ok(settings)
    }

    /// Builds and validates the settings of `idemd copy-to-cql`: the
    /// embedded store of `--data-dir` as the source, and the CQL store the
    /// same flags would give `idemd --store cql` (connection, keyring,
    /// policies' longest ttl, the seal-grace check) as the target.
    pub fn from_copy_args(args: &CopyToCqlArgs) -> Result<Self, ConfigError> {
        let policies = match &args.config {
            Some(path) => load_policies(path)?,
            None => PolicySet::default(),
        };
        let mut settings = Self::for_data_dir(args.data_dir.clone());
        settings.store = StoreSettings::Cql(args.cql.options(policies.longest_max_ttl())?);
        settings.policies = policies;
        settings.store_cache_bytes = args.store_cache_bytes;
        settings.encryption_keys = args.encryption_keys.clone();
        settings.log_format = args.log_format;
        settings.validate()?;
        Ok(settings)
    }

    fn from_server_args(args: &ServerArgs) -> Result<Self, ConfigError> {
        let policies = match &args.config {
            Some(path) => load_policies(path)?,
            None => PolicySet::default(),
        };
        let max_ttl = policies.longest_max_ttl();
        let store = match args.store {
            StoreKind::Embedded => StoreSettings::Embedded,
            StoreKind::Cql => StoreSettings::Cql(args.cql.options(max_ttl)?),
        };
        let settings = Self {
            store,
            listen: None,
            http_listen: None,
            proxy: None,
            data_dir: args.data_dir.clone(),
            auth_tokens: args.auth_tokens.clone(),
            allow_unauthenticated_remote: args.allow_unauthenticated_remote,
            allow_moved_store: args.allow_moved_store,
            log_format: args.log_format,
            log: args.log.clone(),
            drain_timeout: args.drain_timeout.into(),
            sweep_interval: args.sweep_interval.into(),
            cache_bytes: args.cache_bytes,
            store_cache_bytes: args.store_cache_bytes,
            store_scrub: embedded::ScrubOptions {
                rate: args.store_scrub_rate,
                interval: args.store_scrub_interval.into(),
            },
            policies,
            metrics_listen: optional_address("metrics_listen", &args.metrics_listen)?,
            metrics_label_caps: (args.metrics_max_tenants, args.metrics_max_endpoints),
            audit_retention: args.audit_retention.into(),
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
            reload_interval: args.reload_interval.into(),
        };
        Ok(settings)
    }

    /// The one place where the two clock-skew limits meet. A replica whose
    /// clock lags the sealer's by up to the largest `max_clock_skew` of any
    /// policy (the skew the operator promises, docs/reliability.md) computes
    /// a claim's due bucket that much in the past, and its index write may
    /// land one statement timeout later still. The pending index is sealed
    /// `seal_grace` behind the clock, so a grace not longer than both
    /// together lets such a claim be indexed into a bucket already sealed:
    /// ListPending and the gauges would never show it. Refused rather than
    /// derived, so that the flag an operator reads is the grace in force.
    fn validate_seal_grace(
        &self,
        seal_grace: Duration,
        request_timeout: Duration,
    ) -> Result<(), ConfigError> {
        let (skew, source) = std::iter::once(("defaults".to_string(), &self.policies.default))
            .chain(
                self.policies
                    .endpoints
                    .iter()
                    .map(|(endpoint, policy)| (format!("endpoints.{endpoint:?}"), policy)),
            )
            .map(|(source, policy)| (policy.max_clock_skew, source))
            .max()
            .unwrap_or_default();
        let needed = skew + request_timeout;
        if seal_grace <= needed {
            let show = |d: Duration| humantime::format_duration(d).to_string();
            return Err(ConfigError::new(
                "cql_seal_grace",
                format!(
                    "{} must exceed the largest max_clock_skew ({} in {source}) plus --cql-request-timeout ({}): a replica lagging that far would index claims into buckets already sealed, which ListPending never shows; raise --cql-seal-grace above {} or lower max_clock_skew",
                    show(seal_grace),
                    show(skew),
                    show(request_timeout),
                    show(needed),
                ),
            ));
        }
        Ok(())
    }

    /// Whether callers must present credentials (a tokens file or a
    /// client-certificate mapping); otherwise auth is off.
    pub fn authentication_configured(&self) -> bool {
        self.auth_tokens.is_some()
            || self
                .tls
                .as_ref()
                .is_some_and(|tls| tls.client_tenants.is_some())
    }

    /// Checks every setting; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.is_none() && self.http_listen.is_none() && self.proxy.is_none() {
            return Err(ConfigError::new(
                "listen",
                "nothing to serve: give a gRPC, HTTP or proxy listen address",
            ));
        }
        if let Some(proxy) = &self.proxy {
            routes::upstream_authority(&proxy.upstream)?;
        }
        if self.sweep_interval.is_zero() {
            return Err(ConfigError::new(
                "sweep_interval",
                "must be greater than zero",
            ));
        }
        if self.reload_interval < MIN_RELOAD_INTERVAL {
            return Err(ConfigError::new(
                "reload_interval",
                format!(
                    "must be at least {}",
                    humantime::format_duration(MIN_RELOAD_INTERVAL)
                ),
            ));
        }
        if let Some(tls) = &self.tls {
            if tls.client_tenants.is_some() && tls.client_ca.is_none() {
                return Err(ConfigError::new(
                    "tls_client_tenants",
                    "needs --tls-client-ca: only verified client certificates may name a tenant",
                ));
            }
            if tls.client_ca.is_some() && tls.client_tenants.is_none() && self.auth_tokens.is_none()
            {
                return Err(ConfigError::new(
                    "tls_client_ca",
                    "without --tls-client-tenants or --auth-tokens client certificates would be verified but name no tenant; add a mapping, a tokens file, or both",
                ));
            }
        }
        if self.allow_unauthenticated_remote && self.authentication_configured() {
            // Harmless today, dangerous later: removing the credentials would
            // silently open the port to every remote caller.
            return Err(ConfigError::new(
                "allow_unauthenticated_remote",
                "only applies with authentication off; remove it when --auth-tokens or --tls-client-tenants is set",
            ));
        }
        if let StoreSettings::Cql(options) = &self.store {
            options
                .validate()
                .map_err(|(field, description)| ConfigError::new(field, description))?;
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
        // After the policies: a skew over its own limit is reported as such.
        if let StoreSettings::Cql(options) = &self.store {
            self.validate_seal_grace(options.seal_grace, options.request_timeout)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ExpiredLeasePolicy;

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

    /// CQL settings from the flags a user would pass, with `policies`.
    fn cql_settings(flags: &[&str], policies: &str) -> Result<Settings, ConfigError> {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            cql: args::CqlArgs,
        }
        let flags = <Flags as clap::Parser>::try_parse_from(
            std::iter::once("idemd").chain(flags.iter().copied()),
        )
        .expect("flags parse");
        let mut settings = Settings::for_data_dir("unused");
        settings.policies = parse_policies(policies)?;
        settings.store = StoreSettings::Cql(flags.cql.options(Duration::from_secs(86_400))?);
        settings.validate()?;
        Ok(settings)
    }

    #[test]
    fn seal_grace_must_exceed_the_largest_skew_plus_a_statement() {
        // The defaults (100 ms skew, 5 s timeout, 15 s grace) pass.
        cql_settings(&[], "").expect("defaults are consistent");
        // A skew the policy validator accepts (up to 60 s) on one endpoint
        // is refused against the default grace, naming the grace flag.
        let skewed = "[endpoints.\"POST /x\"]\nmax_clock_skew = \"20s\"\n";
        let err = cql_settings(&[], skewed).expect_err("grace below skew + timeout");
        assert_eq!(err.field, "cql_seal_grace");
        assert!(err.description.contains("20s"), "{err}");
        assert!(err.description.contains("endpoints"), "{err}");
        // The request timeout counts too: 15 s + 100 ms is over the 15 s grace.
        let err = cql_settings(&["--cql-request-timeout", "15s"], "")
            .expect_err("grace below the default skew + timeout");
        assert_eq!(err.field, "cql_seal_grace");
        // Raising the grace past both is accepted.
        cql_settings(&["--cql-seal-grace", "30s"], skewed).expect("grace covers it");
        // A skew over its own limit is reported as that, not as the grace.
        let err = cql_settings(&[], "[defaults]\nmax_clock_skew = \"2m\"\n").expect_err("limit");
        assert_eq!(err.field, "defaults.max_clock_skew");
        // The embedded store has no sealer: no such limit.
        settings_with(skewed).expect("embedded ignores the grace");
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
        let err = settings_with("[endpoints.\"POST /x\"]\nmax_clock_skew = \"2m\"\n")
            .expect_err("skew over the limit");
        assert_eq!(err.field, "endpoints.\"POST /x\".max_clock_skew");
        let settings = settings_with("[defaults]\nmax_clock_skew = \"2s\"\n").expect("valid");
        assert_eq!(
            settings.policies.for_endpoint("any").max_clock_skew,
            Duration::from_secs(2)
        );
        assert_eq!(
            Settings::for_data_dir("unused")
                .policies
                .default
                .max_clock_skew,
            crate::engine::DEFAULT_MAX_CLOCK_SKEW
        );
    }

    #[test]
    fn unauthenticated_remote_only_with_auth_off() {
        let mut settings = Settings::for_data_dir("unused");
        assert!(
            !settings.allow_unauthenticated_remote,
            "protected mode is the default"
        );
        settings.allow_unauthenticated_remote = true;
        settings.validate().expect("auth off: the opt-out applies");
        settings.auth_tokens = Some(PathBuf::from("tokens"));
        let err = settings.validate().expect_err("with a tokens file");
        assert_eq!(err.field, "allow_unauthenticated_remote");
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
