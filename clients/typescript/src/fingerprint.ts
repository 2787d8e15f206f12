/**
 * Fingerprint v1 (docs/fingerprint.md), computed locally so that a client can send
 * `ClaimRequest.sha256` instead of the request (required for bodies over 1 MiB).
 *
 * The canonical JSON needs a parser of its own rather than `JSON.parse`: duplicate member
 * names must be an error, numbers must keep their exact decimal value (integers beyond 2^53,
 * `4200` = `4200.0` = `4.2e3`), object members are sorted by UTF-8 bytes (not UTF-16 code
 * units), and the nesting depth is bounded. The parser works on the raw bytes and keeps
 * strings as validated UTF-8 bytes, so nothing is ever re-encoded.
 */
import { createHash } from "node:crypto";

/** The deepest nesting of arrays and objects accepted (the outermost counts as 1). */
export const MAX_DEPTH = 128;
/** Largest accepted magnitude of a number's decimal exponent. */
const MAX_EXPONENT_MAGNITUDE = 1_000_000_000;
const MAX_POINTERS = 64;
const MAX_POINTER_BYTES = 1024;

/** The error classes of fingerprint v1, as named by the shared vectors. */
export type FingerprintErrorClass = "malformed_json" | "duplicate_key" | "too_deep" | "invalid_pointer";

/** A body or ignore-field pointer that fingerprint v1 refuses. Never carries body content. */
export class FingerprintError extends Error {
  override readonly name = "FingerprintError";
  constructor(
    /** Which rule was broken. */
    readonly errorClass: FingerprintErrorClass,
    message: string,
    /** Byte offset in the body, when the problem is in the body. */
    readonly offset?: number,
  ) {
    super(`${errorClass}: ${message}${offset === undefined ? "" : ` at byte ${offset}`}`);
  }
}

/** The request a fingerprint is computed from (the same fields as `HttpRequest` in the proto). */
export interface FingerprintInput {
  method: string;
  path: string;
  /** A string is encoded as UTF-8. */
  body?: string | Uint8Array;
  contentType?: string;
  /** RFC 6901 JSON Pointers of volatile fields to drop (JSON bodies only). */
  ignoreFields?: readonly string[];
}

/** Fingerprint v1 of a request: 32 bytes, equal to what idemd computes from the same request. */
export function fingerprintV1(input: FingerprintInput): Buffer {
  const body = toBytes(input.body);
  const canonical = canonicalBody(body, input.contentType ?? "", input.ignoreFields ?? []);
  const hash = createHash("sha256");
  for (const part of [
    Buffer.from("idemd-fingerprint-v1", "utf8"),
    Buffer.from(asciiUppercase(input.method), "utf8"),
    Buffer.from(input.path, "utf8"),
    canonical,
  ]) {
    hash.update(frameLength(part.length));
    hash.update(part);
  }
  return hash.digest();
}

/**
 * The body as fingerprint v1 hashes it: canonical JSON for a non-empty body whose media type is
 * `application/json` or `*+json`, the bytes as given otherwise.
 */
export function canonicalBody(
  body: Uint8Array,
  contentType: string,
  ignoreFields: readonly string[] = [],
): Buffer {
  // The pointers are validated whatever the body (as idemd does), but only applied to JSON.
  if (ignoreFields.length > MAX_POINTERS) {
    throw new FingerprintError("invalid_pointer", `more than ${MAX_POINTERS} ignore_fields`);
  }
  const pointers = ignoreFields.map(parsePointer);
  if (body.length === 0 || !isJsonMediaType(contentType)) {
    return Buffer.from(body);
  }
  const value = parseJson(body);
  removePointers(value, pointers);
  const out = new ByteWriter(body.length + 16);
  writeValue(out, value);
  return out.finish();
}

/** True for `application/json` and any `+json` media type (parameters and case ignored). */
export function isJsonMediaType(contentType: string): boolean {
  const essence = contentType.split(";", 1)[0]!.trim().toLowerCase();
  return essence === "application/json" || (essence.includes("/") && essence.endsWith("+json"));
}

/** 8-byte big-endian length prefix (the `frame` of fingerprint v1 and downstream keys). */
export function frameLength(length: number): Buffer {
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64BE(BigInt(length));
  return prefix;
}

