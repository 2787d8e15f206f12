//! Input validation: every limit of the API, checked before anything is
//! read or written, each failure naming its field.

use std::time::Duration;

use super::error::{EngineError, EngineResult};
use crate::store::StoredResponse;

/// Longest idempotency key (the article: 1 to 255 characters).
pub const MAX_KEY_CHARS: usize = 255;
/// Longest endpoint name.
pub const MAX_ENDPOINT_CHARS: usize = 200;
/// Longest attempt id.
pub const MAX_ATTEMPT_ID_CHARS: usize = 128;
/// Longest tenant id (from credentials or `x-tenant-id`).
pub const MAX_TENANT_CHARS: usize = 128;
/// Longest lease token accepted (tokens idemd issues are 32 characters).
pub const MAX_LEASE_TOKEN_CHARS: usize = 128;
/// Longest Fail/Reconcile reason, in bytes.
pub const MAX_REASON_BYTES: usize = 1024;
/// Most headers in a stored response.
pub const MAX_RESPONSE_HEADERS: usize = 256;

/// The key alphabet: URL- and header-safe, and wide enough for UUIDs, ULIDs
/// (Crockford base32) and base64url tokens.
fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

fn check_token_like(field: &str, value: &str, max_chars: usize) -> EngineResult<()> {
    if value.trim().is_empty() {
        return Err(EngineError::invalid(field, "must not be empty"));
    }
    let chars = value.chars().count();
    if chars > max_chars {
        return Err(EngineError::invalid(
            field,
            format!("is {chars} characters; at most {max_chars} are allowed"),
        ));
    }
    if let Some(bad) = value.chars().find(|c| !is_key_char(*c)) {
        return Err(EngineError::invalid(
            field,
            format!("contains {bad:?}; only [A-Za-z0-9_-] is allowed"),
        ));
    }
    Ok(())
}

/// An idempotency key: 1..=255 characters of `[A-Za-z0-9_-]`.
pub fn key(value: &str) -> EngineResult<()> {
    check_token_like("key", value, MAX_KEY_CHARS)
}

/// A tenant id: 1..=128 characters of `[A-Za-z0-9_-]`.
pub fn tenant(field: &str, value: &str) -> EngineResult<()> {
    check_token_like(field, value, MAX_TENANT_CHARS)
}

/// An optional attempt id: empty, or 1..=128 characters of `[A-Za-z0-9_-]`.
pub fn attempt_id(value: &str) -> EngineResult<()> {
    if value.is_empty() {
        return Ok(());
    }
    check_token_like("attempt_id", value, MAX_ATTEMPT_ID_CHARS)
}

/// A lease token presented by a holder.
pub fn lease_token(value: &str) -> EngineResult<()> {
    if value.is_empty() {
        return Err(EngineError::invalid("lease_token", "must not be empty"));
    }
    check_token_like("lease_token", value, MAX_LEASE_TOKEN_CHARS)
}

/// An endpoint: 1..=200 characters, not blank, no control characters.
pub fn endpoint(value: &str) -> EngineResult<()> {
    if value.trim().is_empty() {
        return Err(EngineError::invalid("endpoint", "must not be empty"));
    }
    let chars = value.chars().count();
    if chars > MAX_ENDPOINT_CHARS {
        return Err(EngineError::invalid(
            "endpoint",
            format!("is {chars} characters; at most {MAX_ENDPOINT_CHARS} are allowed"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(EngineError::invalid(
            "endpoint",
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// A reason text.
pub fn reason(field: &str, value: &str) -> EngineResult<()> {
    if value.len() > MAX_REASON_BYTES {
        return Err(EngineError::invalid(
            field,
            format!(
                "is {} bytes; at most {MAX_REASON_BYTES} are allowed",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// A duration given as signed milliseconds (`None` when absent): must be
/// strictly positive when present.
pub fn positive_duration(field: &str, value_ms: Option<i64>) -> EngineResult<Option<Duration>> {
    match value_ms {
        None => Ok(None),
        Some(ms) if ms <= 0 => Err(EngineError::invalid(field, "must be greater than zero")),
        Some(ms) => Ok(Some(Duration::from_millis(ms.unsigned_abs()))),
    }
}

/// A duration that may be zero but not negative.
pub fn non_negative_duration(field: &str, value_ms: Option<i64>) -> EngineResult<Option<Duration>> {
    match value_ms {
        None => Ok(None),
        Some(ms) if ms < 0 => Err(EngineError::invalid(field, "must not be negative")),
        Some(ms) => Ok(Some(Duration::from_millis(ms.unsigned_abs()))),
    }
}

/// A response to store: valid HTTP status, sane headers, within the size cap.
pub fn response(field: &str, value: &StoredResponse, max_bytes: usize) -> EngineResult<()> {
    if !(100..=599).contains(&value.status) {
        return Err(EngineError::invalid(
            format!("{field}.status"),
            format!("{} is not an HTTP status (100..=599)", value.status),
        ));
    }
    if value.headers.len() > MAX_RESPONSE_HEADERS {
        return Err(EngineError::invalid(
            format!("{field}.headers"),
            format!(
                "{} headers; at most {MAX_RESPONSE_HEADERS} are allowed",
                value.headers.len()
            ),
        ));
    }
    for (index, (name, header_value)) in value.headers.iter().enumerate() {
        let valid_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
        if !valid_name {
            return Err(EngineError::invalid(
                format!("{field}.headers[{index}].name"),
                "must be a non-empty HTTP token",
            ));
        }
        if header_value
            .bytes()
            .any(|b| b == b'\r' || b == b'\n' || b == 0)
        {
            return Err(EngineError::invalid(
                format!("{field}.headers[{index}].value"),
                "must not contain CR, LF or NUL",
            ));
        }
    }
    let size = value.stored_size();
    if size > max_bytes {
        return Err(EngineError::too_large(
            field,
            format!(
                "is {size} bytes; the endpoint policy allows at most {max_bytes} (store large bodies elsewhere and send body_ref)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_formats_in_the_wild_pass() {
        for ok in [
            "4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90",
            "01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "q8Vv4y1ZCk6m2ddH_bn-Ug",
            &"a".repeat(255),
        ] {
            assert_eq!(key(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn bad_keys_name_the_field() {
        for bad in [
            "",
            "   ",
            &"a".repeat(256),
            "has space",
            "slash/",
            "é",
            "a+b==",
        ] {
            match key(bad) {
                Err(EngineError::InvalidArgument { field, .. }) => assert_eq!(field, "key"),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn endpoints() {
        assert!(endpoint("POST /v1/payments").is_ok());
        assert!(endpoint(&"e".repeat(200)).is_ok());
        assert!(endpoint(&"e".repeat(201)).is_err());
        assert!(endpoint("").is_err());
        assert!(endpoint(" \t").is_err());
        assert!(endpoint("a\nb").is_err());
    }
}
