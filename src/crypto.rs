//! Encryption at rest: a keyring of AES-256-GCM keys and the sealed-value
//! envelope, on bytes only. What is sealed and with which associated data is
//! the caller's business ([`crate::store::response`] seals stored
//! responses); this module knows nothing of records or stores.
//!
//! # Why
//!
//! A stored response is whatever the protected endpoint answered: payment
//! results, order ids, personal data. A copied database file, a backup, a
//! CQL snapshot or a compromised storage node must not reveal them. The
//! response (status, headers, body, body reference) is therefore sealed
//! before it reaches either backend; everything else in a record stays in
//! clear because lookups, conditional writes, expiry and the pending index
//! need it: tenant, endpoint and key (the row key), state, fingerprint (a
//! SHA-256 digest, not the request), lease token, attempt, timestamps and
//! the failure reason.
//!
//! # Keyring file
//!
//! ```text
//! # KEY_ID BASE64(32 random bytes)
//! 2024-01 q3Vb...=
//! 2025-06 9fXk...=
//! ```
//!
//! Every key decrypts; the LAST one encrypts new writes. Rotation is
//! therefore "append a line": the file is re-read on SIGHUP and when it
//! changes ([`crate::reload`]), new values use the new key, old values keep
//! decrypting with theirs, no restart. A file that fails to load (a typo,
//! a half-written Secret) keeps the previous keys in force and is logged. A key may be removed only once no
//! live value uses it (after the longest dedup window, `max_ttl`, has
//! passed since the rotation). Key ids are short ASCII tokens
//! (`[A-Za-z0-9._-]`, at most [`MAX_KEY_ID_LEN`] bytes) written into every
//! sealed value, so an error can say which key is missing.
//!
//! # Envelope
//!
//! `0xE1 | key id length (1 byte) | key id | nonce (12 bytes) | ciphertext
//! and tag (16 bytes)`. The first byte versions the format and tells a
//! sealed value from a plaintext one: an encoded response (protobuf) never
//! starts with `0xE1` (its first byte is the tag of field 1 to 4), so values
//! written before encryption was turned on stay readable and turning it on
//! needs no migration. Turning it off again makes new writes plaintext, but
//! values sealed earlier still need the keyring to be read: without it they
//! fail with an error naming their key id (never garbage, never success).
//!
//! The nonce is 96 random bits from the operating system's CSPRNG per
//! write; with at most a few billion writes per key the collision
//! probability stays far below 2^-32 (NIST SP 800-38D), another reason to
//! rotate yearly. The associated data binds the ciphertext to the caller's
//! context (for a response: its record's tenant, endpoint and key) and to
//! the envelope header (format and key id), so a value copied to another
//! row, or relabelled with another key id, fails to decrypt.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// First byte of a sealed value, format version 1.
pub const ENVELOPE_V1: u8 = 0xE1;

/// Longest key id, in bytes.
pub const MAX_KEY_ID_LEN: usize = 32;

/// Bytes of an AES-256 key.
const KEY_LEN: usize = 32;

/// Bytes of the GCM authentication tag.
const TAG_LEN: usize = 16;

/// Why a keyring file could not be loaded. Every message names the file
/// and, for content errors, the line.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    /// The file could not be read.
    #[error("encryption keyring {path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line is not `KEY_ID BASE64_32_BYTES`.
    #[error("encryption keyring {path}:{line}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong (never the key material).
        message: String,
    },
    /// The file has no key.
    #[error("encryption keyring {path}: no keys (expected lines `KEY_ID BASE64_32_BYTES`)")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Why a value could not be sealed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// The value names a key id the keyring does not have.
    #[error(
        "value is encrypted with key id {key_id:?}, which is not in the encryption keyring (keep every key that encrypted live values)"
    )]
    UnknownKey {
        /// The key id in the envelope.
        key_id: String,
    },
    /// The value is sealed but no keyring is configured.
    #[error(
        "value is encrypted with key id {key_id:?} but no encryption keyring is configured (--encryption-keys): it is needed to read values written while encryption was on"
    )]
    NoKeyring {
        /// The key id in the envelope.
        key_id: String,
    },
    /// Authentication failed: the key with that id is not the one that
    /// sealed the value, or the value was altered or copied from another
    /// record.
    #[error(
        "value encrypted with key id {key_id:?} failed authentication: the key material for that id differs from the one that encrypted it, or the value was altered or copied from another record"
    )]
    Authentication {
        /// The key id in the envelope.
        key_id: String,
    },
    /// Not an envelope this build understands.
    #[error("malformed encrypted value: {0}")]
    Malformed(String),
    /// Sealing failed (the CSPRNG failed).
    #[error("cannot encrypt: {0}")]
    Seal(String),
}

