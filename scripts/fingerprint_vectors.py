#!/usr/bin/env python3
"""Writes proto/testdata/fingerprint-v1.json: the shared fingerprint v1 vectors.

This is an independent reference implementation of docs/fingerprint.md in
Python (standard library only). The Rust server and every SDK are tested
against the file it writes, so a vector is only trusted when two independent
implementations agree. Regenerate with:

    python3 scripts/fingerprint_vectors.py > proto/testdata/fingerprint-v1.json
"""
import hashlib
import json
import sys
from decimal import Decimal

VERSION_TAG = b"idemd-fingerprint-v1"


def canonical_number(text):
    d = Decimal(text)
    if d == 0:
        return "0"
    sign, digits, exp = d.as_tuple()
    digits = list(digits)
    while digits and digits[-1] == 0:
        digits.pop()
        exp += 1
    out = ("-" if sign else "") + "".join(str(x) for x in digits)
    return out + (f"e{exp}" if exp != 0 else "")


class Num:
    def __init__(self, text):
        self.text = canonical_number(text)


def parse(body):
    def pairs(items):
        seen = set()
        for k, _ in items:
            if k in seen:
                raise ValueError("duplicate_key")
            seen.add(k)
        return dict(items)

    def const(_):
        raise ValueError("malformed_json")

    text = body.decode("utf-8")
    value = json.loads(text, object_pairs_hook=pairs, parse_float=Num, parse_int=Num,
                       parse_constant=const)
    return value


def depth(value):
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def escape(s):
    out = ['"']
    for ch in s:
        o = ord(ch)
        if 0xD800 <= o <= 0xDFFF:
            raise ValueError("malformed_json")
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20:
            out.append("\\u%04x" % o)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def serialize(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, Num):
        return v.text
    if isinstance(v, str):
        return escape(v)
    if isinstance(v, list):
        return "[" + ",".join(serialize(x) for x in v) + "]"
    items = sorted(v.items(), key=lambda kv: kv[0].encode("utf-8"))
    return "{" + ",".join(escape(k) + ":" + serialize(x) for k, x in items) + "}"


def pointer_tokens(p):
    if p == "":
        raise ValueError("invalid_pointer")
    if not p.startswith("/"):
        raise ValueError("invalid_pointer")
    tokens = []
    for raw in p[1:].split("/"):
        out, i = "", 0
        while i < len(raw):
            if raw[i] == "~":
                if i + 1 < len(raw) and raw[i + 1] in "01":
                    out += "~" if raw[i + 1] == "0" else "/"
                    i += 2
                    continue
                raise ValueError("invalid_pointer")
            out += raw[i]
            i += 1
        tokens.append(out)
    return tokens


def resolve(value, tokens):
    path = []
    for t in tokens:
        if isinstance(value, dict):
            if t not in value:
                return None
            path.append(t)
            value = value[t]
        elif isinstance(value, list):
            if not t.isdigit() or (len(t) > 1 and t[0] == "0") or int(t) >= len(value):
                return None
            path.append(int(t))
            value = value[int(t)]
        else:
            return None
    return path


def remove(value, pointers):
    paths = [p for p in (resolve(value, t) for t in pointers) if p is not None]
    # Children before parents, higher indices before lower: sort descending.
    def key(path):
        return [(1, x) if isinstance(x, int) else (0, x) for x in path]
    unique = []
    for p in sorted(paths, key=key, reverse=True):
        if p not in unique:
            unique.append(p)
    for p in unique:
        parent = value
        ok = True
        for step in p[:-1]:
            try:
                parent = parent[step]
            except (KeyError, IndexError, TypeError):
                ok = False
                break
        if ok:
            try:
                del parent[p[-1]]
            except (KeyError, IndexError, TypeError):
                pass


def is_json(ct):
    essence = ct.split(";")[0].strip().lower()
    return essence == "application/json" or ("/" in essence and essence.endswith("+json"))


