/**
 * HPACK for the client's own HTTP/2 framing (src/hpack.ts): the Huffman code built from its
 * lengths, and the decoder's static and dynamic tables, against RFC 7541's examples (C.4: three
 * requests on one connection with Huffman-coded strings, each block leaning on the entries the
 * one before added); the encoder's fields decode back to what was encoded.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { encodeField, HpackDecoder, HpackError, HUFFMAN_CODES, huffmanDecode } from "../src/hpack";

test("the Huffman code is RFC 7541's: sample codes, a complete prefix code, the C.4 strings", () => {
  assert.deepEqual(HUFFMAN_CODES[0], [0x1ff8, 13]);
  assert.deepEqual(HUFFMAN_CODES[97], [0x3, 5]); // 'a'
  assert.deepEqual(HUFFMAN_CODES[203], [0x7ffffde, 27]);
  assert.deepEqual(HUFFMAN_CODES[255], [0x3ffffee, 26]);
  assert.deepEqual(HUFFMAN_CODES[256], [0x3fffffff, 30]); // EOS
  assert.equal(HUFFMAN_CODES.reduce((sum, [, length]) => sum + 2 ** -length, 0), 1);
  assert.equal(huffmanDecode(Buffer.from("f1e3c2e5f23a6ba0ab90f4ff", "hex")).toString(), "www.example.com");
  assert.equal(huffmanDecode(Buffer.from("a8eb10649cbf", "hex")).toString(), "no-cache");
  assert.throws(() => huffmanDecode(Buffer.from([0x00])), HpackError); // "0", then padding of zeros
});

test("the decoder follows RFC 7541 C.4: three blocks, one dynamic table", () => {
  const decoder = new HpackDecoder();
  assert.deepEqual(decoder.decode(Buffer.from("828684418cf1e3c2e5f23a6ba0ab90f4ff", "hex")), [
    [":method", "GET"], [":scheme", "http"], [":path", "/"], [":authority", "www.example.com"],
  ]);
  assert.deepEqual(decoder.decode(Buffer.from("828684be5886a8eb10649cbf", "hex")), [
    [":method", "GET"], [":scheme", "http"], [":path", "/"], [":authority", "www.example.com"], ["cache-control", "no-cache"],
  ]);
  assert.deepEqual(decoder.decode(Buffer.from("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf", "hex")), [
    [":method", "GET"], [":scheme", "https"], [":path", "/index.html"], [":authority", "www.example.com"], ["custom-key", "custom-value"],
  ]);
  // A size update to 0 empties the table: its entries are gone.
  assert.throws(() => decoder.decode(Buffer.from("20be", "hex")), HpackError);
});

test("the encoder's fields decode back, by static index where there is one", () => {
  const fields: Array<[string, string]> = [
    [":method", "POST"], [":scheme", "https"], [":path", "/idemd.v1.Idempotency/Claim"], [":authority", "idemd:50051"],
    ["content-type", "application/grpc"], ["te", "trailers"], ["grpc-timeout", "9999m"], ["x-long", "v".repeat(300)],
  ];
  const block = Buffer.concat(fields.map(([name, value]) => encodeField(name, value)));
  assert.deepEqual(new HpackDecoder().decode(block), fields);
  assert.equal(encodeField(":method", "POST").toString("hex"), "83");
});