struct KeyEntry {
    id: String,
    key: LessSafeKey,
}

/// The keys of a keyring file: the last one seals, all of them open.
///
/// The keys in force can be replaced while the server runs
/// ([`Keyring::reload`], driven by [`crate::reload`] on SIGHUP and when the
/// file changes): a write seals with the active key of the moment, a read
/// opens with whatever key its value names. A file that fails to load keeps
/// the previous keys in force.
pub struct Keyring {
    /// The file the keys came from (named in errors; re-read on reload).
    path: PathBuf,
    /// The keys in force; swapped whole by a reload.
    keys: RwLock<Arc<KeySet>>,
    rng: SystemRandom,
}

/// One version of the file's keys.
struct KeySet {
    /// In file order; never empty.
    keys: Vec<KeyEntry>,
}

impl fmt::Debug for Keyring {
    // Key ids only: key material never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("key_ids", &self.key_ids())
            .finish_non_exhaustive()
    }
}

fn valid_key_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_KEY_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Keyring {
    /// Reads and parses a keyring file. Warns (does not fail) when the file
    /// is accessible to every user of the host: the keys are as secret as
    /// the data they protect. Group access is not warned about: it is how
    /// Kubernetes hands a Secret to a non-root pod (root-owned files,
    /// readable through `fsGroup`).
    pub fn load(path: &Path) -> Result<Self, KeyringError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyringError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        warn_if_readable_by_others(path);
        Self::parse(path, &text)
    }

    /// Parses keyring text; `path` only names the source in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, KeyringError> {
        let parse_error = |line: usize, message: String| KeyringError::Parse {
            path: path.to_path_buf(),
            line,
            message,
        };
        let mut keys: Vec<KeyEntry> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let (Some(id), Some(encoded), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(parse_error(
                    line_no,
                    "expected `KEY_ID BASE64_32_BYTES`".to_string(),
                ));
            };
            if !valid_key_id(id) {
                return Err(parse_error(
                    line_no,
                    format!("key id must be 1 to {MAX_KEY_ID_LEN} characters of A-Z a-z 0-9 . _ -"),
                ));
            }
            if keys.iter().any(|entry| entry.id == id) {
                return Err(parse_error(line_no, format!("duplicate key id {id:?}")));
            }
            // The decoded bytes are never echoed: an error must not leak a
            // (possibly almost right) key into logs.
            let material = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|_| parse_error(line_no, format!("key {id:?} is not valid base64")))?;
            if material.len() != KEY_LEN {
                return Err(parse_error(
                    line_no,
                    format!(
                        "key {id:?} is {} bytes; AES-256 needs {KEY_LEN} (e.g. `head -c 32 /dev/urandom | base64`)",
                        material.len()
                    ),
                ));
            }
            let key = UnboundKey::new(&AES_256_GCM, &material)
                .map_err(|_| parse_error(line_no, format!("key {id:?} is not usable")))?;
            keys.push(KeyEntry {
                id: id.to_string(),
                key: LessSafeKey::new(key),
            });
        }
        if keys.is_empty() {
            return Err(KeyringError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            keys: RwLock::new(Arc::new(KeySet { keys })),
            rng: SystemRandom::new(),
        })
    }

    /// Re-reads the file; on success its keys replace the ones in force and
    /// the new active key id is returned. On error the keys in force stay.
    pub fn reload(&self) -> Result<String, KeyringError> {
        let fresh = Self::load(&self.path)?;
        let keys = Arc::clone(&fresh.keys.read().unwrap_or_else(|e| e.into_inner()));
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
        Ok(self.active_key_id())
    }

    fn current(&self) -> Arc<KeySet> {
        Arc::clone(&self.keys.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The id of the key new values are sealed with (the last line).
    pub fn active_key_id(&self) -> String {
        // `parse` never builds an empty keyring.
        self.current()
            .keys
            .last()
            .map_or_else(String::new, |entry| entry.id.clone())
    }

    /// Every key id, in file order.
    pub fn key_ids(&self) -> Vec<String> {
        self.current()
            .keys
            .iter()
            .map(|entry| entry.id.clone())
            .collect()
    }

    /// Seals `plaintext` with the active key; `aad` is the caller's context
    /// (what the value belongs to), authenticated but not stored.
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let keys = self.current();
        let entry = keys
            .keys
            .last()
            .ok_or_else(|| CryptoError::Seal("empty keyring".to_string()))?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| CryptoError::Seal("the system random generator failed".to_string()))?;
        let header = header(&entry.id);
        let mut out = Vec::with_capacity(header.len() + NONCE_LEN + plaintext.len() + TAG_LEN);
        out.extend_from_slice(&header);
        out.extend_from_slice(&nonce);
        let mut sealed = plaintext.to_vec();
        entry
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(full_aad(&header, aad)),
                &mut sealed,
            )
            .map_err(|_| CryptoError::Seal("value too large".to_string()))?;
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// Opens a value made by [`Keyring::seal`] with the same `aad`.
    pub fn open(&self, aad: &[u8], envelope: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let parts = Envelope::parse(envelope)?;
        let keys = self.current();
        let entry = keys
            .keys
            .iter()
            .find(|entry| entry.id == parts.key_id)
            .ok_or_else(|| CryptoError::UnknownKey {
                key_id: parts.key_id.to_string(),
            })?;
        let mut in_out = parts.sealed.to_vec();
        let plaintext = entry
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(parts.nonce),
                Aad::from(full_aad(parts.header, aad)),
                &mut in_out,
            )
            .map_err(|_| CryptoError::Authentication {
                key_id: parts.key_id.to_string(),
            })?;
        Ok(plaintext.to_vec())
    }
}

