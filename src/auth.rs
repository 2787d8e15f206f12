//! Who is calling: the tenant of every request comes from here.
//!
//! * With `--auth-tokens FILE`, callers send `authorization: Bearer <token>`.
//!   The file holds one `TENANT SHA256_HEX_OF_TOKEN` pair per line (`#`
//!   starts a comment), so the server never stores a usable token. The file is
//!   re-read on SIGHUP and when it changes; a file that fails to parse keeps
//!   the previous table in force (and logs why), so a bad edit cannot lock
//!   every caller out.
//! * Without it, auth is off (a warning is logged at start) and the tenant is
//!   the `x-tenant-id` metadata, or `default`. For development and trusted
//!   networks only.
//!
//! The tenant is never taken from a request field.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;

use crate::engine::validate;

/// Metadata key of the tenant when auth is off.
pub const TENANT_HEADER: &str = "x-tenant-id";

/// Tenant used when auth is off and no header is sent.
pub const DEFAULT_TENANT: &str = "default";

/// The authenticated caller, attached to each request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// Why a caller was not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer` metadata.
    #[error("missing credentials: send 'authorization: Bearer <token>'")]
    Missing,
    /// The token is not in the tokens file.
    #[error("unknown token")]
    Unknown,
    /// Auth is off and the `x-tenant-id` value is not a valid tenant.
    #[error("invalid x-tenant-id: {0}")]
    BadTenantHeader(String),
}

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

/// SHA-256 of a token → tenant.
type TokenTable = HashMap<[u8; 32], String>;

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
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [tenant, digest_hex] = fields.as_slice() else {
            return Err(error(
                line_number,
                "expected 'TENANT SHA256_HEX_OF_TOKEN'".to_string(),
            ));
        };
        validate::tenant("tenant", tenant).map_err(|e| error(line_number, e.to_string()))?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(digest_hex, &mut digest).map_err(|_| {
            error(
                line_number,
                "the second field must be 64 hex digits (SHA-256 of the token)".to_string(),
            )
        })?;
        if table.insert(digest, (*tenant).to_string()).is_some() {
            return Err(error(
                line_number,
                "the same token hash appears twice".to_string(),
            ));
        }
    }
    Ok(table)
}

/// Resolves the tenant of each request.
#[derive(Debug, Clone)]
pub struct Authenticator {
    /// `None`: auth off. Otherwise the live token table (swapped on reload).
    tokens: Option<Arc<RwLock<TokenTable>>>,
    /// Where the table comes from, for reloads.
    path: Option<PathBuf>,
}

impl Authenticator {
    /// Auth off: tenant from `x-tenant-id`.
    pub fn disabled() -> Self {
        Self {
            tokens: None,
            path: None,
        }
    }

    /// Auth from a tokens file; fails if the file is unreadable or invalid.
    pub fn from_file(path: &Path) -> Result<Self, TokenFileError> {
        let table = read_tokens(path)?;
        Ok(Self {
            tokens: Some(Arc::new(RwLock::new(table))),
            path: Some(path.to_path_buf()),
        })
    }

    /// Whether credentials are required.
    pub fn is_enabled(&self) -> bool {
        self.tokens.is_some()
    }

    /// The tenant of a request with this metadata.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Tenant, AuthError> {
        let Some(tokens) = &self.tokens else {
            let tenant = match metadata.get(TENANT_HEADER) {
                None => DEFAULT_TENANT.to_string(),
                Some(value) => value
                    .to_str()
                    .map_err(|_| AuthError::BadTenantHeader("not ASCII".to_string()))?
                    .to_string(),
            };
            validate::tenant(TENANT_HEADER, &tenant)
                .map_err(|e| AuthError::BadTenantHeader(e.to_string()))?;
            return Ok(Tenant(tenant));
        };
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
        table
            .get(&digest)
            .map(|tenant| Tenant(tenant.clone()))
            .ok_or(AuthError::Unknown)
    }

    /// The tenants of the tokens file (empty with auth off).
    pub fn tenants(&self) -> Vec<String> {
        let Some(tokens) = &self.tokens else {
            return Vec::new();
        };
        let table = tokens.read().unwrap_or_else(|e| e.into_inner());
        let mut tenants: Vec<String> = table.values().cloned().collect();
        tenants.sort();
        tenants.dedup();
        tenants
    }

    /// Re-reads the tokens file; on error the current table stays in force.
    pub fn reload(&self) -> Result<usize, TokenFileError> {
        let (Some(tokens), Some(path)) = (&self.tokens, &self.path) else {
            return Ok(0);
        };
        let table = read_tokens(path)?;
        let count = table.len();
        *tokens.write().unwrap_or_else(|e| e.into_inner()) = table;
        Ok(count)
    }

    /// Reloads on SIGHUP and whenever the file's modification time or size
    /// changes (checked every `poll`). Runs until the task is dropped.
    pub async fn watch(self, poll: Duration) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let mut last_seen = file_stamp(&path);
        #[cfg(unix)]
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
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
            let reason = tokio::select! {
                () = signalled => "sighup",
                () = tokio::time::sleep(poll) => {
                    let stamp = file_stamp(&path);
                    if stamp == last_seen {
                        continue;
                    }
                    last_seen = stamp;
                    "file changed"
                }
            };
            match self.reload() {
                Ok(count) => tracing::info!(reason, tokens = count, "auth tokens reloaded"),
                Err(error) => tracing::error!(
                    reason,
                    %error,
                    "auth tokens file invalid; keeping the previous tokens"
                ),
            }
        }
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

fn file_stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
