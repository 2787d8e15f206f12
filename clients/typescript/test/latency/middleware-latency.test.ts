/**
 * What each middleware costs at one request in flight (docs/sdk.md records the numbers): the same
 * app with and without it, over real HTTP, against the live idemd; p50 of 200 requests each, a
 * new connection per request. Prints them; fails when, in each of 3 rounds, a replay's p50 is over
 * 10 ms, or a fresh key's added p50 (fresh minus without) is more than 2 ms (or 0.6 of the pair,
 * whichever is more) over the executor's own Claim + Complete pair against the same idemd: the pair is the store's durable write, which moves with
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
/**
 * What a fresh key may add over the pair: 2 ms, or 0.6 of the pair when the pair is slower than
 * 3.3 ms. The SDK's own cost moves with the machine's speed as the pair does: across this
 * machine's runs a fresh key added 1.12-1.39 times the pair (the fetch front 1.21-1.39) whether
 * the pair took 1.85 ms or 8.2 ms, while a fixed 2 ms left the fetch front 0.4-0.8 ms of room on
 * a slow day (a pair of 6-7 ms) and failed CI. A delayed ACK (40 ms) or a channel made per
 * request is over either.
 */
const ADDED_OVER_PAIR_LIMIT_MS = 2;
const ADDED_OVER_PAIR_LIMIT_RATIO = 0.6;
/** How many rounds a test measures at most before it fails (see the tests). */
const ROUNDS = 3;
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

/** One round's p50s, in ms. */
interface Round {
  without: number;
  fresh: number;
  pair: number;
  replay: number;
}

/** Why a round is over the bounds, or undefined. */
function overBounds(r: Round): string | undefined {
  const added = r.fresh - r.without;
  const room = Math.max(ADDED_OVER_PAIR_LIMIT_MS, ADDED_OVER_PAIR_LIMIT_RATIO * r.pair);
  if (r.replay >= 10) return `replay p50 ${r.replay} ms`;
  if (added >= r.pair + room) {
    return `a fresh key adds ${added.toFixed(2)} ms (p50) to the app, more than ${room.toFixed(2)} ms over the executor's own Claim+Complete (${r.pair.toFixed(2)} ms)`;
  }
  return undefined;
}

for (const [name, start] of Object.entries(FRONTS)) {
  test(`${name} middleware latency at one request in flight`, async () => {
    const bare = await start(undefined);
    const front = await start(client);
    try {
      // A round over the bounds is measured again, up to ROUNDS in all: a burst of load on the
      // shared machine (CI once had every figure of a run, the app without the middleware
      // included, about twice its usual, and a fresh key 2.02 ms over the pair) passes in the
      // next round, while what the bounds are for (a channel made per request, a timer, a delayed
      // ACK) is in every round.
      let why: string | undefined;
      for (let round = 1; round <= ROUNDS; round++) {
        const r = await measure(bare.port, front.port);
        console.log(`latency: ${name} middleware, one in flight, ${SAMPLES} requests each: without p50 ${r.without.toFixed(2)} ms; fresh p50 ${r.fresh.toFixed(2)} ms; replay p50 ${r.replay.toFixed(2)} ms; executor's Claim+Complete p50 ${r.pair.toFixed(2)} ms`);
        why = overBounds(r);
        if (why === undefined) break;
        if (round < ROUNDS) console.log(`latency: ${name} round ${round} of ${ROUNDS} over the bounds (${why}); measuring again`);
      }
      assert.ok(why === undefined, why);
    } finally {
      await bare.close();
      await front.close();
    }
  });
}

/** One round: 200 requests each, interleaved, then 200 replays of the fresh keys. */
async function measure(barePort: number, frontPort: number): Promise<Round> {
  const prefix = randomBytes(6).toString("hex");
  const without: number[] = [];
  const fresh: number[] = [];
  const pair: number[] = [];
  const replay: number[] = [];
  // Interleaved, so that a burst of load on the machine lands on all three alike; the first
  // 20 rounds warm up (JIT, connections) and are not counted.
  for (let i = -20; i < SAMPLES; i++) {
    const took = [
      await timedOne(barePort, `${prefix}-bare-${i}`),
      await timedOne(frontPort, `${prefix}-fresh-${i}`),
      await timedPair(`${prefix}-pair-${i}`),
    ];
    if (i >= 0) [without, fresh, pair].forEach((samples, j) => samples.push(took[j]!));
  }
  for (let i = 0; i < SAMPLES; i++) replay.push(await timedOne(frontPort, `${prefix}-fresh-${i}`));
  return { without: p50(without), fresh: p50(fresh), pair: p50(pair), replay: p50(replay) };
}