impl crate::reload::Source for Keyring {
    fn name(&self) -> &'static str {
        "encryption keyring"
    }

    fn paths(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    fn reload(&self) -> Result<String, String> {
        Keyring::reload(self)
            .map(|active| format!("active key id {active:?}, {} keys", self.key_ids().len()))
            .map_err(|error| error.to_string())
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(metadata) = std::fs::metadata(path) {
        let mode = metadata.permissions().mode();
        if mode & 0o007 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", mode & 0o777),
                "the encryption keyring is accessible to every user of the host; restrict it (chmod 600, or 640 for a group)"
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

fn header(key_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + key_id.len());
    out.push(ENVELOPE_V1);
    // Key ids are validated to at most MAX_KEY_ID_LEN (< 256) bytes.
    out.push(u8::try_from(key_id.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(key_id.as_bytes());
    out
}

/// Header, then the caller's context: the key id is authenticated too.
fn full_aad(header: &[u8], aad: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(header.len() + aad.len());
    out.extend_from_slice(header);
    out.extend_from_slice(aad);
    out
}

/// The parts of a sealed value.
struct Envelope<'a> {
    header: &'a [u8],
    key_id: &'a str,
    nonce: [u8; NONCE_LEN],
    sealed: &'a [u8],
}

impl<'a> Envelope<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Self, CryptoError> {
        let malformed = |what: &str| CryptoError::Malformed(what.to_string());
        let (&version, rest) = bytes.split_first().ok_or_else(|| malformed("empty"))?;
        if version != ENVELOPE_V1 {
            return Err(CryptoError::Malformed(format!(
                "unknown envelope version byte {version:#04x}"
            )));
        }
        let (&id_len, rest) = rest
            .split_first()
            .ok_or_else(|| malformed("truncated header"))?;
        let id_len = usize::from(id_len);
        if rest.len() < id_len {
            return Err(malformed("truncated key id"));
        }
        let (id, rest) = rest.split_at(id_len);
        let key_id = std::str::from_utf8(id)
            .ok()
            .filter(|id| valid_key_id(id))
            .ok_or_else(|| malformed("invalid key id"))?;
        let (nonce, sealed) = rest
            .split_first_chunk::<NONCE_LEN>()
            .ok_or_else(|| malformed("truncated nonce"))?;
        if sealed.len() < TAG_LEN {
            return Err(malformed("truncated ciphertext"));
        }
        Ok(Self {
            header: &bytes[..2 + id_len],
            key_id,
            nonce: *nonce,
            sealed,
        })
    }
}

/// Whether `bytes` is a sealed value (as opposed to a plaintext encoding).
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.first() == Some(&ENVELOPE_V1)
}

