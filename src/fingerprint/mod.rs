//! Fingerprint v1: the digest that tells "the same request again" from "a
//! different request under a reused key".
//!
//! ```text
//! fingerprint = SHA-256( frame("idemd-fingerprint-v1")
//!                     || frame(ASCII-uppercase(method))
//!                     || frame(path)
//!                     || frame(canonical_body) )
//! frame(x)    = 8-byte big-endian length of x || x
//! ```
//!
//! `canonical_body` is the canonical JSON of the body (see
//! [`canonical_json`]) when the content type is `application/json` or any
//! `+json` type and the body is not empty; otherwise the body bytes as sent.
//! Length prefixes make the encoding injective: no choice of method, path and
//! body can produce another triple's input. The tenant is not hashed: records
//! are already scoped by tenant. Full specification: `docs/fingerprint.md`;
//! shared vectors: `proto/testdata/fingerprint-v1.json`.

pub mod canonical_json;

use sha2::{Digest, Sha256};

pub use canonical_json::{JsonError, PointerError};

/// Version tag hashed first, so a future v2 can never collide with v1.
pub const VERSION_TAG: &str = "idemd-fingerprint-v1";

/// Largest request body accepted for fingerprinting. Larger requests should
/// send a locally computed `sha256` instead.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Most `ignore_fields` pointers per request (request and policy combined).
pub const MAX_IGNORE_FIELDS: usize = 64;

/// Longest accepted JSON Pointer.
pub const MAX_POINTER_BYTES: usize = 1024;

/// Length of a fingerprint in bytes.
pub const FINGERPRINT_LEN: usize = 32;

/// A request as the fingerprint sees it.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// HTTP method; uppercased (ASCII) before hashing.
    pub method: &'a str,
    /// Request path, hashed as given.
    pub path: &'a str,
    /// Body bytes.
    pub body: &'a [u8],
    /// Media type; selects JSON canonicalization.
    pub content_type: &'a str,
}

/// Why a fingerprint cannot be computed. Each variant knows which request
/// field is at fault so the caller's error can name it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FingerprintError {
    /// The body exceeds [`MAX_BODY_BYTES`].
    #[error(
        "body is {size} bytes; the limit is {MAX_BODY_BYTES} (send a sha256 fingerprint instead)"
    )]
    BodyTooLarge {
        /// Size of the body that was sent.
        size: usize,
    },
    /// The JSON body is not acceptable.
    #[error("{0}")]
    Json(#[from] JsonError),
    /// An ignore_fields entry is not a usable JSON Pointer.
    #[error("ignore_fields[{index}] {error}")]
    Pointer {
        /// Position in the combined list (request entries first).
        index: usize,
        /// What is wrong with it.
        error: PointerError,
    },
    /// Too many or too long ignore_fields entries.
    #[error("ignore_fields: {0}")]
    PointerLimit(String),
}

/// True for `application/json` and `*/*+json` media types (parameters such
/// as `; charset=utf-8` ignored, case-insensitive).
pub fn is_json_content_type(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || (essence.contains('/') && essence.ends_with("+json"))
}

/// Checks a list of JSON Pointers and splits each into tokens.
pub fn parse_ignore_fields(pointers: &[&str]) -> Result<Vec<Vec<String>>, FingerprintError> {
    if pointers.len() > MAX_IGNORE_FIELDS {
        return Err(FingerprintError::PointerLimit(format!(
            "{} entries; the limit is {MAX_IGNORE_FIELDS}",
            pointers.len()
        )));
    }
    pointers
        .iter()
        .enumerate()
        .map(|(index, pointer)| {
            if pointer.len() > MAX_POINTER_BYTES {
                return Err(FingerprintError::PointerLimit(format!(
                    "entry {index} is {} bytes; the limit is {MAX_POINTER_BYTES}",
                    pointer.len()
                )));
            }
            canonical_json::parse_pointer(pointer)
                .map_err(|error| FingerprintError::Pointer { index, error })
        })
        .collect()
}

/// The canonical body that fingerprint v1 hashes.
pub fn canonical_body(
    request: &RequestParts<'_>,
    ignore_fields: &[&str],
) -> Result<Vec<u8>, FingerprintError> {
    if request.body.len() > MAX_BODY_BYTES {
        return Err(FingerprintError::BodyTooLarge {
            size: request.body.len(),
        });
    }
    let pointers = parse_ignore_fields(ignore_fields)?;
    if request.body.is_empty() || !is_json_content_type(request.content_type) {
        return Ok(request.body.to_vec());
    }
    let mut value = canonical_json::parse(request.body)?;
    canonical_json::remove_pointers(&mut value, &pointers);
    Ok(canonical_json::serialize(&value))
}

