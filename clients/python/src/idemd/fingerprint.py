"""Fingerprint v1, computed locally (docs/fingerprint.md).

The server computes the same digest from ``ClaimRequest.request``; computing it
here and sending ``ClaimRequest.sha256`` keeps the body on the caller's side and
works for bodies over the server's 1 MiB limit.

    fingerprint = SHA-256( frame("idemd-fingerprint-v1")
                        || frame(ASCII-uppercase(method))
                        || frame(path)
                        || frame(canonical_body) )
    frame(x)    = 8-byte big-endian length of x || x

JSON bodies (``application/json`` or any ``+json`` media type, non-empty) are
canonicalized: a strict RFC 8259 parse (duplicate member names refused, depth
at most 128, exact decimal numbers), ``ignore_fields`` JSON Pointers dropped,
then serialized with sorted members, no whitespace, minimal escapes and a
canonical number form. Every other body is hashed as sent.

The parser is hand-written (not :mod:`json`) so that it reports exactly the
error classes the shared vectors expect, in the order the server finds them.
The server also merges the endpoint policy's ``ignore_fields`` into its
fingerprint; a local fingerprint only knows the ones passed here, so pass the
policy's list too when the endpoint has one.
"""

from __future__ import annotations

import hashlib
import json as _json
import re
from typing import Iterable, List, Sequence, Tuple, Union

__all__ = [
    "FingerprintError",
    "MAX_DEPTH",
    "canonical_body",
    "canonical_json",
    "fingerprint_v1",
    "is_json_content_type",
]

VERSION_TAG = b"idemd-fingerprint-v1"
#: Deepest nesting of arrays/objects accepted (the outermost counts as 1).
MAX_DEPTH = 128
#: Most ignore_fields pointers, and longest pointer (bytes).
MAX_IGNORE_FIELDS = 64
MAX_POINTER_BYTES = 1024
_MAX_EXPONENT_MAGNITUDE = 1_000_000_000


