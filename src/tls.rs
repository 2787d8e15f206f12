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
//! The certificate, its key and the client CA bundle are checked by
//! [`crate::reload`] (modification time and size, every
//! `--reload-interval`) and on SIGHUP. A file that fails to
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
//! certificate, another CA, expired). Which tenant a verified certificate
//! belongs to is decided by [`crate::auth::client_cert`]; this module only
//! verifies chains and hands them to tonic.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

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

use crate::config::TlsSettings;
use crate::reload::{self, Stamp, file_stamp};

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the gRPC server to pick them up.
const ACCEPT_QUEUE: usize = 128;

/// A TLS file that cannot be used, naming the file.
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

/// The TLS side of the gRPC port: the reloadable server configuration and
/// the acceptor that feeds tonic.
#[derive(Debug, Clone)]
pub struct TlsServer {
    inner: Arc<TlsInner>,
    /// ALPN protocols offered by this listener when they differ from the
    /// gRPC port's `h2` (the HTTP/1.1 front doors, see [`Self::with_alpn`]).
    alpn: Option<Arc<[Vec<u8>]>>,
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
            alpn: None,
        })
    }

    /// The same certificates, client CA and reloading, for a listener that
    /// speaks other protocols than gRPC's `h2` (the HTTP front doors serve
    /// HTTP/1.1, and a client offering only `http/1.1` would fail the
    /// handshake against `h2` alone).
    pub fn with_alpn(&self, protocols: &[&[u8]]) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            alpn: Some(protocols.iter().map(|p| p.to_vec()).collect()),
        }
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
        let config = Arc::clone(&self.inner.config.read().unwrap_or_else(|e| e.into_inner()));
        match &self.alpn {
            None => TlsAcceptor::from(config),
            // A copy per handshake: it shares the certificate resolver and
            // verifier (both `Arc`s), so reloads still apply.
            Some(alpn) => {
                let mut config = (*config).clone();
                config.alpn_protocols = alpn.to_vec();
                TlsAcceptor::from(Arc::new(config))
            }
        }
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

impl reload::Source for TlsServer {
    fn name(&self) -> &'static str {
        "tls certificate"
    }

    fn paths(&self) -> Vec<PathBuf> {
        let settings = &self.inner.settings;
        let mut paths = vec![settings.cert.clone(), settings.key.clone()];
        paths.extend(settings.client_ca.clone());
        paths
    }

    /// Called when a file changed or on SIGHUP: re-reads every file, so a
    /// key and a certificate written in either order load once both match.
    fn reload(&self) -> Result<String, String> {
        let (reloaded, errors) = TlsServer::reload(self, true);
        if errors.is_empty() {
            Ok(format!("reloaded: {}", reloaded.join(", ")))
        } else {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(errors.join("; "))
        }
    }
}
