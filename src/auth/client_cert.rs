//! Client certificate → tenant: the `--tls-client-tenants` mapping.
//!
//! The TLS layer ([`crate::tls`]) verifies that a client certificate chains
//! to the client CA; who the verified certificate *is* is an auth decision
//! and lives here, beside the tokens file it is combined with.
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
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::CertificateDer;

use super::caller::{Caller, Role, parse_endpoint_prefixes};
use super::error::AuthError;
use crate::engine::validate;
use crate::reload;

/// A problem in the client-tenants file, naming the file (and the line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}: {description}")]
pub struct MappingFileError {
    /// The file.
    pub path: String,
    /// 1-based line number (0 when the file cannot be read).
    pub line: usize,
    /// What is wrong.
    pub description: String,
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
fn parse_client_tenants(path: &Path, text: &str) -> Result<SanTable, MappingFileError> {
    let error = |line: usize, description: String| MappingFileError {
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
        let endpoint_prefixes = parse_endpoint_prefixes(&rest)
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
    pub fn from_file(path: &Path) -> Result<Self, MappingFileError> {
        Ok(Self {
            table: Arc::new(RwLock::new(read_client_tenants(path)?)),
            path: path.to_path_buf(),
        })
    }

    /// A mapping from text (tests).
    pub fn from_text(path: &Path, text: &str) -> Result<Self, MappingFileError> {
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
    pub fn reload(&self) -> Result<usize, MappingFileError> {
        let table = read_client_tenants(&self.path)?;
        let count = table.len();
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
        Ok(count)
    }
}

impl reload::Source for ClientTenants {
    fn name(&self) -> &'static str {
        "tls client tenants"
    }

    fn paths(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    fn reload(&self) -> Result<String, String> {
        ClientTenants::reload(self)
            .map(|count| format!("{count} entries"))
            .map_err(|e| e.to_string())
    }
}

fn read_client_tenants(path: &Path) -> Result<SanTable, MappingFileError> {
    let unreadable = |description: String| MappingFileError {
        path: path.display().to_string(),
        line: 0,
        description,
    };
    let bytes = std::fs::read(path).map_err(|e| unreadable(format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8 text".to_string()))?;
    parse_client_tenants(path, &text)
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
            let MappingFileError {
                path,
                line: at,
                description,
            } = &error;
            assert_eq!(path, "/etc/idemd/m");
            assert_eq!(*at, line, "{error}");
            assert!(description.contains(needle), "{error}");
        }
    }
}