function toBytes(body: string | Uint8Array | undefined): Uint8Array {
  if (body === undefined) return new Uint8Array(0);
  return typeof body === "string" ? Buffer.from(body, "utf8") : body;
}

function asciiUppercase(text: string): string {
  return text.replace(/[a-z]/g, (c) => String.fromCharCode(c.charCodeAt(0) - 32));
}

// ---------------------------------------------------------------------------------------------
// The JSON tree. Strings (and member names) are kept as their UTF-8 bytes.

type JsonValue =
  | { kind: "null" }
  | { kind: "bool"; value: boolean }
  | { kind: "number"; text: string }
  | { kind: "string"; bytes: Buffer }
  | { kind: "array"; elements: JsonValue[] }
  | { kind: "object"; members: Array<[name: Buffer, value: JsonValue]> };

const NULL: JsonValue = { kind: "null" };
const TRUE: JsonValue = { kind: "bool", value: true };
const FALSE: JsonValue = { kind: "bool", value: false };

const utf8Validator = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Parses a complete JSON document strictly (RFC 8259, UTF-8, no BOM). */
function parseJson(input: Uint8Array): JsonValue {
  const parser = new Parser(input);
  parser.skipWhitespace();
  const value = parser.parseValue(0);
  parser.skipWhitespace();
  if (parser.pos !== input.length) {
    throw parser.malformed("unexpected data after the JSON value");
  }
  return value;
}

class Parser {
  pos = 0;
  constructor(private readonly input: Uint8Array) {}

  malformed(reason: string): FingerprintError {
    return new FingerprintError("malformed_json", reason, this.pos);
  }

  private peek(): number | undefined {
    return this.input[this.pos];
  }