/// Fingerprint v1 of a request.
pub fn fingerprint_v1(
    request: &RequestParts<'_>,
    ignore_fields: &[&str],
) -> Result<[u8; FINGERPRINT_LEN], FingerprintError> {
    let body = canonical_body(request, ignore_fields)?;
    let method = request.method.to_ascii_uppercase();
    let mut hasher = Sha256::new();
    for part in [
        VERSION_TAG.as_bytes(),
        method.as_bytes(),
        request.path.as_bytes(),
        &body,
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    Ok(hasher.finalize().into())
}

/// First 12 hex digits of SHA-256 of `value`: how keys, tokens and
/// fingerprints appear in logs (never raw).
pub fn short_hash(value: &[u8]) -> String {
    let digest = Sha256::digest(value);
    hex::encode(&digest[..6])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct VectorFile {
        vectors: Vec<Vector>,
    }

    #[derive(serde::Deserialize)]
    struct Vector {
        name: String,
        method: String,
        path: String,
        content_type: String,
        #[serde(default)]
        body_utf8: Option<String>,
        #[serde(default)]
        body_hex: Option<String>,
        #[serde(default)]
        ignore_fields: Vec<String>,
        #[serde(default)]
        canonical_body_hex: Option<String>,
        #[serde(default)]
        sha256_hex: Option<String>,
        #[serde(default)]
        error: Option<String>,
    }

    fn error_class(error: &FingerprintError) -> &'static str {
        match error {
            FingerprintError::BodyTooLarge { .. } => "body_too_large",
            FingerprintError::Json(JsonError::Malformed { .. }) => "malformed_json",
            FingerprintError::Json(JsonError::DuplicateKey { .. }) => "duplicate_key",
            FingerprintError::Json(JsonError::TooDeep { .. }) => "too_deep",
            FingerprintError::Pointer { .. } | FingerprintError::PointerLimit(_) => {
                "invalid_pointer"
            }
        }
    }

    #[test]
    fn shared_vectors_pass() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/proto/testdata/fingerprint-v1.json"
        );
        let text = std::fs::read_to_string(path).expect("vector file exists");
        let file: VectorFile = serde_json::from_str(&text).expect("vector file parses");
        assert!(file.vectors.len() >= 25, "at least 25 vectors");
        for vector in &file.vectors {
            let body = match (&vector.body_utf8, &vector.body_hex) {
                (Some(text), None) => text.as_bytes().to_vec(),
                (None, Some(hex_body)) => hex::decode(hex_body).expect("hex body"),
                _ => panic!("{}: exactly one of body_utf8/body_hex", vector.name),
            };
            let parts = RequestParts {
                method: &vector.method,
                path: &vector.path,
                body: &body,
                content_type: &vector.content_type,
            };
            let ignore: Vec<&str> = vector.ignore_fields.iter().map(String::as_str).collect();
            let result = fingerprint_v1(&parts, &ignore);
            match (&vector.error, &vector.sha256_hex) {
                (Some(expected), None) => {
                    let error = result.expect_err(&vector.name);
                    assert_eq!(error_class(&error), expected, "{}", vector.name);
                }
                (None, Some(expected)) => {
                    let digest = result.unwrap_or_else(|e| panic!("{}: {e}", vector.name));
                    assert_eq!(&hex::encode(digest), expected, "{}", vector.name);
                    let canonical = canonical_body(&parts, &ignore).expect("canonical body");
                    assert_eq!(
                        Some(hex::encode(canonical)),
                        vector.canonical_body_hex,
                        "{}: canonical body",
                        vector.name
                    );
                }
                _ => panic!("{}: exactly one of error/sha256_hex", vector.name),
            }
        }
    }

    #[test]
    fn json_content_types() {
        assert!(is_json_content_type("application/json"));
        assert!(is_json_content_type("Application/JSON; charset=utf-8"));
        assert!(is_json_content_type("application/problem+json"));
        assert!(!is_json_content_type("text/plain"));
        assert!(!is_json_content_type("application/jsonx"));
        assert!(!is_json_content_type(""));
    }

    #[test]
    fn length_prefixes_keep_fields_apart() {
        let a = RequestParts {
            method: "POST",
            path: "/ab",
            body: b"c",
            content_type: "",
        };
        let b = RequestParts {
            method: "POST",
            path: "/a",
            body: b"bc",
            content_type: "",
        };
        assert_ne!(fingerprint_v1(&a, &[]), fingerprint_v1(&b, &[]));
    }
}
