/**
 * What the client's default transport (its own HTTP/2 framing, src/h2.ts) costs per Claim +
 * Complete pair, against the node:http2 transport and grpc-js on the same idemd (src/h2.ts and
 * src/transport.ts say why each exists): the process's CPU time per pair, the three interleaved
 * in rounds so that load on the machine lands on all alike. CPU time rather than wall time
 * because the wall time of a pair is mostly idemd's durable write, which moves with the build and
 * the load; the client's own CPU is what a slow path adds. Fails when the default costs more than
 * LIMITS of the others' CPU per pair (measured: 0.63 of node:http2's, 0.33-0.45 of grpc-js's).
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";
import { IdemdClient } from "../../src";
import { startIdemd, type IdemdServer } from "../support/idemd";

const ROUNDS = 6;
const PAIRS_PER_ROUND = 150;
const LIMITS = { "node-http2": 0.8, "grpc-js": 0.6 } as const;
const TRANSPORTS = ["default", "node-http2", "grpc-js"] as const;
const BODY = '{"amount":4200,"currency":"usd","customer":"cus_8812"}';

let idemd: IdemdServer;
const clients: Record<(typeof TRANSPORTS)[number], IdemdClient> = {} as never;

before(async () => {
  idemd = await startIdemd();
  const options = { address: idemd.address, token: "conformance-token-alice-3f9a", tls: false } as const;
  clients.default = new IdemdClient(options);
  clients["node-http2"] = new IdemdClient({ ...options, transport: "node-http2" });
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

test("the default transport costs well under node:http2's and grpc-js's CPU per Claim + Complete pair", async () => {
  const prefix = randomBytes(6).toString("hex");
  const cpuMs = { default: 0, "node-http2": 0, "grpc-js": 0 };
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
  console.log(`latency: client CPU per Claim+Complete pair: default transport ${perPair("default").toFixed(3)} ms, node-http2 ${perPair("node-http2").toFixed(3)} ms (ratio ${ratio("node-http2").toFixed(2)}), grpc-js ${perPair("grpc-js").toFixed(3)} ms (ratio ${ratio("grpc-js").toFixed(2)})`);
  for (const other of ["node-http2", "grpc-js"] as const) {
    assert.ok(ratio(other) < LIMITS[other],
      `the default transport takes ${ratio(other).toFixed(2)} of ${other}'s CPU per pair (limit ${LIMITS[other]}): the slow path is back`);
  }
});