  skipWhitespace(): void {
    for (;;) {
      const c = this.peek();
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) this.pos++;
      else return;
    }
  }

  parseValue(depth: number): JsonValue {
    const c = this.peek();
    switch (c) {
      case undefined:
        throw this.malformed("unexpected end of input");
      case 0x7b: // {
        return this.parseObject(depth + 1);
      case 0x5b: // [
        return this.parseArray(depth + 1);
      case 0x22: // "
        return { kind: "string", bytes: this.parseString() };
      case 0x74: // t
        return this.expectLiteral("true", TRUE);
      case 0x66: // f
        return this.expectLiteral("false", FALSE);
      case 0x6e: // n
        return this.expectLiteral("null", NULL);
      default:
        if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return this.parseNumber();
        throw this.malformed("unexpected character");
    }
  }

  private expectLiteral(literal: string, value: JsonValue): JsonValue {
    for (let i = 0; i < literal.length; i++) {
      if (this.input[this.pos + i] !== literal.charCodeAt(i)) {
        throw this.malformed("invalid literal");
      }
    }
    this.pos += literal.length;
    return value;
  }

  private parseObject(depth: number): JsonValue {
    if (depth > MAX_DEPTH) {
      throw new FingerprintError("too_deep", `JSON nesting deeper than ${MAX_DEPTH} levels`, this.pos);
    }
    this.pos++; // {
    const members: Array<[Buffer, JsonValue]> = [];
    const names = new Set<string>();
    this.skipWhitespace();
    if (this.peek() === 0x7d) {
      this.pos++;
      return { kind: "object", members };
    }
    for (;;) {
      this.skipWhitespace();
      if (this.peek() !== 0x22) throw this.malformed("expected a string object key");
      const nameOffset = this.pos;
      const name = this.parseString();
      // latin1 maps each byte to one code unit: equal strings <=> equal bytes.
      const id = name.toString("latin1");
      if (names.has(id)) {
        throw new FingerprintError("duplicate_key", "duplicate object member name", nameOffset);
      }
      names.add(id);
      this.skipWhitespace();
      if (this.peek() !== 0x3a) throw this.malformed("expected ':' after object key");
      this.pos++;
      this.skipWhitespace();
      members.push([name, this.parseValue(depth)]);
      this.skipWhitespace();
      const c = this.peek();
      if (c === 0x2c) {
        this.pos++;
      } else if (c === 0x7d) {
        this.pos++;
        return { kind: "object", members };
      } else {
        throw this.malformed("expected ',' or '}' in object");
      }
    }
  }

  private parseArray(depth: number): JsonValue {
    if (depth > MAX_DEPTH) {
      throw new FingerprintError("too_deep", `JSON nesting deeper than ${MAX_DEPTH} levels`, this.pos);
    }
    this.pos++; // [
    const elements: JsonValue[] = [];
    this.skipWhitespace();
    if (this.peek() === 0x5d) {
      this.pos++;
      return { kind: "array", elements };
    }
    for (;;) {
      this.skipWhitespace();
      elements.push(this.parseValue(depth));
      this.skipWhitespace();
      const c = this.peek();
      if (c === 0x2c) {
        this.pos++;
      } else if (c === 0x5d) {
        this.pos++;
        return { kind: "array", elements };
      } else {
        throw this.malformed("expected ',' or ']' in array");
      }
    }
  }

  /** Parses a string at `"`; returns its decoded content as UTF-8 bytes. */
  private parseString(): Buffer {
    this.pos++; // opening quote
    const out = new ByteWriter(32);
    let hasRawNonAscii = false;
    for (;;) {
      const c = this.peek();
      if (c === undefined) throw this.malformed("unterminated string");
      if (c === 0x22) {
        this.pos++;
        const bytes = out.finish();
        if (hasRawNonAscii) {
          // Escapes only ever add valid UTF-8, so this checks the raw bytes.
          try {
            utf8Validator.decode(bytes);
          } catch {
            throw this.malformed("invalid UTF-8 in string");
          }
        }
        return bytes;
      }
      if (c === 0x5c) {
        this.pos++;
        this.parseEscape(out);
      } else if (c < 0x20) {
        throw this.malformed("unescaped control character in string");
      } else {
        if (c >= 0x80) hasRawNonAscii = true;
        out.byte(c);
        this.pos++;
      }
    }
  }

  private parseEscape(out: ByteWriter): void {
    const c = this.peek();
    if (c === undefined) throw this.malformed("unterminated escape");
    this.pos++;
    switch (c) {
      case 0x22:
        return out.byte(0x22);
      case 0x5c:
        return out.byte(0x5c);
      case 0x2f:
        return out.byte(0x2f);
      case 0x62: // b
        return out.byte(0x08);
      case 0x66: // f
        return out.byte(0x0c);
      case 0x6e: // n
        return out.byte(0x0a);
      case 0x72: // r
        return out.byte(0x0d);
      case 0x74: // t
        return out.byte(0x09);
      case 0x75: {
        // u
        const first = this.parseHex4();
        let code = first;
        if (first >= 0xd800 && first <= 0xdbff) {
          if (this.input[this.pos] !== 0x5c || this.input[this.pos + 1] !== 0x75) {
            throw this.malformed("unpaired surrogate escape");
          }
          this.pos += 2;
          const second = this.parseHex4();
          if (second < 0xdc00 || second > 0xdfff) throw this.malformed("unpaired surrogate escape");
          code = 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
        } else if (first >= 0xdc00 && first <= 0xdfff) {
          throw this.malformed("unpaired surrogate escape");
        }
        return out.codePoint(code);
      }
      default:
        throw this.malformed("invalid escape");
    }
  }

  private parseHex4(): number {
    if (this.pos + 4 > this.input.length) throw this.malformed("truncated \\u escape");
    let code = 0;
    for (let i = 0; i < 4; i++) {
      const c = this.input[this.pos + i]!;
      let nibble: number;
      if (c >= 0x30 && c <= 0x39) nibble = c - 0x30;
      else if (c >= 0x61 && c <= 0x66) nibble = c - 0x61 + 10;
      else if (c >= 0x41 && c <= 0x46) nibble = c - 0x41 + 10;
      else throw this.malformed("invalid \\u escape");
      code = code * 16 + nibble;
    }
    this.pos += 4;
    return code;
  }

  private digitsFrom(start: number): string {
    while (this.pos < this.input.length && this.input[this.pos]! >= 0x30 && this.input[this.pos]! <= 0x39) {
      this.pos++;
    }
    return Buffer.from(this.input.subarray(start, this.pos)).toString("latin1");
  }

  private parseNumber(): JsonValue {
    const negative = this.peek() === 0x2d;
    if (negative) this.pos++;
    const intStart = this.pos;
    const first = this.peek();
    let intDigits: string;
    if (first === 0x30) {
      this.pos++;
      intDigits = "0";
    } else if (first !== undefined && first >= 0x31 && first <= 0x39) {
      intDigits = this.digitsFrom(intStart);
    } else {
      throw this.malformed("invalid number");
    }
    let fracDigits = "";
    if (this.peek() === 0x2e) {
      this.pos++;
      fracDigits = this.digitsFrom(this.pos);
      if (fracDigits.length === 0) throw this.malformed("invalid number: no digits after '.'");
    }
    let exponent = 0;
    const e = this.peek();
    if (e === 0x65 || e === 0x45) {
      this.pos++;
      let expNegative = false;
      const sign = this.peek();
      if (sign === 0x2d || sign === 0x2b) {
        expNegative = sign === 0x2d;
        this.pos++;
      }
      const expDigits = this.digitsFrom(this.pos);
      if (expDigits.length === 0) throw this.malformed("invalid number: no digits in exponent");
      // Compare as text first: a long digit string must not lose precision as a double.
      const magnitudeText = expDigits.replace(/^0+(?=\d)/, "");
      if (magnitudeText.length > 10 || Number(magnitudeText) > MAX_EXPONENT_MAGNITUDE) {
        throw this.malformed("number exponent out of range");
      }
      exponent = expNegative ? -Number(magnitudeText) : Number(magnitudeText);
    }
    return { kind: "number", text: canonicalNumber(negative, intDigits, fracDigits, exponent) };
  }
}