/// The key id a sealed value was encrypted with (for tests and tooling).
pub fn sealed_key_id(bytes: &[u8]) -> Result<&str, CryptoError> {
    Envelope::parse(bytes).map(|envelope| envelope.key_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="; // 32 x 0x01
    const K2: &str = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="; // 32 x 0x02

    fn ring(text: &str) -> Keyring {
        Keyring::parse(Path::new("keys.txt"), text).expect("valid keyring")
    }

    fn parse_error(text: &str) -> String {
        Keyring::parse(Path::new("keys.txt"), text)
            .expect_err("invalid keyring")
            .to_string()
    }

    #[test]
    fn round_trip_hides_the_plaintext() {
        let keys = ring(&format!("# comment\n\nk1 {K1}\n"));
        let sealed = keys.seal(b"ctx", b"card-4242").expect("seal");
        assert!(is_sealed(&sealed));
        assert_eq!(sealed_key_id(&sealed), Ok("k1"));
        assert!(!sealed.windows(9).any(|w| w == b"card-4242"));
        assert_eq!(keys.open(b"ctx", &sealed).expect("open"), b"card-4242");
        // A fresh nonce per write: the same plaintext seals differently.
        assert_ne!(keys.seal(b"ctx", b"card-4242").expect("seal"), sealed);
    }

    #[test]
    fn wrong_associated_data_fails() {
        let keys = ring(&format!("k1 {K1}"));
        let sealed = keys.seal(b"row-a", b"payload").expect("seal");
        assert_eq!(
            keys.open(b"row-b", &sealed),
            Err(CryptoError::Authentication {
                key_id: "k1".into()
            })
        );
    }

    #[test]
    fn tampering_fails() {
        let keys = ring(&format!("k1 {K1}"));
        let sealed = keys.seal(b"ctx", b"payload").expect("seal");
        for index in 0..sealed.len() {
            let mut tampered = sealed.clone();
            tampered[index] ^= 0x40;
            assert!(keys.open(b"ctx", &tampered).is_err(), "byte {index}");
        }
        assert!(keys.open(b"ctx", &sealed[..sealed.len() - 1]).is_err());
        assert!(matches!(
            keys.open(b"ctx", &sealed[..10]),
            Err(CryptoError::Malformed(_))
        ));
        // Relabelling with another key id of the ring fails too.
        let both = ring(&format!("k1 {K1}\nk2 {K1}"));
        let mut relabelled = sealed.clone();
        relabelled[3] = b'2';
        assert_eq!(
            both.open(b"ctx", &relabelled),
            Err(CryptoError::Authentication {
                key_id: "k2".into()
            })
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let sealed = ring(&format!("old-1 {K1}"))
            .seal(b"ctx", b"payload")
            .expect("seal");
        let error = ring(&format!("new-2 {K2}"))
            .open(b"ctx", &sealed)
            .expect_err("unknown key");
        assert!(error.to_string().contains("\"old-1\""), "{error}");
        assert!(error.to_string().contains("not in the encryption keyring"));
    }

    #[test]
    fn rotation_seals_with_the_last_key_and_opens_with_all() {
        let before = ring(&format!("k1 {K1}"));
        let old = before.seal(b"ctx", b"old").expect("seal");
        let after = ring(&format!("k1 {K1}\nk2 {K2}\n"));
        assert_eq!(after.active_key_id(), "k2");
        assert_eq!(after.key_ids(), ["k1", "k2"]);
        let new = after.seal(b"ctx", b"new").expect("seal");
        assert_eq!(sealed_key_id(&new), Ok("k2"));
        assert_eq!(after.open(b"ctx", &old).expect("old"), b"old");
        assert_eq!(after.open(b"ctx", &new).expect("new"), b"new");
    }

    #[test]
    fn parse_errors_name_the_file_and_line() {
        let error = parse_error(&format!("# keys\nk1 {K1}\nk2\n"));
        assert!(error.contains("keys.txt:3:"), "{error}");
        let error = parse_error(&format!("k1 {K1} extra"));
        assert!(error.contains("keys.txt:1:"), "{error}");
        let error = parse_error("\nk1 not-base64!!");
        assert!(
            error.contains("keys.txt:2:") && error.contains("base64"),
            "{error}"
        );
        let error = parse_error("k1 AQEB");
        assert!(error.contains("3 bytes"), "{error}");
        let error = parse_error(&format!("bad/id {K1}"));
        assert!(error.contains("key id"), "{error}");
        let error = parse_error(&format!("k1 {K1}\nk1 {K2}"));
        assert!(
            error.contains("keys.txt:2:") && error.contains("duplicate"),
            "{error}"
        );
        let error = parse_error("# only comments\n");
        assert!(error.contains("no keys"), "{error}");
        // Key material never appears in an error.
        assert!(!parse_error(&format!("k1 {K1}x")).contains(K1));
    }

    #[test]
    fn debug_shows_ids_not_keys() {
        let keys = ring(&format!("k1 {K1}"));
        let shown = format!("{keys:?}");
        assert!(shown.contains("k1") && !shown.contains(K1));
    }
}