class FingerprintError(ValueError):
    """A body or pointer that fingerprint v1 refuses.

    ``kind`` is the shared error class: ``malformed_json``, ``duplicate_key``,
    ``too_deep`` or ``invalid_pointer``. Messages never quote the body.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def _malformed(offset: int, reason: str) -> FingerprintError:
    return FingerprintError("malformed_json", f"{reason} at byte {offset}")


# --------------------------------------------------------------------------
# Parsing. Values: None, True, False, _Number, str, list, _Object.


class _Number:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Object:
    """Members in document order (sorted only on output)."""

    __slots__ = ("members",)

    def __init__(self, members: List[Tuple[str, object]]) -> None:
        self.members = members


_WS = re.compile(rb"[ \t\n\r]*")
_PLAIN = re.compile(rb'[^"\\\x00-\x1f]+')
_NUMBER = re.compile(rb"(-?)(0|[1-9][0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?)([0-9]*))?")
_HEX4 = re.compile(rb"[0-9A-Fa-f]{4}")
_ESCAPES = {
    ord('"'): '"',
    ord("\\"): "\\",
    ord("/"): "/",
    ord("b"): "\b",
    ord("f"): "\f",
    ord("n"): "\n",
    ord("r"): "\r",
    ord("t"): "\t",
}


def _canonical_number(negative: bool, int_digits: str, frac_digits: str, exponent: int) -> str:
    digits = (int_digits + frac_digits).lstrip("0")
    if not digits:
        return "0"
    exp = exponent - len(frac_digits)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    out = ("-" if negative else "") + stripped
    return out + (f"e{exp}" if exp != 0 else "")


class _Parser:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def skip_ws(self) -> None:
        self.pos = _WS.match(self.data, self.pos).end()  # type: ignore[union-attr]

    def peek(self) -> int:
        return self.data[self.pos] if self.pos < len(self.data) else -1

    def value(self, depth: int) -> object:
        c = self.peek()
        if c == -1:
            raise _malformed(self.pos, "unexpected end of input")
        if c == 0x7B:  # {
            return self.obj(depth + 1)
        if c == 0x5B:  # [
            return self.arr(depth + 1)
        if c == 0x22:  # "
            return self.string()
        if c == 0x74:
            return self.literal(b"true", True)
        if c == 0x66:
            return self.literal(b"false", False)
        if c == 0x6E:
            return self.literal(b"null", None)
        if c == 0x2D or 0x30 <= c <= 0x39:
            return self.number()
        raise _malformed(self.pos, "unexpected character")

    def literal(self, text: bytes, value: object) -> object:
        if self.data.startswith(text, self.pos):
            self.pos += len(text)
            return value
        raise _malformed(self.pos, "invalid literal")

    def obj(self, depth: int) -> _Object:
        if depth > MAX_DEPTH:
            raise FingerprintError("too_deep", f"nesting deeper than {MAX_DEPTH} levels at byte {self.pos}")
        self.pos += 1
        members: List[Tuple[str, object]] = []
        names = set()
        self.skip_ws()
        if self.peek() == 0x7D:
            self.pos += 1
            return _Object(members)
        while True:
            self.skip_ws()
            if self.peek() != 0x22:
                raise _malformed(self.pos, "expected a string object key")
            name_offset = self.pos
            name = self.string()
            if name in names:
                raise FingerprintError("duplicate_key", f"duplicate object member name at byte {name_offset}")
            names.add(name)
            self.skip_ws()
            if self.peek() != 0x3A:
                raise _malformed(self.pos, "expected ':' after object key")
            self.pos += 1
            self.skip_ws()
            members.append((name, self.value(depth)))
            self.skip_ws()
            c = self.peek()
            if c == 0x2C:
                self.pos += 1
            elif c == 0x7D:
                self.pos += 1
                return _Object(members)
            else:
                raise _malformed(self.pos, "expected ',' or '}' in object")

    def arr(self, depth: int) -> list:
        if depth > MAX_DEPTH:
            raise FingerprintError("too_deep", f"nesting deeper than {MAX_DEPTH} levels at byte {self.pos}")
        self.pos += 1
        elements: list = []
        self.skip_ws()
        if self.peek() == 0x5D:
            self.pos += 1
            return elements
        while True:
            self.skip_ws()
            elements.append(self.value(depth))
            self.skip_ws()
            c = self.peek()
            if c == 0x2C:
                self.pos += 1
            elif c == 0x5D:
                self.pos += 1
                return elements
            else:
                raise _malformed(self.pos, "expected ',' or ']' in array")

    def string(self) -> str:
        self.pos += 1  # opening quote
        data = self.data
        parts: List[str] = []
        while True:
            m = _PLAIN.match(data, self.pos)
            if m:
                try:
                    parts.append(m.group().decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise _malformed(self.pos + e.start, "invalid UTF-8 in string") from None
                self.pos = m.end()
            c = self.peek()
            if c == 0x22:
                self.pos += 1
                return "".join(parts)
            if c == 0x5C:
                self.pos += 1
                parts.append(self.escape())
            elif c == -1:
                raise _malformed(self.pos, "unterminated string")
            else:
                raise _malformed(self.pos, "unescaped control character in string")

    def hex4(self) -> int:
        m = _HEX4.match(self.data, self.pos)
        if not m:
            if self.pos + 4 > len(self.data):
                raise _malformed(self.pos, "truncated \\u escape")
            raise _malformed(self.pos, "invalid \\u escape")
        self.pos += 4
        return int(m.group(), 16)

    def escape(self) -> str:
        c = self.peek()
        if c == -1:
            raise _malformed(self.pos, "unterminated escape")
        self.pos += 1
        simple = _ESCAPES.get(c)
        if simple is not None:
            return simple
        if c != 0x75:  # u
            raise _malformed(self.pos, "invalid escape")
        first = self.hex4()
        if 0xD800 <= first <= 0xDBFF:
            if self.data[self.pos : self.pos + 2] != b"\\u":
                raise _malformed(self.pos, "unpaired surrogate escape")
            self.pos += 2
            second = self.hex4()
            if not 0xDC00 <= second <= 0xDFFF:
                raise _malformed(self.pos, "unpaired surrogate escape")
            return chr(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00))
        if 0xDC00 <= first <= 0xDFFF:
            raise _malformed(self.pos, "unpaired surrogate escape")
        return chr(first)

    def number(self) -> _Number:
        m = _NUMBER.match(self.data, self.pos)
        if m is None:  # a '-' not followed by a digit
            raise _malformed(self.pos + 1, "invalid number")
        sign, int_digits, frac, exp_sign, exp_digits = m.groups()
        if frac is not None and not frac:
            raise _malformed(m.start(3), "invalid number: no digits after '.'")
        exponent = 0
        if exp_digits is not None:
            if not exp_digits:
                raise _malformed(m.end(), "invalid number: no digits in exponent")
            # Bound the digit count before int() so a huge exponent costs nothing.
            stripped = exp_digits.lstrip(b"0")
            if len(stripped) > 10 or int(stripped or b"0") > _MAX_EXPONENT_MAGNITUDE:
                raise _malformed(m.end(), "number exponent out of range")
            exponent = int(stripped or b"0")
            if exp_sign == b"-":
                exponent = -exponent
        self.pos = m.end()
        return _Number(
            _canonical_number(sign == b"-", int_digits.decode(), (frac or b"").decode(), exponent)
        )


class _Fallback(Exception):
    """The fast path cannot decide: let the strict parser find the error."""


def _fast_number(text: str) -> _Number:
    if not text.isascii():
        raise _Fallback
    m = _NUMBER.fullmatch(text.encode("ascii"))
    if m is None:
        raise _Fallback
    sign, int_digits, frac, _, exp_digits = m.groups()
    exponent = 0
    if exp_digits is not None:
        stripped = exp_digits.lstrip(b"0")
        if not exp_digits or len(stripped) > 10 or int(stripped or b"0") > _MAX_EXPONENT_MAGNITUDE:
            raise _Fallback
        exponent = int(stripped or b"0")
        if m.group(4) == b"-":
            exponent = -exponent
    if frac is not None and not frac:
        raise _Fallback
    return _Number(_canonical_number(sign == b"-", int_digits.decode(), (frac or b"").decode(), exponent))


def _fast_int(text: str) -> _Number:
    # json's C scanner only hands over -?(0|[1-9][0-9]*) here.
    digits = text[1:] if text[0] == "-" else text
    if digits == "0":
        return _Number("0")
    stripped = digits.rstrip("0")
    zeros = len(digits) - len(stripped)
    out = stripped if digits is text else "-" + stripped
    return _Number(f"{out}e{zeros}" if zeros else out)


def _fast_object(pairs: List[Tuple[str, object]]) -> _Object:
    if len({name for name, _ in pairs}) != len(pairs):
        raise _Fallback
    return _Object(pairs)


def _reject_constant(_: str) -> object:
    raise _Fallback


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_fast(value: object) -> None:
    """What json.loads accepts but fingerprint v1 refuses: lone surrogate
    escapes and nesting deeper than MAX_DEPTH."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise _Fallback
        elif isinstance(item, list):
            if depth + 1 > MAX_DEPTH:
                raise _Fallback
            stack.extend((x, depth + 1) for x in item if not isinstance(x, _Number))
        elif isinstance(item, _Object):
            if depth + 1 > MAX_DEPTH:
                raise _Fallback
            for name, member in item.members:
                if _SURROGATE.search(name):
                    raise _Fallback
                if not isinstance(member, _Number):
                    stack.append((member, depth + 1))


