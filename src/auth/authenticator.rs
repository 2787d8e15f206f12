//! The [`Authenticator`]: resolves the caller of every request from its
//! credentials (bearer token, verified client certificate, or with auth
//! off the `x-tenant-id` metadata), and the tokens file it reads. The rules
//! are in the module docs of [`crate::auth`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;

use crate::engine::validate;
use crate::reload;

use super::caller::{Caller, Role, parse_endpoint_prefixes};
use super::client_cert::ClientTenants;
use super::error::AuthError;
use super::protected::{Access, is_loopback};

/// Metadata key of the tenant when auth is off.
pub const TENANT_HEADER: &str = "x-tenant-id";

/// The verified client certificate chain (leaf first) of a call that did
/// not come through tonic's transport: the HTTP front doors
/// ([`crate::web`]) terminate TLS themselves and put the chain of the
/// connection in the extensions of the `tonic::Request` they hand to the
/// gRPC handlers, so mTLS callers are mapped to tenants by the same code.
#[derive(Debug, Clone)]
pub struct PeerCertificates(pub Arc<Vec<rustls::pki_types::CertificateDer<'static>>>);

/// Tenant used when auth is off and no header is sent.
pub const DEFAULT_TENANT: &str = "default";

/// A problem in the tokens file, with its line number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}: {description}")]
pub struct TokenFileError {
    /// The file.
    pub path: String,
    /// 1-based line number (0 when the file cannot be read).
    pub line: usize,
    /// What is wrong.
    pub description: String,
}

/// SHA-256 of a token → what it grants.
type TokenTable = HashMap<[u8; 32], Caller>;

/// Parses a tokens file's text.
pub fn parse_tokens(path: &Path, text: &str) -> Result<TokenTable, TokenFileError> {
    let error = |line: usize, description: String| TokenFileError {
        path: path.display().to_string(),
        line,
        description,
    };
    let mut table = TokenTable::new();
    for (index, raw) in text.lines().enumerate() {
        let line_number = index + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.splitn(4, char::is_whitespace).map(str::trim);
        let (Some(tenant), Some(digest_hex)) = (fields.next(), fields.next()) else {
            return Err(error(
                line_number,
                "expected 'TENANT SHA256_HEX_OF_TOKEN [ROLE [ENDPOINT_PREFIX, ...]]'".to_string(),
            ));
        };
        validate::tenant("tenant", tenant).map_err(|e| error(line_number, e.to_string()))?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(digest_hex.trim(), &mut digest).map_err(|_| {
            error(
                line_number,
                "the second field must be 64 hex digits (SHA-256 of the token)".to_string(),
            )
        })?;
        let role = match fields.next().map(str::trim).filter(|r| !r.is_empty()) {
            // Two-column lines predate roles and granted everything but
            // admin: they keep doing so.
            None => Role::Reconciler,
            Some(name) => Role::parse(name).ok_or_else(|| {
                error(
                    line_number,
                    format!("unknown role {name:?}: expected service, reconciler or admin"),
                )
            })?,
        };
        let endpoint_prefixes = parse_endpoint_prefixes(fields.next().unwrap_or(""))
            .map_err(|description| error(line_number, description))?;
        let caller = Caller {
            tenant: (*tenant).to_string(),
            role,
            endpoint_prefixes,
        };
        if table.insert(digest, caller).is_some() {
            return Err(error(
                line_number,
                "the same token hash appears twice".to_string(),
            ));
        }
    }
    Ok(table)
}

/// Resolves the tenant of each request. Its whole `impl` is in this file;
/// protected mode's reasons and its [`Access`] levels are in
/// `protected.rs`.
#[derive(Debug, Clone)]
pub struct Authenticator {
    /// `None`: auth off. Otherwise the live token table (swapped on reload).
    tokens: Option<Arc<RwLock<TokenTable>>>,
    /// Where the table comes from, for reloads.
    path: Option<PathBuf>,
    /// mTLS: client-certificate SAN → caller.
    certs: Option<ClientTenants>,
    /// With auth off: serve non-loopback callers too (protected mode off).
    allow_remote: bool,
}

impl Authenticator {
    /// Auth off: tenant from `x-tenant-id`, loopback callers only until
    /// [`Self::allowing_unauthenticated_remote`].
    pub fn disabled() -> Self {
        Self {
            tokens: None,
            path: None,
            certs: None,
            allow_remote: false,
        }
    }

    /// Auth from a tokens file; fails if the file is unreadable or invalid.
    pub fn from_file(path: &Path) -> Result<Self, TokenFileError> {
        let table = read_tokens(path)?;
        Ok(Self {
            tokens: Some(Arc::new(RwLock::new(table))),
            path: Some(path.to_path_buf()),
            certs: None,
            allow_remote: false,
        })
    }

    /// Also (or only) authenticates callers by their client certificate.
    pub fn with_client_tenants(mut self, certs: ClientTenants) -> Self {
        self.certs = Some(certs);
        self
    }

    /// Whether credentials are required.
    pub fn is_enabled(&self) -> bool {
        self.tokens.is_some() || self.certs.is_some()
    }

    /// The caller of a request: its metadata, its peer address (tonic's
    /// connection info, which the front doors fill in too) and, over mTLS,
    /// its verified client certificate.
    pub fn authenticate_request<T>(
        &self,
        request: &tonic::Request<T>,
    ) -> Result<Caller, AuthError> {
        let certs = request.peer_certs().or_else(|| {
            request
                .extensions()
                .get::<PeerCertificates>()
                .map(|certs| Arc::clone(&certs.0))
        });
        self.authenticate_with(
            request.metadata(),
            certs.as_deref().map(Vec::as_slice),
            request.remote_addr(),
        )
    }

    /// The caller of a request with this metadata and client certificate
    /// chain (leaf first), from `peer`.
    pub fn authenticate_with(
        &self,
        metadata: &MetadataMap,
        peer_certs: Option<&[rustls::pki_types::CertificateDer<'_>]>,
        peer: Option<SocketAddr>,
    ) -> Result<Caller, AuthError> {
        let from_cert = match &self.certs {
            Some(certs) => Some(certs.caller(peer_certs)?),
            None => None,
        };
        let from_token = match &self.tokens {
            Some(tokens) => Some(Self::token_caller(tokens, metadata)?),
            None => None,
        };
        match (from_token, from_cert) {
            (Some(token), Some(cert)) => token.narrowed(&cert),
            (Some(caller), None) | (None, Some(caller)) => Ok(caller),
            (None, None) => {
                self.admit_peer(peer)?;
                Self::header_caller(metadata)
            }
        }
    }

    /// Auth off: the tenant from `x-tenant-id`, with every right.
    fn header_caller(metadata: &MetadataMap) -> Result<Caller, AuthError> {
        let tenant = match metadata.get(TENANT_HEADER) {
            None => DEFAULT_TENANT.to_string(),
            Some(value) => value
                .to_str()
                .map_err(|_| AuthError::BadTenantHeader("not ASCII".to_string()))?
                .to_string(),
        };
        validate::tenant(TENANT_HEADER, &tenant)
            .map_err(|e| AuthError::BadTenantHeader(e.to_string()))?;
        Ok(Caller {
            tenant,
            role: Role::Admin,
            endpoint_prefixes: None,
        })
    }

    /// The caller of the bearer token in `metadata`.
    fn token_caller(
        tokens: &RwLock<TokenTable>,
        metadata: &MetadataMap,
    ) -> Result<Caller, AuthError> {
        let header = metadata
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .ok_or(AuthError::Missing)?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or(AuthError::Missing)?;
        // Lookup by digest: the table never holds a usable token, and timing
        // differences can only reveal bits of a hash, not of the token.
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let table = tokens.read().unwrap_or_else(|e| e.into_inner());
        table.get(&digest).cloned().ok_or(AuthError::Unknown)
    }

    /// The tenants of the tokens file and the client-tenants mapping (empty
    /// with auth off).
    pub fn tenants(&self) -> Vec<String> {
        let mut tenants: Vec<String> = self
            .certs
            .as_ref()
            .map(ClientTenants::tenants)
            .unwrap_or_default();
        if let Some(tokens) = &self.tokens {
            let table = tokens.read().unwrap_or_else(|e| e.into_inner());
            tenants.extend(table.values().map(|c| c.tenant.clone()));
        }
        tenants.sort();
        tenants.dedup();
        tenants
    }

    /// The tokens file as a [`reload::Source`] (`None` with no tokens
    /// file). The client-tenants mapping is its own source.
    pub fn tokens_source(&self) -> Option<Arc<dyn reload::Source>> {
        let tokens = self.tokens.clone()?;
        let path = self.path.clone()?;
        Some(Arc::new(TokensSource { tokens, path }))
    }
}

/// The tokens file, re-read in place.
struct TokensSource {
    /// The table the authenticator reads.
    tokens: Arc<RwLock<TokenTable>>,
    /// The file.
    path: PathBuf,
}

impl reload::Source for TokensSource {
    fn name(&self) -> &'static str {
        "auth tokens"
    }

    fn paths(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    fn reload(&self) -> Result<String, String> {
        let table = read_tokens(&self.path).map_err(|e| e.to_string())?;
        let count = table.len();
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = table;
        Ok(format!("{count} tokens"))
    }
}

fn read_tokens(path: &Path) -> Result<TokenTable, TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| TokenFileError {
        path: path.display().to_string(),
        line: 0,
        description: format!("cannot read: {e}"),
    })?;
    parse_tokens(path, &text)
}