def canonical_body(body, ct, ignore):
    pointers = [pointer_tokens(p) for p in ignore]
    if not body or not is_json(ct):
        return body
    try:
        value = parse(body)
    except ValueError as e:
        if str(e) in ("duplicate_key", "malformed_json"):
            raise
        raise ValueError("malformed_json")
    except UnicodeDecodeError:
        raise ValueError("malformed_json")
    if depth(value) > 128:
        raise ValueError("too_deep")
    remove(value, pointers)
    return serialize(value).encode("utf-8")


def fingerprint(method, path, body, ct, ignore):
    canon = canonical_body(body, ct, ignore)
    h = hashlib.sha256()
    for part in (VERSION_TAG, method.upper().encode(), path.encode(), canon):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return canon, h.hexdigest()


J = "application/json"
P = "/v1/payments"
CASES = [
    ("article payment", "POST", P, J, '{"amount":4200,"currency":"usd","customer":"cus_8812","description":"Order 1042"}', []),
    ("key order differs (same as article payment)", "POST", P, J, '{"description":"Order 1042","customer":"cus_8812","currency":"usd","amount":4200}', []),
    ("insignificant whitespace", "POST", P, J, ' {\n  "amount" : 4200 ,\t"currency":"usd",\r\n"customer":"cus_8812","description":"Order 1042" }\n', []),
    ("4200.0 equals 4200", "POST", P, J, '{"amount":4200.0,"currency":"usd","customer":"cus_8812","description":"Order 1042"}', []),
    ("4.2e3 equals 4200", "POST", P, J, '{"amount":4.2e3,"currency":"usd","customer":"cus_8812","description":"Order 1042"}', []),
    ("changed amount differs", "POST", P, J, '{"amount":42000,"currency":"usd","customer":"cus_8812","description":"Order 1042"}', []),
    ("lowercase method is uppercased", "post", P, J, '{"amount":4200,"currency":"usd","customer":"cus_8812","description":"Order 1042"}', []),
    ("other path differs", "POST", "/v1/refunds", J, '{"amount":4200,"currency":"usd","customer":"cus_8812","description":"Order 1042"}', []),
    ("integer beyond 2^53 exact", "POST", P, J, '{"n":9007199254740993}', []),
    ("neighbouring big integer differs", "POST", P, J, '{"n":9007199254740992}', []),
    ("negative zero is zero", "POST", P, J, '[-0, 0.0, 0e7, -0.000]', []),
    ("fractions and exponents", "POST", P, J, '[0.5, 1.50, 100, 1E2, 1e-2, -12.340e+1, 123456789012345678901234567890]', []),
    ("unicode literal and escaped agree", "POST", P, J, '{"name":"J\\u00fcrgen \\ud83d\\ude00","city":"Z\u00fcrich"}', []),
    ("unicode raw", "POST", P, J, '{"city":"Z\\u00fcrich","name":"J\u00fcrgen \U0001F600"}', []),
    ("escapes are minimal", "POST", P, J, '{"s":"quote \\" backslash \\\\ slash \\/ tab \\t nl \\n ctl \\u0001 del \\u007f ls \\u2028"}', []),
    ("keys sorted by UTF-8 bytes", "POST", P, J, '{"\u00e9":1,"z":2,"Z":3,"a":4,"\U0001F600":5,"\uff21":6}', []),
    ("nested objects and arrays", "POST", P, J, '{"b":{"y":[3,{"k":2,"j":1}],"x":null},"a":[true,false,{}, []]}', []),
    ("ignore a top-level volatile field", "POST", P, J, '{"amount":4200,"currency":"usd","client_ts":"2026-11-30T10:00:00Z"}', ["/client_ts"]),
    ("ignore a nested field and a missing one", "POST", P, J, '{"amount":4200,"meta":{"trace_id":"abc","source":"app"}}', ["/meta/trace_id", "/does/not/exist"]),
    ("ignore array elements by original index", "POST", P, J, '{"items":["a","b","c","d"]}', ["/items/1", "/items/3"]),
    ("ignore with escaped pointer tokens", "POST", P, J, '{"a/b":1,"m~n":2,"keep":3}', ["/a~1b", "/m~0n"]),
    ("ignore_fields do not apply to non-JSON", "POST", P, "text/plain", '{"client_ts":1}', ["/client_ts"]),
    ("non-JSON body hashed as bytes", "POST", P, "text/plain", '{"b":1, "a":2}', []),
    ("form body hashed as bytes", "POST", P, "application/x-www-form-urlencoded", 'amount=4200&currency=usd', []),
    ("empty body with JSON content type", "POST", P, J, '', []),
    ("+json media type canonicalized", "POST", P, "application/merge-patch+json; charset=utf-8", '{ "b" : 1 , "a" : 2 }', []),
    ("content type case-insensitive", "POST", P, "Application/JSON", '{ "b" : 1 , "a" : 2 }', []),
    ("top-level scalar", "PUT", "/v1/flags/x", J, ' "on" ', []),
    ("depth 128 accepted", "POST", P, J, "[" * 128 + "]" * 128, []),
]
BINARY = [
    ("binary body hashed as bytes", "POST", "/v1/upload", "application/octet-stream", bytes([0, 255, 1, 254, 10, 13])),
]
ERRORS = [
    ("duplicate key", J, '{"a":1,"a":2}', [], "duplicate_key"),
    ("duplicate key after unescaping", J, '{"a":1,"\\u0061":2}', [], "duplicate_key"),
    ("malformed: trailing comma", J, '{"a":1,}', [], "malformed_json"),
    ("malformed: NaN", J, '[NaN]', [], "malformed_json"),
    ("malformed: leading zero", J, '[01]', [], "malformed_json"),
    ("malformed: lone surrogate", J, '["\\ud800"]', [], "malformed_json"),
    ("malformed: trailing data", J, '{} {}', [], "malformed_json"),
    ("too deep: 129 levels", J, "[" * 129 + "]" * 129, [], "too_deep"),
    ("invalid pointer: no slash", J, '{"a":1}', ["a"], "invalid_pointer"),
    ("invalid pointer: bad escape", J, '{"a":1}', ["/a~2"], "invalid_pointer"),
    ("invalid pointer: root", J, '{"a":1}', [""], "invalid_pointer"),
]


