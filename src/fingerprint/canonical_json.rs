//! Canonical JSON for fingerprint v1.
//!
//! A strict RFC 8259 parser into a small tree, JSON Pointer removal of
//! volatile fields, and a serializer with exactly one output per meaning:
//! object members sorted by the UTF-8 bytes of their names, no insignificant
//! whitespace, minimal string escaping and an exact decimal form for numbers.
//! The format is specified in `docs/fingerprint.md`; SDKs in other languages
//! implement the same rules and are held to `proto/testdata/fingerprint-v1.json`.
//!
//! The parser is hand-written rather than built on `serde_json` because the
//! contract needs three things a generic parser hides: duplicate member names
//! must be an error, numbers must keep their exact decimal value (integers
//! beyond 2^53, `4200` = `4200.0` = `4.2e3`), and nesting depth is bounded
//! before recursion can exhaust the stack.

use std::fmt::Write as _;

/// The deepest nesting of arrays and objects accepted (the top-level
/// container counts as depth 1).
pub const MAX_DEPTH: usize = 128;

/// A decimal exponent beyond this magnitude is refused: such numbers are not
/// amounts anyone sends, and bounding it keeps exponent arithmetic exact.
const MAX_EXPONENT_MAGNITUDE: i64 = 1_000_000_000;

/// Why a body is not acceptable JSON for fingerprinting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// Not well-formed JSON (the message says where and why).
    #[error("malformed JSON at byte {offset}: {reason}")]
    Malformed {
        /// Byte offset of the problem in the body.
        offset: usize,
        /// What was wrong.
        reason: &'static str,
    },
    /// An object repeats a member name, so its meaning is ambiguous.
    #[error("duplicate object key {name:?} at byte {offset}")]
    DuplicateKey {
        /// The repeated name (a body fragment; never logged by the server).
        name: String,
        /// Byte offset of the second occurrence.
        offset: usize,
    },
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("JSON nesting deeper than {MAX_DEPTH} levels at byte {offset}")]
    TooDeep {
        /// Byte offset where the limit was crossed.
        offset: usize,
    },
}

/// A JSON Pointer that cannot be used to drop a field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointerError {
    /// The empty pointer would drop the whole document.
    #[error("must not be the empty pointer (the whole document)")]
    Root,
    /// Does not start with `/`.
    #[error("must start with '/' (RFC 6901 JSON Pointer)")]
    MissingSlash,
    /// A `~` not followed by `0` or `1`.
    #[error("has an invalid '~' escape (only ~0 and ~1 are allowed)")]
    BadEscape,
}

/// A parsed JSON value. Numbers keep their canonical decimal text.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A number, already in canonical form (see [`canonical_number`]).
    Number(String),
    /// A string, decoded.
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object, members in document order (sorted on output).
    Object(Vec<(String, Value)>),
}

/// Parses a complete JSON document (RFC 8259, UTF-8, no BOM).
pub fn parse(input: &[u8]) -> Result<Value, JsonError> {
    let mut parser = Parser { input, pos: 0 };
    parser.skip_whitespace();
    let value = parser.parse_value(0)?;
    parser.skip_whitespace();
    if parser.pos != input.len() {
        return Err(parser.malformed("unexpected data after the JSON value"));
    }
    Ok(value)
}

/// Splits an RFC 6901 pointer into unescaped reference tokens.
pub fn parse_pointer(pointer: &str) -> Result<Vec<String>, PointerError> {
    if pointer.is_empty() {
        return Err(PointerError::Root);
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(PointerError::MissingSlash);
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(PointerError::BadEscape),
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}

/// Removes the value each pointer refers to. Pointers that refer to nothing
/// are ignored: a volatile field is often optional. Every pointer refers to a
/// location in the document as given (removals do not shift later indices).
pub fn remove_pointers(value: &mut Value, pointers: &[Vec<String>]) {
    // Resolve every pointer to a concrete path first, then remove the
    // deepest and highest-indexed paths first, so that no removal changes
    // what another pointer refers to.
    let mut paths: Vec<Vec<PathStep>> = pointers
        .iter()
        .filter_map(|tokens| resolve(value, tokens))
        .collect();
    paths.sort();
    paths.dedup();
    for path in paths.iter().rev() {
        remove_path(value, path);
    }
}

/// One resolved step of a pointer: an object member (by its position among
/// the members) or an array element.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum PathStep {
    Member(usize),
    Element(usize),
}

