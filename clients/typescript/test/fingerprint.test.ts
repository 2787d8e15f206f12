/** Fingerprint v1 edge cases beyond the shared vectors. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { canonicalBody, FingerprintError, fingerprintV1, isJsonMediaType } from "../src";

const JSON_TYPE = "application/json";
const canon = (body: string | Buffer, ignore: string[] = []): string =>
  canonicalBody(typeof body === "string" ? Buffer.from(body, "utf8") : body, JSON_TYPE, ignore).toString("utf8");
const refused = (body: string | Buffer, errorClass: string, ignore: string[] = []): void => {
  assert.throws(
    () => canon(body, ignore),
    (err: unknown) => err instanceof FingerprintError && err.errorClass === errorClass,
    `${JSON.stringify(body.toString()).slice(0, 60)} → ${errorClass}`,
  );
};

describe("canonical numbers", () => {
  const cases: Array<[string, string]> = [
    ["4200", "42e2"],
    ["4200.0", "42e2"],
    ["4.2e3", "42e2"],
    ["4.2E+3", "42e2"],
    ["0.5", "5e-1"],
    ["-12.340e+1", "-1234e-1"],
    ["1.0e-0", "1"],
    ["-0.0e5", "0"],
    ["0e-7", "0"],
    ["10", "1e1"],
    ["7", "7"],
    ["0.000", "0"],
    ["100.50", "1005e-1"],
    ["9007199254740993", "9007199254740993"],
    ["-9007199254740993000", "-9007199254740993e3"],
    ["1e1000000000", "1e1000000000"],
    ["1e-1000000000", "1e-1000000000"],
    ["1.5e00000000000000000001", "15"],
  ];
  for (const [input, want] of cases) {
    test(`${input} → ${want}`, () => assert.equal(canon(`[${input}]`), `[${want}]`));
  }
  for (const bad of ["-", "1.", ".5", "+1", "01", "-01", "1e", "1e+", "0x10", "1e1000000001", "1e99999999999999999999", "Infinity", "-NaN"]) {
    test(`${bad} is malformed`, () => refused(`[${bad}]`, "malformed_json"));
  }
});

describe("strict parsing", () => {
  test("a byte-order mark is refused", () => refused(Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d]), "malformed_json"));
  test("invalid UTF-8 in a string is refused", () => refused(Buffer.from([0x22, 0xc3, 0x28, 0x22]), "malformed_json"));
  test("an overlong UTF-8 sequence is refused", () => refused(Buffer.from([0x22, 0xc0, 0xaf, 0x22]), "malformed_json"));
  test("an encoded surrogate is refused", () => refused(Buffer.from([0x22, 0xed, 0xa0, 0x80, 0x22]), "malformed_json"));
  test("non-ASCII outside strings is refused", () => refused(Buffer.from("[1,\u00a02]"), "malformed_json"));
  test("a raw control character in a string is refused", () => refused('["a\tb"]', "malformed_json"));
  test("a lone low surrogate escape is refused", () => refused('["\\udc00"]', "malformed_json"));
  test("a high surrogate followed by a non-surrogate is refused", () => refused('["\\ud800\\u0041"]', "malformed_json"));
  test("an invalid escape is refused", () => refused('["\\x41"]', "malformed_json"));
  test("single quotes are refused", () => refused("['a']", "malformed_json"));
  test("a missing value is refused", () => refused('{"a":}', "malformed_json"));
  test("an empty document with a JSON type is hashed as empty bytes", () => assert.equal(canon(""), ""));
  test("whitespace only is malformed", () => refused("  ", "malformed_json"));
  test("truncated literals are refused", () => refused("[tru]", "malformed_json"));
  test("a U+FEFF inside a string is kept", () => assert.equal(canon('"\\ufeffx"'), "\"\ufeffx\""));
  test("a NUL escape stays escaped", () => assert.equal(canon('"\\u0000"'), '"\\u0000"'));
  test("duplicate names in nested objects are refused", () => refused('{"a":{"b":1,"b":2}}', "duplicate_key"));
  test("the same name in sibling objects is fine", () => assert.equal(canon('[{"a":1},{"a":2}]'), '[{"a":1},{"a":2}]'));
  test("depth 128 of objects is accepted, 129 refused", () => {
    const nested = (n: number): string => '{"a":'.repeat(n - 1) + "{}" + "}".repeat(n - 1);
    assert.equal(canon(nested(128)), nested(128));
    refused(nested(129), "too_deep");
  });
});

describe("ignore_fields", () => {
  test("a pointer into an array by an index with a leading zero matches nothing", () =>
    assert.equal(canon('{"a":[1,2]}', ["/a/01", "/a/-"]), '{"a":[1,2]}'));
  test("the same pointer twice removes one member", () =>
    assert.equal(canon('{"a":[1,2,3]}', ["/a/0", "/a/0"]), '{"a":[2,3]}'));
  test("a pointer below a removed member is harmless", () =>
    assert.equal(canon('{"a":{"b":1},"c":2}', ["/a", "/a/b"]), '{"c":2}'));
  test("the empty member name is addressable", () => assert.equal(canon('{"":1,"b":2}', ["/"]), '{"b":2}'));
  test("more than 64 pointers are refused", () =>
    refused("{}", "invalid_pointer", Array.from({ length: 65 }, (_, i) => `/f${i}`)));
  test("a pointer longer than 1024 bytes is refused", () => refused("{}", "invalid_pointer", [`/${"x".repeat(1024)}`]));
  test("an invalid pointer is refused even for a non-JSON body", () =>
    assert.throws(() => canonicalBody(Buffer.from("x"), "text/plain", ["nope"]), FingerprintError));
});

describe("digest", () => {
  test("a string body equals its UTF-8 bytes", () => {
    const body = '{"name":"Jürgen"}';
    assert.deepEqual(
      fingerprintV1({ method: "POST", path: "/p", body, contentType: JSON_TYPE }),
      fingerprintV1({ method: "post", path: "/p", body: Buffer.from(body, "utf8"), contentType: JSON_TYPE }),
    );
  });
  test("length framing separates path and body", () => {
    assert.notDeepEqual(
      fingerprintV1({ method: "POST", path: "/ab", body: "c", contentType: "text/plain" }),
      fingerprintV1({ method: "POST", path: "/a", body: "bc", contentType: "text/plain" }),
    );
  });
  test("JSON media types", () => {
    assert.ok(isJsonMediaType("application/json"));
    assert.ok(isJsonMediaType("Application/JSON; charset=utf-8"));
    assert.ok(isJsonMediaType("application/problem+json"));
    assert.ok(!isJsonMediaType("+json"));
    assert.ok(!isJsonMediaType("text/json"));
    assert.ok(!isJsonMediaType(""));
  });
});
