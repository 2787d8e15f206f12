/**
 * What each middleware costs at one request in flight (docs/sdk.md records the numbers): the same
 * app with and without it, over real HTTP, against the live idemd; p50 of 200 requests each, a
 * new connection per request. Prints them; fails when a replay's p50 is over 10 ms, or when a
 * fresh key's added p50 (fresh minus without) is more than 2 ms over the executor's own Claim +
 * Complete pair against the same idemd: the pair is the store's durable write, which moves with
 * the build and the machine's load; what the middleware adds on top of it (a client or channel
 * made per request, a timer, a lost TCP_NODELAY) is the SDK's.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";
import { IdemdClient } from "../../src";
import { FRONTS } from "../support/fronts";
import { send } from "../support/http-scenarios";
import { startIdemd, type IdemdServer } from "../support/idemd";

const SAMPLES = 200;
const ADDED_OVER_PAIR_LIMIT_MS = 2;
const BODY = '{"amount":4200,"currency":"usd","customer":"cus_8812"}';

let idemd: IdemdServer;
let client: IdemdClient;

before(async () => {
  idemd = await startIdemd();
  client = new IdemdClient({ address: idemd.address, token: "conformance-token-alice-3f9a", tls: false });
});
after(async () => {
  client?.close();
  await idemd?.stop();
});

/** One request over a new connection; its time in ms. */
async function timedOne(port: number, key: string): Promise<number> {
  const started = process.hrtime.bigint();
  const reply = await send(port, {
    method: "POST",
    path: "/v1/payments/p1",
    headers: [["idempotency-key", key], ["content-type", "application/json"]],
    body: BODY,
  }, "");
  assert.equal(reply?.status, 201);
  return Number(process.hrtime.bigint() - started) / 1e6;
}

/** executeOnce on a new key with a handler that does nothing (one Claim + Complete); ms. */
async function timedPair(key: string): Promise<number> {
  const started = process.hrtime.bigint();
  await client.executeOnce({
    endpoint: "POST /v1/payments/{id}",
    key,
    request: { method: "POST", path: "/v1/payments/p1", body: BODY, contentType: "application/json" },
    maxWaitMs: 0,
    handler: () => ({ status: 201 }),
  });
  return Number(process.hrtime.bigint() - started) / 1e6;
}

function p50(samples: number[]): number {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

for (const [name, start] of Object.entries(FRONTS)) {
  test(`${name} middleware latency at one request in flight`, async () => {
    const prefix = randomBytes(6).toString("hex");
    const bare = await start(undefined);
    const front = await start(client);
    try {
      const without: number[] = [];
      const fresh: number[] = [];
      const pair: number[] = [];
      const replay: number[] = [];
      // Interleaved, so that a burst of load on the machine lands on all three alike; the first
      // 20 rounds warm up (JIT, connections) and are not counted.
      for (let i = -20; i < SAMPLES; i++) {
        const took = [
          await timedOne(bare.port, `${prefix}-bare-${i}`),
          await timedOne(front.port, `${prefix}-fresh-${i}`),
          await timedPair(`${prefix}-pair-${i}`),
        ];
        if (i >= 0) [without, fresh, pair].forEach((samples, j) => samples.push(took[j]!));
      }
      for (let i = 0; i < SAMPLES; i++) replay.push(await timedOne(front.port, `${prefix}-fresh-${i}`));
      const added = p50(fresh) - p50(without);
      console.log(`latency: ${name} middleware, one in flight, ${SAMPLES} requests each: without p50 ${p50(without).toFixed(2)} ms; fresh p50 ${p50(fresh).toFixed(2)} ms; replay p50 ${p50(replay).toFixed(2)} ms; executor's Claim+Complete p50 ${p50(pair).toFixed(2)} ms`);
      assert.ok(p50(replay) < 10, `replay p50 ${p50(replay)} ms`);
      assert.ok(added < p50(pair) + ADDED_OVER_PAIR_LIMIT_MS,
        `a fresh key adds ${added.toFixed(2)} ms (p50) to the app, more than ${ADDED_OVER_PAIR_LIMIT_MS} ms over the executor's own Claim+Complete (${p50(pair).toFixed(2)} ms)`);
    } finally {
      await bare.close();
      await front.close();
    }
  });
}
