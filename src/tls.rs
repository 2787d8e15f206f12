//! TLS and mTLS of the gRPC port.
//!
//! idemd holds every tenant's stored responses and sits on the write path of
//! every state-changing call, so the port must be protectable in transit and
//! callers in a mesh must be identifiable by their workload certificates.
//!
//! # Why our own acceptor
//!
//! tonic's built-in `ServerTlsConfig` takes the certificate once, at start.
//! Certificates in a cluster are short-lived (cert-manager, SPIFFE) and are
//! rotated by rewriting the mounted files, so idemd builds its own rustls
//! `ServerConfig` whose certificate comes from a [`ResolvesServerCert`] that
//! swaps an `Arc<CertifiedKey>`: a new certificate applies to the next
//! handshake while established connections keep running on theirs. TCP
//! connections are accepted here, each handshake runs in its own task (with
//! a deadline, so a slow or silent client cannot hold up the others), and
//! the finished `tokio_rustls` streams are handed to tonic, whose
//! `Connected` impl for them puts the peer certificate chain in each
//! request's extensions (`Request::peer_certs`).
//!
//! # Reloading
//!
//! The certificate, its key and the client CA bundle are checked every
//! second (modification time and size) and on SIGHUP. A file that fails to
//! load — unreadable, not PEM, a key that does not match the certificate —
//! keeps the previous one in force and logs why, naming the file, so a
//! half-written or bad rotation never takes the port down. Write the key
//! and the certificate in either order: until both match, the old pair
//! stays.
//!
//! # mTLS and tenants
//!
//! With a client CA bundle (`--tls-client-ca`) every client must present a
//! certificate that chains to it; the handshake fails otherwise (no
//! certificate, another CA, expired). The tenant is taken from the
//! certificate through a mapping file (`--tls-client-tenants`), one grant a
//! line:
//!
//! ```text
//! SAN TENANT [ROLE [ENDPOINT_PREFIX, ENDPOINT_PREFIX...]]
//! spiffe://prod.example/ns/payments/sa/api  payments  service  POST /v1/payments
//! reconciler.billing.svc.cluster.local      billing   reconciler
//! ```
//!
//! SAN is a URI SAN starting with `spiffe://` (matched exactly) or a DNS-name
//! SAN (matched exactly, case-insensitively; a wildcard certificate name
//! matches only the same wildcard line). ROLE and the endpoint allow-list
//! mean what they mean in the tokens file (see [`crate::auth`]); without a
//! role a line grants `service`, the least role, because this format has no
//! older files to stay compatible with. `#` starts a comment. The file is
//! reloaded like the tokens file; an invalid file keeps the previous table.
//!
//! Rules (also in `docs/security.md`, "TLS and mTLS"):
//!
//! * **mTLS with a mapping, no tokens file**: the caller is the mapping entry
//!   of its certificate. A certificate whose SANs match no line, or match
//!   lines of different grants, gets `UNAUTHENTICATED`.
//! * **mTLS with a mapping and a tokens file**: the caller must present both
//!   a mapped certificate and a valid token, and both must name the same
//!   tenant (otherwise `UNAUTHENTICATED`). The call gets the lesser of the
//!   two roles and only the endpoints both allow-lists allow: each
//!   credential can only narrow what the other grants.
//! * **mTLS without a mapping**: certificates only gate the connection; the
//!   tenant comes from the token, so a tokens file is required (idemd
//!   refuses to start otherwise).
//! * **Server TLS only** (no client CA): encryption and server
//!   authentication only; callers are identified by tokens, or, with no
//!   tokens file, auth is off exactly as in plaintext (the tenant is the
//!   `x-tenant-id` header and a warning is logged at start).
//! * Whenever tokens or a certificate mapping are on, `x-tenant-id` is never
//!   read.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::{AuthError, Caller, Role};
use crate::config::TlsSettings;
use crate::engine::validate;

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the gRPC server to pick them up.
const ACCEPT_QUEUE: usize = 128;