/**
 * `-`? then the significant digits without leading or trailing zeros, then `e<exp>` when the
 * exponent is not zero; zero in any form is `0`. `4200` → `42e2`, `0.5` → `5e-1`.
 */
function canonicalNumber(negative: boolean, intDigits: string, fracDigits: string, exponent: number): string {
  const digits = intDigits + fracDigits;
  let exp = exponent - fracDigits.length;
  let start = 0;
  while (start < digits.length && digits.charCodeAt(start) === 0x30) start++;
  if (start === digits.length) return "0";
  let end = digits.length;
  while (end > start && digits.charCodeAt(end - 1) === 0x30) {
    end--;
    exp++;
  }
  return (negative ? "-" : "") + digits.slice(start, end) + (exp !== 0 ? `e${exp}` : "");
}

// ---------------------------------------------------------------------------------------------
// ignore_fields: RFC 6901 pointers, resolved against the document as sent.

function parsePointer(pointer: string): Buffer[] {
  if (pointer === "") {
    throw new FingerprintError("invalid_pointer", "the empty pointer (the whole document) cannot be ignored");
  }
  if (Buffer.byteLength(pointer, "utf8") > MAX_POINTER_BYTES) {
    throw new FingerprintError("invalid_pointer", `a pointer is longer than ${MAX_POINTER_BYTES} bytes`);
  }
  if (!pointer.startsWith("/")) {
    throw new FingerprintError("invalid_pointer", "a pointer must start with '/'");
  }
  return pointer
    .slice(1)
    .split("/")
    .map((token) => {
      if (/~(?![01])/.test(token)) {
        throw new FingerprintError("invalid_pointer", "only the escapes ~0 and ~1 are allowed");
      }
      return Buffer.from(token.replace(/~1/g, "/").replace(/~0/g, "~"), "utf8");
    });
}

/** A resolved pointer: one index per level (member position or element index). */
type Path = number[];

function resolve(root: JsonValue, tokens: Buffer[]): Path | undefined {
  const path: Path = [];
  let value = root;
  for (const token of tokens) {
    if (value.kind === "object") {
      const index = value.members.findIndex(([name]) => name.equals(token));
      if (index < 0) return undefined;
      path.push(index);
      value = value.members[index]![1];
    } else if (value.kind === "array") {
      const index = arrayIndex(token.toString("utf8"));
      if (index === undefined || index >= value.elements.length) return undefined;
      path.push(index);
      value = value.elements[index]!;
    } else {
      return undefined;
    }
  }
  return path;
}

function arrayIndex(token: string): number | undefined {
  if (!/^(0|[1-9][0-9]*)$/.test(token)) return undefined;
  const index = Number(token);
  return Number.isSafeInteger(index) ? index : undefined;
}