def main():
    vectors = []
    for name, method, path, ct, body, ignore in CASES:
        raw = body.encode("utf-8")
        canon, digest = fingerprint(method, path, raw, ct, ignore)
        vectors.append({"name": name, "method": method, "path": path, "content_type": ct,
                        "body_utf8": body, "ignore_fields": ignore,
                        "canonical_body_hex": canon.hex(), "sha256_hex": digest})
    for name, method, path, ct, raw in BINARY:
        canon, digest = fingerprint(method, path, raw, ct, [])
        vectors.append({"name": name, "method": method, "path": path, "content_type": ct,
                        "body_hex": raw.hex(), "ignore_fields": [],
                        "canonical_body_hex": canon.hex(), "sha256_hex": digest})
    for name, ct, body, ignore, err in ERRORS:
        try:
            fingerprint("POST", P, body.encode("utf-8"), ct, ignore)
        except ValueError as e:
            assert str(e) == err, (name, str(e), err)
        else:
            raise AssertionError(f"{name}: reference implementation accepted it")
        vectors.append({"name": name, "method": "POST", "path": P, "content_type": ct,
                        "body_utf8": body, "ignore_fields": ignore, "error": err})
    # Sanity: the equivalences the names promise.
    by = {v["name"]: v.get("sha256_hex") for v in vectors}
    same = ["article payment", "key order differs (same as article payment)",
            "insignificant whitespace", "4200.0 equals 4200", "4.2e3 equals 4200",
            "lowercase method is uppercased"]
    assert len({by[n] for n in same}) == 1, "equivalent payments must agree"
    assert by["changed amount differs"] != by["article payment"]
    assert by["unicode literal and escaped agree"] == by["unicode raw"]
    doc = {
        "description": "idemd fingerprint v1 test vectors; see docs/fingerprint.md. "
                       "Each vector has either sha256_hex (+ canonical_body_hex) or an error class "
                       "(malformed_json, duplicate_key, too_deep, invalid_pointer).",
        "version": "v1",
        "vectors": vectors,
    }
    json.dump(doc, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