/// A TLS file that cannot be used, naming the file (and the line, for the
/// tenants mapping).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key or CA file.
    #[error("{path}: {description}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        description: String,
    },
    /// A line of the client-tenants mapping.
    #[error("{path}:{line}: {description}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        description: String,
    },
    /// Settings that cannot work together.
    #[error("{0}")]
    Settings(String),
}

fn file_error(path: &Path, description: impl Into<String>) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        description: description.into(),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| file_error(path, format!("cannot read: {e}")))
}

/// The crypto provider of every rustls use in idemd. Named explicitly:
/// dependencies compile both `ring` and `aws-lc-rs` into rustls, and the
/// process-wide default would then be ambiguous.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM certificate chain (leaf first).
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(path)?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

/// Loads a certificate chain and its key, checking that they match.
fn load_certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certs(cert)?;
    let key_pem = read_file(key)?;
    let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| file_error(key, format!("invalid PEM: {e}")))?
        .ok_or_else(|| file_error(key, "no PRIVATE KEY block"))?;
    let certified = CertifiedKey::from_der(chain, key_der, provider).map_err(|e| {
        file_error(
            key,
            format!("unusable with the certificate {}: {e}", cert.display()),
        )
    })?;
    Ok(Arc::new(certified))
}

/// Reads a PEM CA bundle into a root store.
fn load_roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| file_error(path, format!("unusable CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

/// The server certificate: whatever was loaded last.
#[derive(Debug)]
struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    fn set(&self, certified: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = certified;
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|e| e.into_inner()),
        ))
    }
}

/// Modification time and size of a file (`None` if it cannot be read).
type Stamp = Option<(SystemTime, u64)>;

fn file_stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// The TLS side of the gRPC port: the reloadable server configuration and
/// the acceptor that feeds tonic.
#[derive(Debug, Clone)]
pub struct TlsServer {
    inner: Arc<TlsInner>,
}

#[derive(Debug)]
struct TlsInner {
    settings: TlsSettings,
    provider: Arc<CryptoProvider>,
    cert: Arc<ReloadingCert>,
    /// The configuration of new handshakes (swapped when the client CA
    /// bundle changes; the certificate changes inside `cert`).
    config: RwLock<Arc<ServerConfig>>,
    /// What the files looked like when last loaded: (cert, key, client CA).
    stamps: Mutex<(Stamp, Stamp, Stamp)>,
}

impl TlsServer {
    /// Loads the certificate, key and client CA bundle; fails, naming the
    /// file, if any of them is unusable.
    pub fn new(settings: &TlsSettings) -> Result<Self, TlsError> {
        let provider = provider();
        let stamps = Self::current_stamps(settings);
        let certified = load_certified_key(&settings.cert, &settings.key, &provider)?;
        let cert = Arc::new(ReloadingCert {
            current: RwLock::new(certified),
        });
        let config = build_config(settings, &provider, &cert)?;
        Ok(Self {
            inner: Arc::new(TlsInner {
                settings: settings.clone(),
                provider,
                cert,
                config: RwLock::new(config),
                stamps: Mutex::new(stamps),
            }),
        })
    }

    /// Whether client certificates are required.
    pub fn is_mutual(&self) -> bool {
        self.inner.settings.client_ca.is_some()
    }

    fn current_stamps(settings: &TlsSettings) -> (Stamp, Stamp, Stamp) {
        (
            file_stamp(&settings.cert),
            file_stamp(&settings.key),
            settings.client_ca.as_deref().and_then(file_stamp),
        )
    }

