/**
 * What each middleware costs at one request in flight (docs/sdk.md records the numbers): the same
 * app with and without it, over real HTTP, against the live idemd; p50 of 200 requests each, a
 * new connection per request. Prints them; fails only when a replay's p50 is over 10 ms.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";
import { IdemdClient } from "../../src";
import { FRONTS } from "../support/fronts";
import { send } from "../support/http-scenarios";
import { startIdemd, type IdemdServer } from "../support/idemd";

const SAMPLES = 200;
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

async function timed(port: number, key: (i: number) => string, count: number): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < count; i++) {
    const started = process.hrtime.bigint();
    const reply = await send(port, {
      method: "POST",
      path: "/v1/payments/p1",
      headers: [["idempotency-key", key(i)], ["content-type", "application/json"]],
      body: BODY,
    }, "");
    samples.push(Number(process.hrtime.bigint() - started) / 1e6);
    assert.equal(reply?.status, 201);
  }
  return samples;
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
      await timed(bare.port, (i) => `${prefix}-warm-${i}`, 20);
      await timed(front.port, (i) => `${prefix}-warm-${i}`, 20);
      const without = await timed(bare.port, (i) => `${prefix}-bare-${i}`, SAMPLES);
      const fresh = await timed(front.port, (i) => `${prefix}-fresh-${i}`, SAMPLES);
      const replay = await timed(front.port, (i) => `${prefix}-fresh-${i}`, SAMPLES);
      console.log(`latency: ${name} middleware, one in flight, ${SAMPLES} requests each: without p50 ${p50(without).toFixed(2)} ms; fresh p50 ${p50(fresh).toFixed(2)} ms; replay p50 ${p50(replay).toFixed(2)} ms`);
      assert.ok(p50(replay) < 10, `replay p50 ${p50(replay)} ms`);
    } finally {
      await bare.close();
      await front.close();
    }
  });
}