fn resolve(mut value: &Value, tokens: &[String]) -> Option<Vec<PathStep>> {
    let mut path = Vec::with_capacity(tokens.len());
    for token in tokens {
        match value {
            Value::Object(members) => {
                let index = members.iter().position(|(name, _)| name == token)?;
                path.push(PathStep::Member(index));
                value = &members[index].1;
            }
            Value::Array(elements) => {
                let index = array_index(token)?;
                value = elements.get(index)?;
                path.push(PathStep::Element(index));
            }
            _ => return None,
        }
    }
    Some(path)
}

/// RFC 6901 array index: "0" or digits without a leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.is_empty()
        || !token.bytes().all(|b| b.is_ascii_digit())
        || (token.len() > 1 && token.starts_with('0'))
    {
        return None;
    }
    token.parse().ok()
}

fn remove_path(value: &mut Value, path: &[PathStep]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut current = value;
    for step in parents {
        current = match (current, step) {
            (Value::Object(members), PathStep::Member(i)) => match members.get_mut(*i) {
                Some((_, child)) => child,
                None => return,
            },
            (Value::Array(elements), PathStep::Element(i)) => match elements.get_mut(*i) {
                Some(child) => child,
                None => return,
            },
            _ => return,
        };
    }
    match (current, last) {
        (Value::Object(members), PathStep::Member(i)) if *i < members.len() => {
            members.remove(*i);
        }
        (Value::Array(elements), PathStep::Element(i)) if *i < elements.len() => {
            elements.remove(*i);
        }
        _ => {}
    }
}