    /// Reloads what changed on disk (everything when `force`); whatever
    /// fails to load keeps its previous version. Returns what was reloaded
    /// and the errors of what was not.
    pub fn reload(&self, force: bool) -> (Vec<&'static str>, Vec<TlsError>) {
        let inner = &self.inner;
        let now = Self::current_stamps(&inner.settings);
        let before = {
            let mut stamps = inner.stamps.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *stamps, now)
        };
        let mut reloaded = Vec::new();
        let mut errors = Vec::new();
        if force || now.0 != before.0 || now.1 != before.1 {
            match load_certified_key(&inner.settings.cert, &inner.settings.key, &inner.provider) {
                Ok(certified) => {
                    inner.cert.set(certified);
                    reloaded.push("certificate");
                }
                Err(error) => errors.push(error),
            }
        }
        if inner.settings.client_ca.is_some() && (force || now.2 != before.2) {
            match build_config(&inner.settings, &inner.provider, &inner.cert) {
                Ok(config) => {
                    *inner.config.write().unwrap_or_else(|e| e.into_inner()) = config;
                    reloaded.push("client CA");
                }
                Err(error) => errors.push(error),
            }
        }
        (reloaded, errors)
    }

    /// Reloads on SIGHUP and whenever a file changes (checked every
    /// `poll`). Runs until the task is dropped.
    pub async fn watch(self, poll: Duration) {
        watch_loop(poll, |force| {
            let (reloaded, errors) = self.reload(force);
            if !reloaded.is_empty() {
                tracing::info!(reloaded = ?reloaded, "TLS files reloaded");
            }
            for error in errors {
                tracing::error!(%error, "TLS file unusable; keeping the previous one");
            }
        })
        .await;
    }

    /// Accepts TCP connections on `listener` and yields them once their TLS
    /// handshake has succeeded, until `shutdown` turns true or the stream is
    /// dropped. Failed handshakes are logged at debug level and dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) -> ReceiverStream<Result<TlsStream<TcpStream>, io::Error>> {
        let (sender, receiver) = mpsc::channel(ACCEPT_QUEUE);
        let server = self.clone();
        tokio::spawn(async move {
            loop {
                // TCP_NODELAY is set by `crate::net` (see there for why it
                // matters); the handshake's own records go out unbatched too.
                let (tcp, peer) = tokio::select! {
                    accepted = crate::net::accept_retrying(&listener) => accepted,
                    () = sender.closed() => break,
                    _ = shutdown.wait_for(|stop| *stop) => break,
                };
                let acceptor = server.acceptor();
                let sender = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send(Ok(stream)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        ReceiverStream::new(receiver)
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(
            &self.inner.config.read().unwrap_or_else(|e| e.into_inner()),
        ))
    }
}

/// A rustls server configuration around the reloadable certificate, with
/// client certificates required and verified when a client CA is set.
fn build_config(
    settings: &TlsSettings,
    provider: &Arc<CryptoProvider>,
    cert: &Arc<ReloadingCert>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Settings(format!("TLS protocol versions: {e}")))?;
    let builder = match &settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                load_roots(path)?,
                Arc::clone(provider),
            )
            .build()
            .map_err(|e| file_error(path, format!("client CA bundle: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::clone(cert) as Arc<dyn ResolvesServerCert>);
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A name a client certificate can carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum San {
    /// A URI SAN (`spiffe://…`), exact.
    Uri(String),
    /// A DNS-name SAN, lower-cased.
    Dns(String),
}

impl std::fmt::Display for San {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            San::Uri(uri) => write!(f, "URI:{uri}"),
            San::Dns(name) => write!(f, "DNS:{name}"),
        }
    }
}

/// SAN → what it grants.
type SanTable = HashMap<San, Caller>;

/// Parses the text of a client-tenants mapping file (format in the module
/// docs).
fn parse_client_tenants(path: &Path, text: &str) -> Result<SanTable, TlsError> {
    let error = |line: usize, description: String| TlsError::Line {
        path: path.display().to_string(),
        line,
        description,
    };
    let mut table = SanTable::new();
    for (index, raw) in text.lines().enumerate() {
        let line_number = index + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(san), Some(tenant)) = (fields.next(), fields.next()) else {
            return Err(error(
                line_number,
                "expected 'SAN TENANT [ROLE [ENDPOINT_PREFIX, ...]]'".to_string(),
            ));
        };
        let san = parse_san(san).map_err(|e| error(line_number, e))?;
        validate::tenant("tenant", tenant).map_err(|e| error(line_number, e.to_string()))?;
        let role = match fields.next() {
            None => Role::Service,
            Some(name) => Role::parse(name).ok_or_else(|| {
                error(
                    line_number,
                    format!("unknown role {name:?}: expected service, reconciler or admin"),
                )
            })?,
        };
        let rest = fields.collect::<Vec<_>>().join(" ");
        let endpoint_prefixes = crate::auth::parse_endpoint_prefixes(&rest)
            .map_err(|description| error(line_number, description))?;
        let caller = Caller {
            tenant: tenant.to_string(),
            role,
            endpoint_prefixes,
        };
        if table.insert(san.clone(), caller).is_some() {
            return Err(error(line_number, format!("{san} appears twice")));
        }
    }
    Ok(table)
}

