/**
 * HPACK (RFC 7541) for the client's own HTTP/2 framing (h2.ts): a full decoder (static and
 * dynamic table, Huffman) because the server may use all of it, and an encoder that never
 * indexes (literals and static-table references only), so the server's view of our dynamic table
 * stays empty and nothing has to be kept in sync on our side.
 */

/** RFC 7541 Appendix A. */
const STATIC: ReadonlyArray<readonly [string, string]> = [
  [":authority", ""], [":method", "GET"], [":method", "POST"], [":path", "/"], [":path", "/index.html"],
  [":scheme", "http"], [":scheme", "https"], [":status", "200"], [":status", "204"], [":status", "206"],
  [":status", "304"], [":status", "400"], [":status", "404"], [":status", "500"], ["accept-charset", ""],
  ["accept-encoding", "gzip, deflate"], ["accept-language", ""], ["accept-ranges", ""], ["accept", ""],
  ["access-control-allow-origin", ""], ["age", ""], ["allow", ""], ["authorization", ""],
  ["cache-control", ""], ["content-disposition", ""], ["content-encoding", ""], ["content-language", ""],
  ["content-length", ""], ["content-location", ""], ["content-range", ""], ["content-type", ""],
  ["cookie", ""], ["date", ""], ["etag", ""], ["expect", ""], ["expires", ""], ["from", ""], ["host", ""],
  ["if-match", ""], ["if-modified-since", ""], ["if-none-match", ""], ["if-range", ""],
  ["if-unmodified-since", ""], ["last-modified", ""], ["link", ""], ["location", ""], ["max-forwards", ""],
  ["proxy-authenticate", ""], ["proxy-authorization", ""], ["range", ""], ["referer", ""], ["refresh", ""],
  ["retry-after", ""], ["server", ""], ["set-cookie", ""], ["strict-transport-security", ""],
  ["transfer-encoding", ""], ["user-agent", ""], ["vary", ""], ["via", ""], ["www-authenticate", ""],
];

/**
 * The bit length of each symbol's code (RFC 7541 Appendix B; 256 is EOS). The code is canonical
 * (codes of one length are consecutive in symbol order, shorter codes first), so the lengths
 * alone determine it; test/hpack.test.ts checks the result against the RFC's own examples.
 */
const HUFFMAN_LENGTHS = [
  13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
  6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
  13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
  15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
  20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
  22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
  26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
  20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
  30,
];

/** Symbol by (length, code): decoding walks the input bit by bit and looks up each prefix. */
const HUFFMAN_DECODE: Array<Map<number, number> | undefined> = [];
/** [code, length] by symbol, for the tests (the encoder never Huffman-codes). */
export const HUFFMAN_CODES: Array<[number, number]> = [];
{
  const order = HUFFMAN_LENGTHS.map((length, symbol) => [length, symbol] as const)
    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let code = 0;
  let previous = order[0]![0];
  for (const [length, symbol] of order) {
    code *= 2 ** (length - previous); // shift without 32-bit overflow (codes reach 30 bits)
    previous = length;
    (HUFFMAN_DECODE[length] ??= new Map()).set(code, symbol);
    HUFFMAN_CODES[symbol] = [code, length];
    code += 1;
  }
}

export class HpackError extends Error {}

/** A Huffman-coded string (RFC 7541 5.2): padding must be at most 7 one-bits of EOS's prefix. */
export function huffmanDecode(input: Uint8Array): Buffer {
  const out: number[] = [];
  let code = 0;
  let length = 0;
  for (let i = 0; i < input.length; i++) {
    const byte = input[i]!;
    for (let bit = 7; bit >= 0; bit--) {
      code = code * 2 + ((byte >> bit) & 1);
      length += 1;
      const symbol = HUFFMAN_DECODE[length]?.get(code);
      if (symbol !== undefined) {
        if (symbol === 256) throw new HpackError("EOS in a Huffman-coded string");
        out.push(symbol);
        code = 0;
        length = 0;
      } else if (length >= 30) {
        throw new HpackError("invalid Huffman code");
      }
    }
  }
  if (length > 7 || code !== 2 ** length - 1) throw new HpackError("invalid Huffman padding");
  return Buffer.from(out);
}

/** One header block's fields in order, names lowercase as HTTP/2 requires. */
export type HeaderFields = Array<[string, string]>;

/** The decoding context of one connection: the dynamic table the server's encoder fills. */
export class HpackDecoder {
  private table: Array<[string, string]> = []; // newest first
  private size = 0;
  private maxSize: number;

  /** `limit`: SETTINGS_HEADER_TABLE_SIZE we advertise (the default, 4096), the cap of size updates. */
  constructor(private readonly limit = 4096) {
    this.maxSize = limit;
  }