def _parse_fast(data: bytes) -> object:
    """json's C scanner with hooks that keep exact numbers and refuse
    duplicates; any doubt raises _Fallback."""
    try:
        text = data.decode("utf-8")
        value = _json.loads(
            text,
            object_pairs_hook=_fast_object,
            parse_int=_fast_int,
            parse_float=_fast_number,
            parse_constant=_reject_constant,
        )
    except (_Fallback, ValueError, RecursionError):
        raise _Fallback from None
    _check_fast(value)
    return value


def _parse(data: bytes) -> object:
    try:
        return _parse_fast(data)
    except _Fallback:
        return _parse_strict(data)


def _parse_strict(data: bytes) -> object:
    parser = _Parser(data)
    parser.skip_ws()
    value = parser.value(0)
    parser.skip_ws()
    if parser.pos != len(data):
        raise _malformed(parser.pos, "unexpected data after the JSON value")
    return value


# --------------------------------------------------------------------------
# JSON Pointers (RFC 6901) of volatile fields.


def _parse_pointer(pointer: str) -> List[str]:
    if pointer == "":
        raise FingerprintError("invalid_pointer", "must not be the empty pointer (the whole document)")
    if not pointer.startswith("/"):
        raise FingerprintError("invalid_pointer", "must start with '/' (RFC 6901 JSON Pointer)")
    tokens = []
    for raw in pointer[1:].split("/"):
        out = []
        i = 0
        while i < len(raw):
            ch = raw[i]
            if ch == "~":
                nxt = raw[i + 1 : i + 2]
                if nxt == "0":
                    out.append("~")
                elif nxt == "1":
                    out.append("/")
                else:
                    raise FingerprintError("invalid_pointer", "has an invalid '~' escape (only ~0 and ~1)")
                i += 2
            else:
                out.append(ch)
                i += 1
        tokens.append("".join(out))
    return tokens


def _parse_ignore_fields(pointers: Sequence[str]) -> List[List[str]]:
    if len(pointers) > MAX_IGNORE_FIELDS:
        raise FingerprintError(
            "invalid_pointer", f"{len(pointers)} ignore_fields; the limit is {MAX_IGNORE_FIELDS}"
        )
    out = []
    for index, pointer in enumerate(pointers):
        if len(pointer.encode("utf-8", "surrogatepass")) > MAX_POINTER_BYTES:
            raise FingerprintError(
                "invalid_pointer", f"ignore_fields[{index}] is longer than {MAX_POINTER_BYTES} bytes"
            )
        try:
            out.append(_parse_pointer(pointer))
        except FingerprintError as e:
            raise FingerprintError("invalid_pointer", f"ignore_fields[{index}] {e.args[0]}") from None
    return out


