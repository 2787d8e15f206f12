/** Drives examples/payments-server.ts (Express + the middleware) over real HTTP, backed by a live idemd. */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import type { Server } from "node:http";
import { after, before, describe, test } from "node:test";
import { createPaymentsServer, FakeProvider } from "../examples/payments-server";
import { IdemdClient, v1 } from "../src";
import { startIdemd, type IdemdServer } from "./support/idemd";

const ALICE = "conformance-token-alice-3f9a";

/** The problem's name: the last segment of its `type`. */
function problemOf(body: unknown): string | undefined {
  return (body as { type?: string }).type?.split("/").pop();
}

describe("HTTP example (POST /v1/payments)", () => {
  let idemd: IdemdServer;
  let client: IdemdClient;
  let http: Server;
  let provider: FakeProvider;
  let url: string;

  before(async () => {
    idemd = await startIdemd();
    client = new IdemdClient({ address: idemd.address, token: ALICE, tls: false });
    provider = new FakeProvider();
    http = createPaymentsServer(client, provider, { maxWaitMs: 500 });
    await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/v1/payments`;
  });

  after(async () => {
    await new Promise<void>((resolve) => http?.close(() => resolve()));
    client?.close();
    await idemd?.stop();
  });

  const post = (body: string, headers: Record<string, string> = {}): Promise<Response> =>
    fetch(url, { method: "POST", headers: { "Content-Type": "application/json", ...headers }, body });

  test("missing Idempotency-Key → 400 idempotency_key_missing", async () => {
    const res = await post('{"amount":4200,"currency":"usd"}');
    assert.equal(res.status, 400);
    assert.equal(problemOf(await res.json()), "idempotency_key_missing");
  });

  test("malformed Idempotency-Key → 400 idempotency_key_malformed", async () => {
    const res = await post('{"amount":4200,"currency":"usd"}', { "Idempotency-Key": "not a valid key!" });
    assert.equal(res.status, 400);
    assert.equal(problemOf(await res.json()), "idempotency_key_malformed");
    const tooLong = await post('{"amount":4200,"currency":"usd"}', { "Idempotency-Key": "k".repeat(256) });
    assert.equal(tooLong.status, 400);
    assert.equal(problemOf(await tooLong.json()), "idempotency_key_malformed");
  });

  test("first POST → 201, retry → same body + Idempotent-Replayed, changed body → 422", async () => {
    const key = randomUUID();
    const body = '{"amount":4200,"currency":"usd","customer":"cus_8812"}';

    const first = await post(body, { "idempotency-key": key }); // header name is case-insensitive
    assert.equal(first.status, 201);
    assert.equal(first.headers.get("idempotent-replayed"), null);
    const firstBody = await first.text();
    assert.match((JSON.parse(firstBody) as { id: string }).id, /^pay_/);

    // Same operation, keys in another order: the same fingerprint.
    const retry = await post('{"customer":"cus_8812","currency":"usd","amount":4200}', { "Idempotency-Key": key });
    assert.equal(retry.status, 201);
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.match(retry.headers.get("content-type") ?? "", /^application\/json/);
    assert.equal(await retry.text(), firstBody);

    const changed = await post('{"amount":42000,"currency":"usd","customer":"cus_8812"}', { "Idempotency-Key": key });
    assert.equal(changed.status, 422);
    assert.equal(problemOf(await changed.json()), "idempotency_key_reuse");

    assert.equal(provider.charges.size, 1, "the provider was charged exactly once");
  });

  test("concurrent duplicates: one charge, every answer the same payment", async () => {
    const key = randomUUID();
    const body = '{"amount":999,"currency":"eur"}';
    const before = provider.charges.size;
    const answers = await Promise.all(Array.from({ length: 4 }, () => post(body, { "Idempotency-Key": key })));
    const bodies = await Promise.all(answers.map((r) => r.text()));
    assert.deepEqual(answers.map((r) => r.status), [201, 201, 201, 201]);
    assert.equal(new Set(bodies).size, 1);
    assert.equal(answers.filter((r) => r.headers.get("idempotent-replayed") === "true").length, 3);
    assert.equal(provider.charges.size, before + 1);
  });

  test("an invalid payment is refused before any side effect, so the key stays usable", async () => {
    const key = randomUUID();
    const bad = await post('{"amount":-1,"currency":"usd"}', { "Idempotency-Key": key });
    assert.equal(bad.status, 400);
    assert.equal(((await bad.json()) as { error: string }).error, "invalid_request");
    // The key was released (Fail RELEASE): a corrected retry with the same key executes.
    const fixed = await post('{"amount":100,"currency":"usd"}', { "Idempotency-Key": key });
    assert.equal(fixed.status, 201);
    assert.equal(fixed.headers.get("idempotent-replayed"), null);
  });

  test("a request still in flight → 409 request_in_progress with Retry-After", async () => {
    const key = randomUUID();
    const body = '{"amount":100,"currency":"usd"}';
    // Someone else holds the key (a raw claim that never completes within the test).
    const held = await client.claim({
      endpoint: "POST /v1/payments",
      key,
      request: { method: "POST", path: "/v1/payments", body: Buffer.from(body), contentType: "application/json" },
      lease: { seconds: 30, nanos: 0 },
    });
    assert.ok(held.claimed);
    const started = Date.now();
    const res = await post(body, { "Idempotency-Key": key });
    assert.equal(res.status, 409);
    assert.equal(problemOf(await res.json()), "request_in_progress");
    assert.match(res.headers.get("retry-after") ?? "", /^[1-9][0-9]*$/);
    assert.ok(Date.now() - started >= 450, "the executor waited its budget before answering 409");
  });
  test("an undecided earlier outcome → 409 outcome_pending", async () => {
    const key = randomUUID();
    const body = '{"amount":100,"currency":"usd"}';
    const held = await client.claim({
      endpoint: "POST /v1/payments",
      key,
      request: { method: "POST", path: "/v1/payments", body: Buffer.from(body), contentType: "application/json" },
    });
    await client.fail({
      endpoint: "POST /v1/payments",
      key,
      leaseToken: held.claimed!.leaseToken,
      disposition: v1.Disposition.DISPOSITION_UNKNOWN,
      reason: "provider timed out",
    });
    const res = await post(body, { "Idempotency-Key": key });
    assert.equal(res.status, 409);
    assert.equal(problemOf(await res.json()), "outcome_pending");
  });
});
