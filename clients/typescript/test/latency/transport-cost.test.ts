/**
 * What the client's default transport (`node:http2`, src/transport.ts) costs per Claim + Complete
 * pair against grpc-js on the same idemd: the process's CPU time per pair, the two interleaved in
 * rounds so that load on the machine lands on both alike. CPU time rather than wall time because
 * the wall time of a pair is mostly idemd's durable write, which moves with the build and the
 * load; the client's own CPU is what a slow path adds. Fails when the default costs more than
 * LIMITS of grpc-js's CPU per pair (measured: 0.5-0.6; issue 51 replaced the SDK's own HTTP/2
 * framing, which took about 0.65 of node:http2's, by node:http2 itself).
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";
import { IdemdClient } from "../../src";
import { startIdemd, type IdemdServer } from "../support/idemd";

const ROUNDS = 6;
const PAIRS_PER_ROUND = 150;
const LIMITS = { "grpc-js": 0.8 } as const;
const TRANSPORTS = ["default", "grpc-js"] as const;
const BODY = '{"amount":4200,"currency":"usd","customer":"cus_8812"}';

let idemd: IdemdServer;
const clients: Record<(typeof TRANSPORTS)[number], IdemdClient> = {} as never;

before(async () => {
  idemd = await startIdemd();
  const options = { address: idemd.address, token: "conformance-token-alice-3f9a", tls: false } as const;
  clients.default = new IdemdClient(options);
  clients["grpc-js"] = new IdemdClient({ ...options, transport: "grpc-js" });
});
after(async () => {
  Object.values(clients).forEach((c) => c.close());
  await idemd?.stop();
});

async function pair(client: IdemdClient, key: string): Promise<void> {
  await client.executeOnce({
    endpoint: "POST /v1/payments/{id}",
    key,
    request: { method: "POST", path: "/v1/payments/p1", body: BODY, contentType: "application/json" },
    maxWaitMs: 0,
    handler: () => ({ status: 201 }),
  });
}

test("the default transport (node:http2) costs well under grpc-js's CPU per Claim + Complete pair", async () => {
  const prefix = randomBytes(6).toString("hex");
  const cpuMs = { default: 0, "grpc-js": 0 };
  // Warm-up: JIT, connections.
  for (const name of TRANSPORTS) {
    for (let i = 0; i < 50; i++) await pair(clients[name], `${prefix}-warm-${name}-${i}`);
  }
  for (let round = 0; round < ROUNDS; round++) {
    for (const name of TRANSPORTS) {
      const start = process.cpuUsage();
      for (let i = 0; i < PAIRS_PER_ROUND; i++) await pair(clients[name], `${prefix}-${name}-${round}-${i}`);
      const used = process.cpuUsage(start);
      cpuMs[name] += (used.user + used.system) / 1000;
    }
  }
  const perPair = (name: keyof typeof cpuMs): number => cpuMs[name] / (ROUNDS * PAIRS_PER_ROUND);
  const ratio = (other: keyof typeof LIMITS): number => perPair("default") / perPair(other);
  console.log(`latency: client CPU per Claim+Complete pair: default transport (node-http2) ${perPair("default").toFixed(3)} ms, grpc-js ${perPair("grpc-js").toFixed(3)} ms (ratio ${ratio("grpc-js").toFixed(2)})`);
  for (const other of ["grpc-js"] as const) {
    assert.ok(ratio(other) < LIMITS[other],
      `the default transport takes ${ratio(other).toFixed(2)} of ${other}'s CPU per pair (limit ${LIMITS[other]}): the slow path is back`);
  }
});
