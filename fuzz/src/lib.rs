//! Helpers shared by the fuzz targets. The API layer's own conversions
//! (`idemd::api::duration_ms`, `response_from_pb`,
//! `idemd::api::audit::timestamp_ms`) are public so the targets fuzz the
//! real code, not copies.

/// Splits fuzz input at the first NUL byte: the part before (if any NUL is
/// present) and the part after. Without a NUL, the head is empty.
pub fn split_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&[], data),
    }
}

/// Newline-separated lines of `bytes` as strings (lossy UTF-8).
pub fn lines(bytes: &[u8]) -> Vec<String> {
    if bytes.is_empty() {
        return Vec::new();
    }
    String::from_utf8_lossy(bytes)
        .split('\n')
        .map(str::to_string)
        .collect()
}

/// RFC 6901 escaping of one reference token (inverse of the unescaping in
/// `idemd::fingerprint::canonical_json::parse_pointer`).
pub fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The keyring of the sealed-record seeds and of the `record_codec` target:
/// fixed, public test material (32 bytes of 0x42), so a seed sealed by
/// `examples/gen_corpus.rs` opens in the target and libFuzzer can mutate
/// the clear fields around an authentic sealed response.
pub fn fuzz_keyring() -> idemd::crypto::Keyring {
    const TEXT: &str = "fuzz-key QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI=\n";
    idemd::crypto::Keyring::parse(std::path::Path::new("fuzz keyring"), TEXT)
        .expect("the fuzz keyring is valid")
}