function comparePaths(a: Path, b: Path): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a[i] !== b[i]) return a[i]! - b[i]!;
  }
  return a.length - b.length;
}

function removePointers(root: JsonValue, pointers: Buffer[][]): void {
  // Resolve every pointer first, then remove the highest-indexed and deepest paths first, so
  // that no removal changes what another pointer refers to.
  const paths = pointers
    .map((tokens) => resolve(root, tokens))
    .filter((path): path is Path => path !== undefined)
    .sort(comparePaths);
  let previous: Path | undefined;
  for (let i = paths.length - 1; i >= 0; i--) {
    const path = paths[i]!;
    if (previous !== undefined && comparePaths(previous, path) === 0) continue;
    previous = path;
    removePath(root, path);
  }
}

function removePath(root: JsonValue, path: Path): void {
  if (path.length === 0) return;
  let current: JsonValue | undefined = root;
  for (const index of path.slice(0, -1)) {
    if (current?.kind === "object") current = current.members[index]?.[1];
    else if (current?.kind === "array") current = current.elements[index];
    else return;
  }
  const last = path[path.length - 1]!;
  if (current?.kind === "object" && last < current.members.length) current.members.splice(last, 1);
  else if (current?.kind === "array" && last < current.elements.length) current.elements.splice(last, 1);
}

// ---------------------------------------------------------------------------------------------
// Serialization.

function writeValue(out: ByteWriter, value: JsonValue): void {
  switch (value.kind) {
    case "null":
      return out.ascii("null");
    case "bool":
      return out.ascii(value.value ? "true" : "false");
    case "number":
      return out.ascii(value.text);
    case "string":
      return writeString(out, value.bytes);
    case "array":
      out.byte(0x5b);
      value.elements.forEach((element, i) => {
        if (i > 0) out.byte(0x2c);
        writeValue(out, element);
      });
      return out.byte(0x5d);
    case "object": {
      // UTF-8 byte order = code point order (UTF-16 code unit order would differ).
      const sorted = [...value.members].sort((a, b) => Buffer.compare(a[0], b[0]));
      out.byte(0x7b);
      sorted.forEach(([name, member], i) => {
        if (i > 0) out.byte(0x2c);
        writeString(out, name);
        out.byte(0x3a);
        writeValue(out, member);
      });
      return out.byte(0x7d);
    }
  }
}

const HEX = "0123456789abcdef";

function writeString(out: ByteWriter, bytes: Buffer): void {
  out.byte(0x22);
  for (const c of bytes) {
    switch (c) {
      case 0x22:
        out.ascii('\\"');
        break;
      case 0x5c:
        out.ascii("\\\\");
        break;
      case 0x08:
        out.ascii("\\b");
        break;
      case 0x0c:
        out.ascii("\\f");
        break;
      case 0x0a:
        out.ascii("\\n");
        break;
      case 0x0d:
        out.ascii("\\r");
        break;
      case 0x09:
        out.ascii("\\t");
        break;
      default:
        if (c < 0x20) out.ascii(`\\u00${HEX[c >> 4]}${HEX[c & 15]}`);
        else out.byte(c); // multi-byte UTF-8 sequences never contain bytes below 0x80
    }
  }
  out.byte(0x22);
}

/** A growable byte buffer. */
class ByteWriter {
  private buf: Buffer;
  private len = 0;
  constructor(capacity: number) {
    this.buf = Buffer.allocUnsafe(Math.max(capacity, 16));
  }
  private reserve(extra: number): void {
    if (this.len + extra <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.len + extra));
    this.buf.copy(next, 0, 0, this.len);
    this.buf = next;
  }
  byte(b: number): void {
    this.reserve(1);
    this.buf[this.len++] = b;
  }
  ascii(text: string): void {
    this.reserve(text.length);
    for (let i = 0; i < text.length; i++) this.buf[this.len++] = text.charCodeAt(i);
  }
  codePoint(code: number): void {
    this.reserve(4);
    this.len += this.buf.write(String.fromCodePoint(code), this.len, "utf8");
  }
  finish(): Buffer {
    return Buffer.from(this.buf.subarray(0, this.len));
  }
}
