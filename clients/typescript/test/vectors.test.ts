/** Fingerprint v1 and downstream-key vectors shared by every implementation. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { describe, test } from "node:test";
import { canonicalBody, downstreamKey, FingerprintError, fingerprintV1, MissingKeyError, messageKey } from "../src";
import { conformanceDir, repoRoot } from "./support/paths";

interface FingerprintVector {
  name: string;
  method: string;
  path: string;
  content_type: string;
  body_utf8?: string;
  body_hex?: string;
  ignore_fields: string[];
  canonical_body_hex?: string;
  sha256_hex?: string;
  error?: string;
}

const fingerprints = JSON.parse(
  readFileSync(path.join(repoRoot, "proto", "testdata", "fingerprint-v1.json"), "utf8"),
) as { version: string; vectors: FingerprintVector[] };

describe("fingerprint v1 vectors", () => {
  test("vector file is v1 and has both digests and error classes", () => {
    assert.equal(fingerprints.version, "v1");
    assert.ok(fingerprints.vectors.some((v) => v.sha256_hex));
    assert.ok(fingerprints.vectors.some((v) => v.error));
  });

  for (const vector of fingerprints.vectors) {
    test(vector.name, () => {
      const body =
        vector.body_hex !== undefined ? Buffer.from(vector.body_hex, "hex") : Buffer.from(vector.body_utf8 ?? "", "utf8");
      const input = {
        method: vector.method,
        path: vector.path,
        body,
        contentType: vector.content_type,
        ignoreFields: vector.ignore_fields,
      };
      if (vector.error !== undefined) {
        assert.throws(
          () => fingerprintV1(input),
          (err: unknown) => err instanceof FingerprintError && err.errorClass === vector.error,
        );
        assert.throws(() => canonicalBody(body, vector.content_type, vector.ignore_fields), FingerprintError);
        return;
      }
      assert.equal(
        canonicalBody(body, vector.content_type, vector.ignore_fields).toString("hex"),
        vector.canonical_body_hex,
        "canonical body",
      );
      assert.equal(fingerprintV1(input).toString("hex"), vector.sha256_hex, "sha256");
    });
  }
});

describe("downstream-key vectors", () => {
  const file = JSON.parse(readFileSync(path.join(conformanceDir, "downstream-key-v1.json"), "utf8")) as {
    version: string;
    vectors: Array<{ key: string; step: string; downstream_key: string }>;
  };

  test("vector file is v1 and not empty", () => {
    assert.equal(file.version, "v1");
    assert.ok(file.vectors.length > 0);
  });

  for (const [i, vector] of file.vectors.entries()) {
    test(`vector ${i}: ${JSON.stringify(vector.key).slice(0, 40)} / ${JSON.stringify(vector.step)}`, () => {
      const key = downstreamKey(vector.key, vector.step);
      assert.equal(key, vector.downstream_key);
      assert.match(key, /^[A-Za-z0-9_-]{43}$/);
    });
  }
});

describe("consumer key vectors", () => {
  // What every SDK's consumer helper derives from a message: a message one SDK consumed is a
  // duplicate to the others only if all of them agree.
  // Offsets past 2^53 keep their digits as strings, as kafkajs hands offsets over.
  const text = readFileSync(path.join(conformanceDir, "consumer-key-v1.json"), "utf8").replace(/"offset": (\d+)/g, '"offset": "$1"');
  const file = JSON.parse(text) as {
    version: number;
    key_header: string;
    vectors: Array<{
      name: string;
      topic: string;
      partition: number;
      offset: string;
      headers: Array<[string, string]>;
      value_hex: string;
      endpoint: string;
      key_from_header: string | null;
      key_from_position: string;
      fingerprint_hex: string;
    }>;
  };

  test("vector file is v1 and not empty", () => {
    assert.equal(file.version, 1);
    assert.ok(file.vectors.length > 0);
  });

  for (const vector of file.vectors) {
    test(vector.name.slice(0, 80), () => {
      // kafkajs hands a repeated header over as an array of its values.
      const headers: Record<string, Buffer[]> = {};
      for (const [name, value] of vector.headers) {
        (headers[name] ??= []).push(Buffer.from(value, "utf8"));
      }
      const message = { value: Buffer.from(vector.value_hex, "hex"), headers, topic: vector.topic, partition: vector.partition, offset: vector.offset };
      if (vector.key_from_header === null) {
        assert.throws(() => messageKey(message, { header: file.key_header }), MissingKeyError);
      } else {
        assert.equal(messageKey(message, { header: file.key_header }), vector.key_from_header);
      }
      assert.equal(messageKey(message, "topic-partition-offset"), vector.key_from_position);
      assert.equal(
        fingerprintV1({ method: "CONSUME", path: vector.endpoint, body: message.value }).toString("hex"),
        vector.fingerprint_hex,
      );
    });
  }
});