/// Protected mode (`protected.rs` says why): with auth off, which peers
/// are served at all.
impl Authenticator {
    /// With auth off, also admits callers from other machines
    /// (`--allow-unauthenticated-remote`); no effect with auth on.
    pub fn allowing_unauthenticated_remote(mut self, allow: bool) -> Self {
        self.allow_remote = allow;
        self
    }

    /// Which callers are admitted.
    pub fn access(&self) -> Access {
        if self.is_enabled() {
            Access::Credentials
        } else if self.allow_remote {
            Access::UnauthenticatedRemote
        } else {
            Access::LoopbackOnly
        }
    }

    /// Refuses a caller at `peer` that protected mode does not admit: with
    /// auth off and no opt-out, anything but a loopback address (an unknown
    /// address included). The front doors ask once per connection; the
    /// gRPC handlers once per call, through [`Self::authenticate_request`].
    pub fn admit_peer(&self, peer: Option<SocketAddr>) -> Result<(), AuthError> {
        match self.access() {
            Access::Credentials | Access::UnauthenticatedRemote => Ok(()),
            Access::LoopbackOnly if peer.is_some_and(|p| is_loopback(p.ip())) => Ok(()),
            Access::LoopbackOnly => Err(AuthError::RemoteWithoutAuthentication { peer }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Action;

    fn hash(token: &str) -> String {
        hex::encode(Sha256::digest(token.as_bytes()))
    }

    #[test]
    fn parses_comments_and_pairs() {
        let text = format!(
            "# tokens\nacme {}  # billing\n\nglobex {}\n",
            hash("a"),
            hash("b")
        );
        let table = parse_tokens(Path::new("t"), &text).expect("valid");
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn rejects_bad_lines_with_line_numbers() {
        let err = parse_tokens(Path::new("t"), "acme\n").expect_err("one field");
        assert_eq!(err.line, 1);
        let err = parse_tokens(Path::new("t"), &format!("ok {}\nbad zz\n", hash("a")))
            .expect_err("bad hex");
        assert_eq!(err.line, 2);
        let err = parse_tokens(Path::new("t"), &format!("bad/tenant {}\n", hash("a")))
            .expect_err("bad tenant");
        assert_eq!(err.line, 1);
    }

    #[test]
    fn roles_and_endpoint_prefixes() {
        let text = format!(
            "legacy {}
svc {} service
rec {} reconciler
adm {} admin POST /v1/payments, POST /v1/refunds # two
",
            hash("l"),
            hash("s"),
            hash("r"),
            hash("a")
        );
        let table = parse_tokens(Path::new("t"), &text).expect("valid");
        let get = |token: &str| {
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            table.get(&digest).cloned().expect("present")
        };
        assert_eq!(
            get("l").role,
            Role::Reconciler,
            "two columns keep their grant"
        );
        assert_eq!(get("s").role, Role::Service);
        let admin = get("a");
        assert_eq!(admin.role, Role::Admin);
        assert_eq!(
            admin.endpoint_prefixes.as_deref(),
            Some(
                &[
                    "POST /v1/payments".to_string(),
                    "POST /v1/refunds".to_string()
                ][..]
            )
        );

        let service = get("s");
        assert!(service.authorize(Action::Execute, "POST /x").is_ok());
        assert_eq!(
            service.authorize(Action::Reconcile, "POST /x"),
            Err(AuthError::RoleNotAllowed { role: "service" })
        );
        assert!(service.authorize(Action::ReadAudit, "").is_err());
        let legacy = get("l");
        assert!(legacy.authorize(Action::Reconcile, "").is_ok());
        assert!(legacy.authorize(Action::ReadAudit, "").is_ok());
        assert!(
            admin
                .authorize(Action::Execute, "POST /v1/payments/eu")
                .is_ok()
        );
        assert_eq!(
            admin.authorize(Action::Execute, "POST /v1/orders"),
            Err(AuthError::EndpointNotAllowed)
        );
        assert_eq!(
            admin.authorize(Action::Reconcile, ""),
            Err(AuthError::EndpointNotAllowed),
            "an allow-list forbids listings across every endpoint"
        );
    }

    #[test]
    fn combined_credentials_narrow_each_other() {
        let caller = |tenant: &str, role, prefixes: Option<&[&str]>| Caller {
            tenant: tenant.to_string(),
            role,
            endpoint_prefixes: prefixes
                .map(|list| Arc::from(list.iter().map(|p| p.to_string()).collect::<Vec<_>>())),
        };
        let token = caller(
            "acme",
            Role::Admin,
            Some(&["POST /v1/pay", "GET /v1/orders"]),
        );
        let cert = caller(
            "acme",
            Role::Service,
            Some(&["POST /v1/payments", "PUT /x"]),
        );
        let both = token.clone().narrowed(&cert).expect("same tenant");
        assert_eq!(both.role, Role::Service, "the lesser role");
        assert_eq!(
            both.endpoint_prefixes.as_deref(),
            Some(&["POST /v1/payments".to_string()][..]),
            "only endpoints both lists allow"
        );
        let open = caller("acme", Role::Reconciler, None);
        assert_eq!(
            open.clone()
                .narrowed(&cert)
                .expect("same tenant")
                .endpoint_prefixes,
            cert.endpoint_prefixes
        );
        assert_eq!(
            open.narrowed(&caller("acme", Role::Admin, None))
                .expect("same")
                .role,
            Role::Reconciler
        );
        assert_eq!(
            token.narrowed(&caller("globex", Role::Admin, None)),
            Err(AuthError::TenantMismatch)
        );
    }

    #[test]
    fn rejects_unknown_roles_and_empty_prefixes() {
        let err = parse_tokens(
            Path::new("t"),
            &format!(
                "acme {} root
",
                hash("a")
            ),
        )
        .expect_err("unknown role");
        assert!(err.description.contains("unknown role"), "{err}");
        let err = parse_tokens(
            Path::new("t"),
            &format!(
                "acme {} service POST /a,,
",
                hash("a")
            ),
        )
        .expect_err("empty prefix");
        assert!(err.description.contains("empty"), "{err}");
    }
}
