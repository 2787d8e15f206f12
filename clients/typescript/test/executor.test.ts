/** The client and executor beyond the shared scenarios, against a live idemd. */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import * as path from "node:path";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  downstreamKey,
  fingerprintV1,
  GrpcStatus,
  IdemdClient,
  NoSideEffectError,
  OutcomePendingError,
  RpcError,
  v1,
  type Handler,
  type HandlerContext,
} from "../src";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { ENDPOINT, PAYMENT } from "./support/payment";
import { startLossyProxy } from "./support/lossy-proxy";
import { repoRoot } from "./support/paths";

const ALICE = "conformance-token-alice-3f9a";
const CREATED = { status: 201, headers: [["Content-Type", "application/json"]] as Array<[string, string]>, body: '{"id":"pay_x"}' };

describe("executor and client against a live idemd", () => {
  let server: IdemdServer;
  let client: IdemdClient;

  before(async () => {
    server = await startIdemd();
    client = new IdemdClient({ address: server.address, token: ALICE, tls: false });
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });

  test("the handler gets the key, attempt 1 and downstream keys", async () => {
    const key = randomUUID();
    let seen: HandlerContext | undefined;
    const result = await client.executeOnce({
      endpoint: ENDPOINT,
      key,
      request: PAYMENT,
      handler: (ctx) => {
        seen = ctx;
        return CREATED;
      },
    });
    assert.deepEqual([result.replayed, result.attempt, result.response.status], [false, 1, 201]);
    assert.ok(seen);
    assert.equal(seen.key, key);
    assert.equal(seen.endpoint, ENDPOINT);
    assert.equal(seen.attempt, 1);
    assert.equal(seen.downstreamKey("charge"), downstreamKey(key, "charge"));
    assert.notEqual(seen.downstreamKey("charge"), seen.downstreamKey("refund"));
    const replay = await client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => assert.fail("ran twice") });
    assert.deepEqual([replay.replayed, replay.attempt], [true, undefined]);
    assert.deepEqual(replay.response, result.response);
  });

  test("a handler that outlives its lease keeps it by extension", async () => {
    const key = randomUUID();
    const leaseMs = 1_000;
    let lookupDuring: v1.LookupResponse | undefined;
    let duplicate: unknown;
    const result = await client.executeOnce({
      endpoint: ENDPOINT,
      key,
      request: PAYMENT,
      leaseMs,
      handler: async (ctx) => {
        await sleep(leaseMs * 1.6);
        // Past the original lease: still ours, and a duplicate sees in_progress, not pending.
        lookupDuring = await client.lookup({ endpoint: ENDPOINT, key });
        duplicate = await client
          .executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, maxWaitMs: 0, handler: () => assert.fail("duplicate ran") })
          .catch((err: unknown) => err);
        assert.equal(ctx.signal.aborted, false);
        return CREATED;
      },
    });
    assert.equal(result.replayed, false);
    assert.equal(lookupDuring?.record?.state, v1.State.STATE_IN_PROGRESS);
    assert.ok(lookupDuring.record.leaseExpiresAt!.getTime() > Date.now() - 200);
    assert.equal((duplicate as Error).name, "InProgressError");
    const after = await client.lookup({ endpoint: ENDPOINT, key });
    assert.equal(after.record?.state, v1.State.STATE_COMPLETED);
    assert.equal(after.record?.attempt, 1);
  });

  test("an ambiguous failure is recorded as UNKNOWN with `<Kind>: <message>` as reason", async () => {
    const key = randomUUID();
    const failure = new Error("gateway timeout from the provider");
    await assert.rejects(
      client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => Promise.reject(failure) }),
      (err) => err === failure,
    );
    const looked = await client.lookup({ endpoint: ENDPOINT, key });
    assert.equal(looked.record?.state, v1.State.STATE_UNKNOWN);
    assert.equal(looked.record?.reason, `Error: ${failure.message}`);
    await assert.rejects(
      client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => assert.fail("re-executed") }),
      (err) =>
        err instanceof OutcomePendingError &&
        err.state === "UNKNOWN" &&
        err.reason === `Error: ${failure.message}` &&
        err.httpStatus === 409 &&
        err.errorCode === "outcome_pending",
    );
    // Reconcile decides; afterwards the stored response is replayed.
    await client.reconcile({ endpoint: ENDPOINT, key, committed: { status: 201, body: Buffer.from("reconciled") } });
    const replay = await client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => assert.fail("ran") });
    assert.deepEqual([replay.replayed, replay.response.body.toString()], [true, "reconciled"]);
  });

  test("the reason names the error's kind, `thrown` for a non-Error, and is cut to 1024 bytes on a character boundary", async () => {
    const reasonOf = async (thrown: unknown): Promise<string | undefined> => {
      const key = randomUUID();
      await assert.rejects(client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => { throw thrown; } }));
      return (await client.lookup({ endpoint: ENDPOINT, key })).record?.reason;
    };
    assert.equal(await reasonOf(new RangeError("amount out of range")), "RangeError: amount out of range");
    assert.equal(await reasonOf("boom"), "thrown: boom");
    // "Error: x" (8 bytes), then 3-byte characters: byte 1024 falls inside the 339th, which goes.
    const reason = (await reasonOf(new Error(`x${"€".repeat(400)}`)))!;
    assert.equal(reason, `Error: x${"€".repeat(338)}`);
    assert.equal(Buffer.byteLength(reason), 1022);
  });

  test("a NoSideEffectError subclass releases the key", async () => {
    class Declined extends NoSideEffectError {}
    const key = randomUUID();
    await assert.rejects(
      client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => { throw new Declined("card declined"); } }),
      Declined,
    );
    await assert.rejects(client.lookup({ endpoint: ENDPOINT, key }), (err) => err instanceof RpcError && err.codeName === "NOT_FOUND");
  });

  test("a handler response that cannot be a response is an ambiguous failure", async () => {
    const key = randomUUID();
    await assert.rejects(
      client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => ({ status: 42 }) }),
      TypeError,
    );
    const looked = await client.lookup({ endpoint: ENDPOINT, key });
    assert.equal(looked.record?.state, v1.State.STATE_UNKNOWN);
  });

  test("handlers defined apart from the call type-check, annotated or not", async () => {
    // What TypeScript infers here is `headers: string[][]`, not a tuple type: accepted.
    const inferred = async () => ({ status: 201, headers: [["Content-Type", "text/plain"], ["X-Step", "1"]], body: "a" });
    const annotated: Handler = (ctx) => ({ status: 201, headers: [["X-Attempt", String(ctx.attempt)]], body: "b" });
    async function declared(ctx: HandlerContext) {
      return { status: 202, headers: [["X-Key-Length", String(ctx.key.length)]] };
    }
    const results = [];
    for (const handler of [inferred, annotated, declared]) {
      results.push(await client.executeOnce({ endpoint: ENDPOINT, key: randomUUID(), request: PAYMENT, handler }));
    }
    assert.deepEqual(
      results.map(({ response }) => [response.status, response.headers, response.body.toString()]),
      [
        [201, [["Content-Type", "text/plain"], ["X-Step", "1"]], "a"],
        [201, [["X-Attempt", "1"]], "b"],
        [202, [["X-Key-Length", "36"]], ""],
      ],
    );
  });

  test("a header that is not a [name, value] pair is an ambiguous failure", async () => {
    const key = randomUUID();
    await assert.rejects(
      client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => ({ status: 201, headers: [["X-Only-Name"]] }) }),
      (err) => err instanceof TypeError && /\[name, value\] pairs/.test(err.message),
    );
    const looked = await client.lookup({ endpoint: ENDPOINT, key });
    assert.equal(looked.record?.state, v1.State.STATE_UNKNOWN);
  });

  test("a Claim retried with the same attempt_id gets the same lease", async () => {
    const key = randomUUID();
    const request = { endpoint: ENDPOINT, key, attemptId: "attempt-1", request: { ...PAYMENT, body: Buffer.from(PAYMENT.body) } };
    const first = await client.claim(request);
    const again = await client.claim(request);
    assert.ok(first.claimed && again.claimed);
    assert.equal(again.claimed.leaseToken, first.claimed.leaseToken);
    const other = await client.claim({ ...request, attemptId: "attempt-2" });
    assert.ok(other.inProgress);
    assert.equal(other.httpStatus, 409);
    assert.equal(other.errorCode, "request_in_progress");
  });

  test("a lost Claim response is retried with the same attempt_id and executes once", async () => {
    const proxy = await startLossyProxy(server.address);
    const viaProxy = new IdemdClient({ address: proxy.address, token: ALICE, tls: false });
    try {
      const key = randomUUID();
      let calls = 0;
      const result = await viaProxy.executeOnce({
        endpoint: ENDPOINT,
        key,
        request: PAYMENT,
        handler: () => {
          calls++;
          return CREATED;
        },
      });
      assert.ok(proxy.droppedFrames() > 0, "the first response was lost");
      assert.ok(proxy.connections() >= 2, "the client reconnected");
      assert.deepEqual([result.replayed, result.attempt, calls], [false, 1, 1]);
      const looked = await client.lookup({ endpoint: ENDPOINT, key });
      assert.equal(looked.record?.state, v1.State.STATE_COMPLETED);
    } finally {
      viaProxy.close();
      await proxy.close();
    }
  });

  test("bodies over 1 MiB need a local fingerprint", async () => {
    const key = randomUUID();
    const big = { ...PAYMENT, body: JSON.stringify({ amount: 1, blob: "x".repeat(1024 * 1024) }) };
    await assert.rejects(
      client.executeOnce({ endpoint: ENDPOINT, key, request: big, handler: () => assert.fail("ran") }),
      (err) =>
        err instanceof RpcError &&
        err.code === GrpcStatus.RESOURCE_EXHAUSTED &&
        err.fieldViolations.some((v) => v.field.includes("body")),
    );
    const first = await client.executeOnce({ endpoint: ENDPOINT, key, request: big, fingerprint: "local", handler: () => CREATED });
    assert.equal(first.replayed, false);
    const again = await client.executeOnce({ endpoint: ENDPOINT, key, request: big, fingerprint: "local", handler: () => assert.fail("ran") });
    assert.equal(again.replayed, true);
  });

  test("idemd computes the local fingerprint for every vector (and refuses the error vectors)", async () => {
    const file = JSON.parse(readFileSync(path.join(repoRoot, "proto", "testdata", "fingerprint-v1.json"), "utf8")) as {
      vectors: Array<{
        name: string; method: string; path: string; content_type: string; body_utf8?: string; body_hex?: string;
        ignore_fields: string[]; sha256_hex?: string; error?: string;
      }>;
    };
    for (const vector of file.vectors) {
      const body = vector.body_hex !== undefined ? Buffer.from(vector.body_hex, "hex") : Buffer.from(vector.body_utf8 ?? "", "utf8");
      const request = { method: vector.method, path: vector.path, body, contentType: vector.content_type, ignoreFields: vector.ignore_fields };
      const claim = client.claim({ endpoint: "POST /v1/fingerprints", key: randomUUID(), request });
      if (vector.error !== undefined) {
        await assert.rejects(claim, (err) => err instanceof RpcError && err.codeName === "INVALID_ARGUMENT", vector.name);
        continue;
      }
      const response = await claim;
      assert.equal(response.fingerprint.toString("hex"), vector.sha256_hex, vector.name);
      assert.equal(fingerprintV1(request).toString("hex"), vector.sha256_hex, vector.name);
    }
  });

  test("an invalid key is INVALID_ARGUMENT with a field violation, not retried", async () => {
    let calls = 0;
    await assert.rejects(
      client.executeOnce({ endpoint: ENDPOINT, key: "no spaces allowed", request: PAYMENT, handler: () => { calls++; return CREATED; } }),
      (err) => err instanceof RpcError && err.codeName === "INVALID_ARGUMENT" && err.fieldViolations.length > 0,
    );
    assert.equal(calls, 0);
  });

  test("an unreachable server fails with UNAVAILABLE after the transport retries", async () => {
    const port = await new Promise<number>((resolve) => {
      const probe = createServer().listen(0, "127.0.0.1", () => {
        const { port } = probe.address() as AddressInfo;
        probe.close(() => resolve(port));
      });
    });
    const nowhere = new IdemdClient({ address: `127.0.0.1:${port}`, token: ALICE, tls: false, deadlineMs: 2_000 });
    try {
      await assert.rejects(
        nowhere.executeOnce({ endpoint: ENDPOINT, key: randomUUID(), request: PAYMENT, maxWaitMs: 0, transportRetries: 2, handler: () => assert.fail("ran") }),
        (err) => err instanceof RpcError && err.code === GrpcStatus.UNAVAILABLE,
      );
    } finally {
      nowhere.close();
    }
  });

  test("a per-call deadline and an abort signal end a call", async () => {
    const key = randomUUID();
    const held = await client.claim({ endpoint: ENDPOINT, key, request: { ...PAYMENT, body: Buffer.from(PAYMENT.body) } });
    assert.ok(held.claimed);
    const waiting = { endpoint: ENDPOINT, key, request: { ...PAYMENT, body: Buffer.from(PAYMENT.body) }, wait: { seconds: 5, nanos: 0 } };
    // DEADLINE_EXCEEDED from the client's timer, or CANCELLED "Timeout expired" when idemd's
    // (tonic's) grpc-timeout timer fires first.
    await assert.rejects(
      client.claim(waiting, { deadlineMs: 200 }),
      (err) =>
        err instanceof RpcError &&
        (err.code === GrpcStatus.DEADLINE_EXCEEDED || (err.code === GrpcStatus.CANCELLED && err.details === "Timeout expired")),
    );
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    await assert.rejects(client.claim(waiting, { signal: controller.signal }), (err) => err instanceof RpcError && err.code === GrpcStatus.CANCELLED);
  });
});

describe("development server without auth", () => {
  let server: IdemdServer;
  before(async () => {
    server = await startIdemd({ auth: false });
  });
  after(async () => {
    await server?.stop();
  });

  test("x-tenant-id scopes the records", async () => {
    const acme = new IdemdClient({ address: server.address, tenantId: "acme", tls: false });
    const globex = new IdemdClient({ address: server.address, tenantId: "globex", tls: false });
    try {
      const key = randomUUID();
      await acme.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => CREATED });
      assert.equal((await acme.lookup({ endpoint: ENDPOINT, key })).record?.state, v1.State.STATE_COMPLETED);
      await assert.rejects(globex.lookup({ endpoint: ENDPOINT, key }), (err) => err instanceof RpcError && err.codeName === "NOT_FOUND");
    } finally {
      acme.close();
      globex.close();
    }
  });
});

describe("client options", () => {
  test("a missing CA file is reported when the client is created", () => {
    assert.throws(() => new IdemdClient({ address: "127.0.0.1:1", tls: { caFile: "/nonexistent/ca.pem" } }), /ENOENT/);
  });

  test("an address is required", () => {
    assert.throws(() => new IdemdClient({ address: "" }), TypeError);
  });
});