def _array_index(token: str):
    if not token or not token.isascii() or not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        return None
    return int(token)


def _resolve(value: object, tokens: List[str]):
    """The path (tuple of (kind, index)) a pointer refers to, or None."""
    path = []
    for token in tokens:
        if isinstance(value, _Object):
            for i, (name, member) in enumerate(value.members):
                if name == token:
                    path.append((0, i))
                    value = member
                    break
            else:
                return None
        elif isinstance(value, list):
            index = _array_index(token)
            if index is None or index >= len(value):
                return None
            path.append((1, index))
            value = value[index]
        else:
            return None
    return tuple(path)


def _remove_pointers(value: object, pointers: List[List[str]]) -> None:
    # Resolve every pointer against the document as given, then remove the
    # deepest/highest-indexed paths first so no removal shifts another.
    paths = sorted({p for p in (_resolve(value, t) for t in pointers) if p is not None}, reverse=True)
    for path in paths:
        if not path:
            continue
        current = value
        ok = True
        for kind, index in path[:-1]:
            if kind == 0 and isinstance(current, _Object) and index < len(current.members):
                current = current.members[index][1]
            elif kind == 1 and isinstance(current, list) and index < len(current):
                current = current[index]
            else:
                ok = False
                break
        if not ok:
            continue
        kind, index = path[-1]
        if kind == 0 and isinstance(current, _Object) and index < len(current.members):
            del current.members[index]
        elif kind == 1 and isinstance(current, list) and index < len(current):
            del current[index]


# --------------------------------------------------------------------------
# Serialization.

_STRING_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
for _code in range(0x20):
    _STRING_ESCAPES.setdefault(chr(_code), "\\u%04x" % _code)
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f]')


def _write_string(out: List[str], text: str) -> None:
    out.append('"')
    out.append(_NEEDS_ESCAPE.sub(lambda m: _STRING_ESCAPES[m.group()], text))
    out.append('"')


def _write(out: List[str], value: object) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, _Number):
        out.append(value.text)
    elif isinstance(value, str):
        _write_string(out, value)
    elif isinstance(value, list):
        out.append("[")
        for i, element in enumerate(value):
            if i:
                out.append(",")
            _write(out, element)
        out.append("]")
    else:
        assert isinstance(value, _Object)
        out.append("{")
        # UTF-8 byte order equals code point order, which is Python's str order.
        for i, (name, member) in enumerate(sorted(value.members, key=lambda m: m[0])):
            if i:
                out.append(",")
            _write_string(out, name)
            out.append(":")
            _write(out, member)
        out.append("}")


# --------------------------------------------------------------------------
# Public API.

BodyLike = Union[bytes, bytearray, memoryview, str]


def _as_bytes(body: BodyLike) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


def is_json_content_type(content_type: str) -> bool:
    """``application/json`` or any ``+json`` media type (parameters ignored)."""
    essence = content_type.split(";", 1)[0].strip().lower()
    return essence == "application/json" or ("/" in essence and essence.endswith("+json"))


def canonical_json(body: BodyLike, ignore_fields: Iterable[str] = ()) -> bytes:
    """The canonical form of a JSON document (raises :class:`FingerprintError`)."""
    pointers = _parse_ignore_fields(list(ignore_fields))
    value = _parse(_as_bytes(body))
    _remove_pointers(value, pointers)
    out: List[str] = []
    _write(out, value)
    return "".join(out).encode("utf-8")


def canonical_body(body: BodyLike, content_type: str = "", ignore_fields: Iterable[str] = ()) -> bytes:
    """The bytes fingerprint v1 hashes for a body with this content type."""
    data = _as_bytes(body)
    pointers = _parse_ignore_fields(list(ignore_fields))
    if not data or not is_json_content_type(content_type):
        return data
    value = _parse(data)
    _remove_pointers(value, pointers)
    out: List[str] = []
    _write(out, value)
    return "".join(out).encode("utf-8")


def fingerprint_v1(
    method: str,
    path: str,
    body: BodyLike = b"",
    content_type: str = "",
    ignore_fields: Iterable[str] = (),
) -> bytes:
    """The 32-byte fingerprint v1 of a request, as the server computes it."""
    canonical = canonical_body(body, content_type, ignore_fields)
    upper = "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in method)
    h = hashlib.sha256()
    for part in (VERSION_TAG, upper.encode("utf-8"), path.encode("utf-8"), canonical):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()