/// Serializes a value canonically.
pub fn serialize(value: &Value) -> Vec<u8> {
    let mut out = String::new();
    write_value(&mut out, value);
    out.into_bytes()
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(text) => out.push_str(text),
        Value::String(text) => write_string(out, text),
        Value::Array(elements) => {
            out.push('[');
            for (i, element) in elements.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, element);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<&(String, Value)> = members.iter().collect();
            // Byte order of UTF-8 equals code point order: one rule that every
            // language can implement without locale or UTF-16 surprises.
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, name);
                out.push(':');
                write_value(out, member);
            }
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The canonical text of a JSON number with the given parts: `-`? then the
/// significant digits without leading or trailing zeros, then `e<exp>` when
/// the exponent is not zero. Zero (of any sign or form) is `0`.
/// Examples: `4200` → `42e2`, `4.2` → `42e-1`, `100.50` → `1005e-1`.
fn canonical_number(
    negative: bool,
    int_digits: &[u8],
    frac_digits: &[u8],
    exponent: i64,
) -> String {
    // value = digits(int ++ frac) × 10^(exponent - frac_len)
    let mut digits: Vec<u8> = Vec::with_capacity(int_digits.len() + frac_digits.len());
    digits.extend_from_slice(int_digits);
    digits.extend_from_slice(frac_digits);
    let mut exp = exponent - frac_digits.len() as i64;
    let first_nonzero = digits.iter().position(|d| *d != b'0');
    let Some(start) = first_nonzero else {
        return "0".to_string();
    };
    let mut end = digits.len();
    while end > start && digits[end - 1] == b'0' {
        end -= 1;
        exp += 1;
    }
    let mut out = String::with_capacity(end - start + 24);
    if negative {
        out.push('-');
    }
    out.extend(digits[start..end].iter().map(|d| *d as char));
    if exp != 0 {
        let _ = write!(out, "e{exp}");
    }
    out
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn malformed(&self, reason: &'static str) -> JsonError {
        JsonError::Malformed {
            offset: self.pos,
            reason,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect_literal(&mut self, literal: &'static [u8], value: Value) -> Result<Value, JsonError> {
        if self.input[self.pos..].starts_with(literal) {
            self.pos += literal.len();
            Ok(value)
        } else {
            Err(self.malformed("invalid literal"))
        }
    }

    fn parse_value(&mut self, depth: usize) -> Result<Value, JsonError> {
        match self.peek() {
            None => Err(self.malformed("unexpected end of input")),
            Some(b'{') => self.parse_object(depth + 1),
            Some(b'[') => self.parse_array(depth + 1),
            Some(b'"') => Ok(Value::String(self.parse_string()?)),
            Some(b't') => self.expect_literal(b"true", Value::Bool(true)),
            Some(b'f') => self.expect_literal(b"false", Value::Bool(false)),
            Some(b'n') => self.expect_literal(b"null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.parse_number(),
            Some(_) => Err(self.malformed("unexpected character")),
        }
    }

    fn parse_object(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep { offset: self.pos });
        }
        self.pos += 1; // '{'
        let mut members: Vec<(String, Value)> = Vec::new();
        let mut names = std::collections::HashSet::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.malformed("expected a string object key"));
            }
            let name_offset = self.pos;
            let name = self.parse_string()?;
            if !names.insert(name.clone()) {
                return Err(JsonError::DuplicateKey {
                    name,
                    offset: name_offset,
                });
            }
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.malformed("expected ':' after object key"));
            }
            self.pos += 1;
            self.skip_whitespace();
            let value = self.parse_value(depth)?;
            members.push((name, value));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(members));
                }
                _ => return Err(self.malformed("expected ',' or '}' in object")),
            }
        }
    }

    fn parse_array(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep { offset: self.pos });
        }
        self.pos += 1; // '['
        let mut elements = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(elements));
        }
        loop {
            self.skip_whitespace();
            elements.push(self.parse_value(depth)?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(elements));
                }
                _ => return Err(self.malformed("expected ',' or ']' in array")),
            }
        }
    }

    fn parse_string(&mut self) -> Result<String, JsonError> {
        self.pos += 1; // opening quote
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(byte) = self.peek() else {
                return Err(self.malformed("unterminated string"));
            };
            match byte {
                b'"' => {
                    self.pos += 1;
                    // Raw bytes were validated as UTF-8 below and escapes
                    // produce valid chars, so this cannot fail; still, no
                    // unwrap on input paths.
                    return String::from_utf8(out)
                        .map_err(|_| self.malformed("invalid UTF-8 in string"));
                }
                b'\\' => {
                    self.pos += 1;
                    let escaped = self.parse_escape()?;
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(escaped.encode_utf8(&mut buf).as_bytes());
                }
                0x00..=0x1F => return Err(self.malformed("unescaped control character in string")),
                0x20..=0x7F => {
                    out.push(byte);
                    self.pos += 1;
                }
                _ => {
                    let width = utf8_width(byte);
                    let end = self.pos + width;
                    let chunk = self
                        .input
                        .get(self.pos..end)
                        .filter(|_| width > 0)
                        .ok_or_else(|| self.malformed("invalid UTF-8 in string"))?;
                    if std::str::from_utf8(chunk).is_err() {
                        return Err(self.malformed("invalid UTF-8 in string"));
                    }
                    out.extend_from_slice(chunk);
                    self.pos = end;
                }
            }
        }
    }

    fn parse_escape(&mut self) -> Result<char, JsonError> {
        let Some(byte) = self.peek() else {
            return Err(self.malformed("unterminated escape"));
        };
        self.pos += 1;
        Ok(match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{08}',
            b'f' => '\u{0C}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = self.parse_hex4()?;
                match first {
                    0xD800..=0xDBFF => {
                        if self.input.get(self.pos..self.pos + 2) != Some(b"\\u") {
                            return Err(self.malformed("unpaired surrogate escape"));
                        }
                        self.pos += 2;
                        let second = self.parse_hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&second) {
                            return Err(self.malformed("unpaired surrogate escape"));
                        }
                        let code = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
                        char::from_u32(code).ok_or_else(|| self.malformed("invalid escape"))?
                    }
                    0xDC00..=0xDFFF => return Err(self.malformed("unpaired surrogate escape")),
                    code => char::from_u32(code).ok_or_else(|| self.malformed("invalid escape"))?,
                }
            }
            _ => return Err(self.malformed("invalid escape")),
        })
    }

    fn parse_hex4(&mut self) -> Result<u32, JsonError> {
        let digits = self
            .input
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.malformed("truncated \\u escape"))?;
        let mut code = 0u32;
        for digit in digits {
            let nibble = (*digit as char)
                .to_digit(16)
                .ok_or_else(|| self.malformed("invalid \\u escape"))?;
            code = code * 16 + nibble;
        }
        self.pos += 4;
        Ok(code)
    }

    fn parse_number(&mut self) -> Result<Value, JsonError> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                while let Some(b'0'..=b'9') = self.peek() {
                    self.pos += 1;
                }
            }
            _ => return Err(self.malformed("invalid number")),
        }
        let int_digits = &self.input[int_start..self.pos];
        let mut frac_digits: &[u8] = &[];
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let frac_start = self.pos;
            while let Some(b'0'..=b'9') = self.peek() {
                self.pos += 1;
            }
            if self.pos == frac_start {
                return Err(self.malformed("invalid number: no digits after '.'"));
            }
            frac_digits = &self.input[frac_start..self.pos];
        }
        let mut exponent: i64 = 0;
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            let exp_negative = match self.peek() {
                Some(b'-') => {
                    self.pos += 1;
                    true
                }
                Some(b'+') => {
                    self.pos += 1;
                    false
                }
                _ => false,
            };
            let exp_start = self.pos;
            while let Some(b'0'..=b'9') = self.peek() {
                self.pos += 1;
            }
            if self.pos == exp_start {
                return Err(self.malformed("invalid number: no digits in exponent"));
            }
            let magnitude = self.input[exp_start..self.pos]
                .iter()
                .try_fold(0i64, |acc, d| {
                    acc.checked_mul(10)?.checked_add(i64::from(d - b'0'))
                })
                .filter(|m| *m <= MAX_EXPONENT_MAGNITUDE)
                .ok_or_else(|| self.malformed("number exponent out of range"))?;
            exponent = if exp_negative { -magnitude } else { magnitude };
        }
        Ok(Value::Number(canonical_number(
            negative,
            int_digits,
            frac_digits,
            exponent,
        )))
    }
}

