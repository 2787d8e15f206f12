"""Local fingerprint v1 and downstream keys against the shared vectors."""

from __future__ import annotations

import json

import pytest

import idemd
from idemd.fingerprint import FingerprintError, canonical_body, canonical_json, fingerprint_v1

from conftest import CONFORMANCE, REPO_ROOT

FINGERPRINT = json.loads((REPO_ROOT / "proto" / "testdata" / "fingerprint-v1.json").read_text(encoding="utf-8"))
DOWNSTREAM = json.loads((CONFORMANCE / "downstream-key-v1.json").read_text(encoding="utf-8"))
VECTOR_FIELDS = {
    "name", "method", "path", "content_type", "body_utf8", "body_hex",
    "ignore_fields", "canonical_body_hex", "sha256_hex", "error",
}


def body_of(vector) -> bytes:
    assert ("body_utf8" in vector) != ("body_hex" in vector), "exactly one of body_utf8/body_hex"
    if "body_utf8" in vector:
        return vector["body_utf8"].encode("utf-8")
    return bytes.fromhex(vector["body_hex"])


def test_vector_files_are_loaded() -> None:
    assert FINGERPRINT["version"] == "v1" and len(FINGERPRINT["vectors"]) >= 25
    assert DOWNSTREAM["version"] == "v1" and len(DOWNSTREAM["vectors"]) >= 10


@pytest.mark.parametrize("vector", FINGERPRINT["vectors"], ids=[v["name"] for v in FINGERPRINT["vectors"]])
def test_fingerprint_vector(vector) -> None:
    assert not set(vector) - VECTOR_FIELDS, f"unknown vector fields {set(vector) - VECTOR_FIELDS}"
    body = body_of(vector)
    args = (vector["method"], vector["path"], body, vector["content_type"], vector["ignore_fields"])
    if "error" in vector:
        assert "sha256_hex" not in vector
        with pytest.raises(FingerprintError) as raised:
            fingerprint_v1(*args)
        assert raised.value.kind == vector["error"]
    else:
        assert fingerprint_v1(*args).hex() == vector["sha256_hex"]
        canonical = canonical_body(body, vector["content_type"], vector["ignore_fields"])
        assert canonical.hex() == vector["canonical_body_hex"]


@pytest.mark.parametrize("vector", DOWNSTREAM["vectors"], ids=lambda v: f"{v['key'][:20]}/{v['step']}")
def test_downstream_key_vector(vector) -> None:
    got = idemd.downstream_key(vector["key"], vector["step"])
    assert got == vector["downstream_key"]
    assert len(got) == 43 and all(c.isalnum() or c in "-_" for c in got)


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("4200", "42e2"),
        ("42E+2", "42e2"),
        ("0.0042", "42e-4"),
        ("-0", "0"),
        ("0e10", "0"),
        ("1e0000000000005", "1e5"),
        ("100.50", "1005e-1"),
        (' { "b" : 2 , "a" : [ 1 , true , null ] } ', '{"a":[1,true,null],"b":2}'),
        ('"\\u00e9\\/\\u007f"', '"\u00e9/\u007f"'),
        ('"\\u001f\\b"', '"\\u001f\\b"'),
    ],
)
def test_canonical_json(text: str, canonical: str) -> None:
    assert canonical_json(text) == canonical.encode("utf-8")


@pytest.mark.parametrize(
    "bad",
    ["", "{", "[1,]", '{"a":1,}', "01", "1.", "1e", "+1", "-", '"\\x"', '"\u0001"', "tru", "1 2",
     '"\\ud800"', '"\\udc00"', '"\\ud800\\u0041"', "NaN", "\ufeff{}", "1e99999999999999999999", "1e1000000001",
     '{"a" 1}', "[1 2]", '"abc'],
)
def test_malformed_json(bad: str) -> None:
    with pytest.raises(FingerprintError) as raised:
        canonical_json(bad)
    assert raised.value.kind == "malformed_json"


def test_invalid_utf8_is_malformed() -> None:
    for raw in (b'"\xff"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b"[\xff]"):
        with pytest.raises(FingerprintError) as raised:
            canonical_json(raw)
        assert raised.value.kind == "malformed_json"


def test_errors_are_found_in_document_order() -> None:
    # As the server's parser: the first problem in the document decides the class.
    with pytest.raises(FingerprintError) as raised:
        canonical_json(b'{"a":1,"a":2} \xff')
    assert raised.value.kind == "duplicate_key"
    with pytest.raises(FingerprintError) as raised:
        canonical_json("[" * 129 + "x")
    assert raised.value.kind == "too_deep"


def test_pointer_limits() -> None:
    with pytest.raises(FingerprintError) as raised:
        fingerprint_v1("POST", "/", b"{}", "application/json", ["/a"] * 65)
    assert raised.value.kind == "invalid_pointer"
    with pytest.raises(FingerprintError) as raised:
        fingerprint_v1("POST", "/", b"{}", "application/json", ["/" + "a" * 1024])
    assert raised.value.kind == "invalid_pointer"
    # Pointers are checked even when the body is not JSON (as the server does).
    with pytest.raises(FingerprintError):
        fingerprint_v1("POST", "/", b"x", "text/plain", ["nope"])


def test_large_body_is_fast_enough() -> None:
    # Local fingerprints exist for bodies over the server's 1 MiB limit.
    items = ",".join('{"id":%d,"name":"item \\u00e9 %d","price":%d.50}' % (i, i, i) for i in range(40000))
    body = ('{"items":[%s]}' % items).encode()
    assert len(body) > 1024 * 1024
    digest = fingerprint_v1("POST", "/v1/bulk", body, "application/json")
    assert len(digest) == 32


def test_fast_and_strict_parsers_agree() -> None:
    # The fast path (json's C scanner + hooks) and the strict parser must give
    # the same canonical form for every accepted document.
    from idemd import fingerprint as fp

    bodies = [body_of(v) for v in FINGERPRINT["vectors"] if "error" not in v and "json" in v["content_type"].lower()]
    bodies += [b'{"a":[1.0,-0.0e-5,{"\\u00e9":"\\ud83d\\ude00"}],"b":"\\t\\u0000"}', b"[" * 128 + b"]" * 128]
    for body in bodies:
        if not body:
            continue
        fast = fp._parse_fast(body)
        strict = fp._parse_strict(body)
        out_fast, out_strict = [], []
        fp._write(out_fast, fast)
        fp._write(out_strict, strict)
        assert out_fast == out_strict, body
    for doubtful in (b'["\\ud800"]', b"[" * 129 + b"]" * 129, b'{"a":1,"a":1}', b"[1e2000000000]", b"[NaN]"):
        with pytest.raises(fp._Fallback):
            fp._parse_fast(doubtful)