  decode(block: Buffer): HeaderFields {
    const fields: HeaderFields = [];
    let pos = 0;
    const integer = (prefixBits: number): number => {
      const mask = (1 << prefixBits) - 1;
      let value = block[pos++]! & mask;
      if (value < mask) return value;
      let shift = 0;
      for (;;) {
        if (pos >= block.length) throw new HpackError("truncated integer");
        const b = block[pos++]!;
        value += (b & 0x7f) * 2 ** shift;
        shift += 7;
        if ((b & 0x80) === 0) break;
        if (shift > 28) throw new HpackError("integer too large");
      }
      return value;
    };
    const string = (): string => {
      if (pos >= block.length) throw new HpackError("truncated string");
      const huffman = (block[pos]! & 0x80) !== 0;
      const length = integer(7);
      if (pos + length > block.length) throw new HpackError("truncated string");
      const raw = block.subarray(pos, pos + length);
      pos += length;
      return (huffman ? huffmanDecode(raw) : raw).toString("latin1");
    };
    let fieldSeen = false;
    while (pos < block.length) {
      const b = block[pos]!;
      if (b & 0x80) {
        fields.push(this.entry(integer(7)));
        fieldSeen = true;
      } else if ((b & 0xe0) === 0x20) {
        // A size update is only allowed at the start of a block (RFC 7541 4.2).
        if (fieldSeen) throw new HpackError("dynamic table size update after a field");
        const size = integer(5);
        if (size > this.limit) throw new HpackError("dynamic table size update over the limit");
        this.maxSize = size;
        this.evict(0);
      } else {
        const indexing = (b & 0xc0) === 0x40;
        const index = integer(indexing ? 6 : 4);
        const name = index === 0 ? string() : this.entry(index)[0];
        const value = string();
        fields.push([name, value]);
        if (indexing) this.insert(name, value);
        fieldSeen = true;
      }
    }
    return fields;
  }

  private entry(index: number): [string, string] {
    if (index === 0) throw new HpackError("index 0");
    if (index <= STATIC.length) return STATIC[index - 1] as [string, string];
    const entry = this.table[index - STATIC.length - 1];
    if (!entry) throw new HpackError(`index ${index} beyond the dynamic table`);
    return entry;
  }

  private insert(name: string, value: string): void {
    const size = name.length + value.length + 32;
    this.evict(size);
    if (size <= this.maxSize) {
      this.table.unshift([name, value]);
      this.size += size;
    }
  }

  /** Drops the oldest entries until `room` more octets fit (all of them when it never will). */
  private evict(room: number): void {
    while (this.table.length > 0 && this.size + room > this.maxSize) {
      const [name, value] = this.table.pop()!;
      this.size -= name.length + value.length + 32;
    }
  }
}

/** The static-table index of a name (its first entry), for the encoder's literal fields. */
const STATIC_NAME = new Map<string, number>();
/** The static-table index of a whole field (name and a non-empty value), by `name\0value`. */
const STATIC_FIELD = new Map<string, number>();
STATIC.forEach(([name, value], i) => {
  if (!STATIC_NAME.has(name)) STATIC_NAME.set(name, i + 1);
  if (value !== "") STATIC_FIELD.set(`${name}\0${value}`, i + 1);
});

function encodeInteger(out: number[], first: number, prefixBits: number, value: number): void {
  const mask = (1 << prefixBits) - 1;
  if (value < mask) {
    out.push(first | value);
    return;
  }
  out.push(first | mask);
  value -= mask;
  while (value >= 0x80) {
    out.push((value % 0x80) | 0x80);
    value = Math.floor(value / 0x80);
  }
  out.push(value);
}

/**
 * One field as a literal without indexing (RFC 7541 6.2.2), the name by static index when it has
 * one; a field that is a whole static entry (`:method: POST`) as its index. Strings are raw
 * octets: Huffman would save a few bytes of a loopback write at a CPU cost per call.
 */
export function encodeField(name: string, value: string): Buffer {
  const out: number[] = [];
  const whole = STATIC_FIELD.get(`${name}\0${value}`);
  if (whole !== undefined) {
    encodeInteger(out, 0x80, 7, whole);
    return Buffer.from(out);
  }
  const nameIndex = STATIC_NAME.get(name);
  encodeInteger(out, 0x00, 4, nameIndex ?? 0);
  const parts: Buffer[] = [Buffer.from(out)];
  if (nameIndex === undefined) parts.push(encodeString(name));
  parts.push(encodeString(value));
  return Buffer.concat(parts);
}

function encodeString(s: string): Buffer {
  const bytes = Buffer.from(s, "latin1");
  const prefix: number[] = [];
  encodeInteger(prefix, 0x00, 7, bytes.length);
  return Buffer.concat([Buffer.from(prefix), bytes]);
}