fn parse_san(value: &str) -> Result<San, String> {
    if value.contains("://") {
        if !value.starts_with("spiffe://") || value.len() == "spiffe://".len() {
            return Err(format!(
                "{value:?}: URI SANs must be SPIFFE IDs (spiffe://trust-domain/path)"
            ));
        }
        return Ok(San::Uri(value.to_string()));
    }
    let valid = !value.is_empty()
        && value.len() <= 253
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'*');
    if !valid {
        return Err(format!(
            "{value:?} is neither a spiffe:// URI nor a DNS name"
        ));
    }
    Ok(San::Dns(value.to_ascii_lowercase()))
}

/// The URI and DNS-name SANs of a DER certificate.
fn certificate_sans(der: &[u8]) -> Result<Vec<San>, String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("unparsable client certificate: {e}"))?;
    let Some(extension) = cert
        .subject_alternative_name()
        .map_err(|e| format!("client certificate SANs: {e}"))?
    else {
        return Ok(Vec::new());
    };
    Ok(extension
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(San::Uri((*uri).to_string())),
            GeneralName::DNSName(dns) => Some(San::Dns(dns.to_ascii_lowercase())),
            _ => None,
        })
        .collect())
}

/// The client-certificate → tenant mapping (`--tls-client-tenants`),
/// reloadable.
#[derive(Debug, Clone)]
pub struct ClientTenants {
    table: Arc<RwLock<SanTable>>,
    path: PathBuf,
}

impl ClientTenants {
    /// Reads the mapping; fails, naming the file and line, if invalid.
    pub fn from_file(path: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            table: Arc::new(RwLock::new(read_client_tenants(path)?)),
            path: path.to_path_buf(),
        })
    }

    /// A mapping from text (tests).
    pub fn from_text(path: &Path, text: &str) -> Result<Self, TlsError> {
        Ok(Self {
            table: Arc::new(RwLock::new(parse_client_tenants(path, text)?)),
            path: path.to_path_buf(),
        })
    }

    /// The caller a verified certificate chain (leaf first) maps to.
    pub fn caller(&self, certs: Option<&[CertificateDer<'_>]>) -> Result<Caller, AuthError> {
        let leaf = certs
            .and_then(|certs| certs.first())
            .ok_or(AuthError::MissingCertificate)?;
        let sans = certificate_sans(leaf).map_err(AuthError::BadCertificate)?;
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut found: Option<&Caller> = None;
        for san in &sans {
            if let Some(caller) = table.get(san) {
                match found {
                    Some(previous) if previous != caller => {
                        return Err(AuthError::AmbiguousCertificate);
                    }
                    _ => found = Some(caller),
                }
            }
        }
        found.cloned().ok_or(AuthError::UnmappedCertificate)
    }

    /// The tenants of the mapping.
    pub fn tenants(&self) -> Vec<String> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut tenants: Vec<String> = table.values().map(|c| c.tenant.clone()).collect();
        tenants.sort();
        tenants.dedup();
        tenants
    }

    /// Re-reads the file; on error the current mapping stays in force.
    pub fn reload(&self) -> Result<usize, TlsError> {
        let table = read_client_tenants(&self.path)?;
        let count = table.len();
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
        Ok(count)
    }

    /// Reloads on SIGHUP and whenever the file changes (checked every
    /// `poll`). Runs until the task is dropped.
    pub async fn watch(self, poll: Duration) {
        let mut last_seen = file_stamp(&self.path);
        watch_loop(poll, |force| {
            let stamp = file_stamp(&self.path);
            if !force && stamp == last_seen {
                return;
            }
            last_seen = stamp;
            match self.reload() {
                Ok(count) => tracing::info!(entries = count, "TLS client tenants reloaded"),
                Err(error) => tracing::error!(
                    %error,
                    "TLS client tenants file invalid; keeping the previous mapping"
                ),
            }
        })
        .await;
    }
}