/// Length of a UTF-8 sequence from its lead byte (0 for an invalid lead).
fn utf8_width(lead: u8) -> usize {
    match lead {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(input: &str) -> String {
        String::from_utf8(serialize(&parse(input.as_bytes()).expect("valid JSON")))
            .expect("canonical JSON is UTF-8")
    }

    #[test]
    fn numbers_compare_by_exact_decimal_value() {
        assert_eq!(canonical("4200"), "42e2");
        assert_eq!(canonical("4200.0"), "42e2");
        assert_eq!(canonical("4.2e3"), "42e2");
        assert_eq!(canonical("42E+2"), "42e2");
        assert_eq!(canonical("0.0042"), "42e-4");
        assert_eq!(canonical("-0"), "0");
        assert_eq!(canonical("0e10"), "0");
        assert_eq!(canonical("1"), "1");
        assert_eq!(
            canonical("9007199254740993"),
            "9007199254740993",
            "integers beyond 2^53 stay exact"
        );
        assert_ne!(canonical("9007199254740993"), canonical("9007199254740992"));
    }

    #[test]
    fn objects_are_sorted_and_whitespace_dropped() {
        assert_eq!(
            canonical(r#" { "b" : 2 , "a" : [ 1 , true , null ] } "#),
            r#"{"a":[1,true,null],"b":2}"#
        );
    }

    #[test]
    fn duplicate_keys_are_rejected_even_when_spelled_differently() {
        let err = parse(br#"{"a":1,"\u0061":2}"#).expect_err("duplicate");
        assert!(matches!(err, JsonError::DuplicateKey { ref name, .. } if name == "a"));
    }

    #[test]
    fn depth_limit_is_exact() {
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(ok.as_bytes()).is_ok());
        let too_deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(matches!(
            parse(too_deep.as_bytes()),
            Err(JsonError::TooDeep { .. })
        ));
    }

    #[test]
    fn malformed_inputs_are_rejected() {
        for bad in [
            "",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            "1e",
            "+1",
            "\"\\x\"",
            "\"\u{1}\"",
            "tru",
            "1 2",
            "\"\\ud800\"",
            "NaN",
            "\u{feff}{}",
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "accepted {bad:?}");
        }
        assert!(parse(b"\"\xff\"").is_err());
        assert!(parse(b"1e99999999999999999999").is_err());
    }

    #[test]
    fn pointers_remove_members_and_elements() {
        let mut value =
            parse(br#"{"a":{"b":1,"c":2},"l":[0,1,2],"x/y":3,"m~n":4}"#).expect("valid");
        let pointers: Vec<Vec<String>> =
            ["/a/b", "/l/0", "/l/2", "/x~1y", "/m~0n", "/missing/deep"]
                .iter()
                .map(|p| parse_pointer(p).expect("valid pointer"))
                .collect();
        remove_pointers(&mut value, &pointers);
        assert_eq!(
            String::from_utf8(serialize(&value)).expect("utf8"),
            r#"{"a":{"c":2},"l":[1]}"#
        );
    }

    #[test]
    fn invalid_pointers_are_rejected() {
        assert_eq!(parse_pointer(""), Err(PointerError::Root));
        assert_eq!(parse_pointer("a"), Err(PointerError::MissingSlash));
        assert_eq!(parse_pointer("/a~2"), Err(PointerError::BadEscape));
    }
}