fn read_client_tenants(path: &Path) -> Result<SanTable, TlsError> {
    let bytes = read_file(path)?;
    let text =
        String::from_utf8(bytes).map_err(|_| file_error(path, "not UTF-8 text".to_string()))?;
    parse_client_tenants(path, &text)
}

/// Calls `check(false)` every `poll` and `check(true)` on SIGHUP, forever:
/// the reload loop of every file idemd watches (tokens, certificates,
/// client tenants).
pub(crate) async fn watch_loop(poll: Duration, mut check: impl FnMut(bool)) {
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let signalled = async {
            match hangup.as_mut() {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let signalled = std::future::pending::<()>();
        let force = tokio::select! {
            () = signalled => true,
            () = tokio::time::sleep(poll) => false,
        };
        check(force);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mapping_lines() {
        let text = "# mapping\n\
            spiffe://prod.example/ns/pay/sa/api  payments\n\
            Worker.Billing.svc  billing reconciler POST /v1/invoices, POST /v1/refunds # two\n\
            admin.example  ops admin\n";
        let table = parse_client_tenants(Path::new("m"), text).expect("valid");
        let api = &table[&San::Uri("spiffe://prod.example/ns/pay/sa/api".to_string())];
        assert_eq!(api.tenant, "payments");
        assert_eq!(api.role, Role::Service, "no role: the least one");
        let worker = &table[&San::Dns("worker.billing.svc".to_string())];
        assert_eq!(worker.role, Role::Reconciler);
        assert_eq!(
            worker.endpoint_prefixes.as_deref(),
            Some(
                &[
                    "POST /v1/invoices".to_string(),
                    "POST /v1/refunds".to_string()
                ][..]
            )
        );
        assert_eq!(
            table[&San::Dns("admin.example".to_string())].role,
            Role::Admin
        );
    }

    #[test]
    fn rejects_bad_lines_with_file_and_line() {
        for (text, line, needle) in [
            ("just-a-san\n", 1, "expected"),
            ("ok.example t\nhttps://x t\n", 2, "SPIFFE"),
            ("a.example bad/tenant\n", 1, "tenant"),
            ("a.example t root\n", 1, "unknown role"),
            ("a.example t service POST /a,,\n", 1, "empty"),
            ("a.example t\nA.EXAMPLE u\n", 2, "twice"),
            ("a_b t\n", 1, "neither"),
        ] {
            let error = parse_client_tenants(Path::new("/etc/idemd/m"), text).expect_err(text);
            let TlsError::Line {
                path,
                line: at,
                description,
            } = &error
            else {
                panic!("{error}");
            };
            assert_eq!(path, "/etc/idemd/m");
            assert_eq!(*at, line, "{error}");
            assert!(description.contains(needle), "{error}");
        }
    }
}
