/**
 * What the client's default transport costs per Claim + Complete pair, against grpc-js on the
 * same idemd (src/transport.ts says why it exists): the process's CPU time per pair, the two
 * interleaved in rounds so that load on the machine lands on both alike. CPU time rather than
 * wall time because the wall time of a pair is mostly idemd's durable write, which moves with the
 * build and the load; the client's own CPU is what a slow path adds. Fails when the default
 * costs more than RATIO_LIMIT of grpc-js's CPU per pair (it measures about half).
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";
import { IdemdClient } from "../../src";
import { startIdemd, type IdemdServer } from "../support/idemd";

const ROUNDS = 6;
const PAIRS_PER_ROUND = 150;
const RATIO_LIMIT = 0.85;
const BODY = '{"amount":4200,"currency":"usd","customer":"cus_8812"}';

let idemd: IdemdServer;
const clients: Record<"default" | "grpc-js", IdemdClient> = {} as never;

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

test("the default transport costs well under grpc-js's CPU per Claim + Complete pair", async () => {
  const prefix = randomBytes(6).toString("hex");
  const cpuMs = { default: 0, "grpc-js": 0 };
  // Warm-up: JIT, connections.
  for (const name of ["default", "grpc-js"] as const) {
    for (let i = 0; i < 50; i++) await pair(clients[name], `${prefix}-warm-${name}-${i}`);
  }
  for (let round = 0; round < ROUNDS; round++) {
    for (const name of ["default", "grpc-js"] as const) {
      const start = process.cpuUsage();
      for (let i = 0; i < PAIRS_PER_ROUND; i++) await pair(clients[name], `${prefix}-${name}-${round}-${i}`);
      const used = process.cpuUsage(start);
      cpuMs[name] += (used.user + used.system) / 1000;
    }
  }
  const perPair = (name: keyof typeof cpuMs): number => cpuMs[name] / (ROUNDS * PAIRS_PER_ROUND);
  const ratio = perPair("default") / perPair("grpc-js");
  console.log(`latency: client CPU per Claim+Complete pair: default transport ${perPair("default").toFixed(3)} ms, grpc-js ${perPair("grpc-js").toFixed(3)} ms (ratio ${ratio.toFixed(2)})`);
  assert.ok(ratio < RATIO_LIMIT,
    `the default transport takes ${ratio.toFixed(2)} of grpc-js's CPU per pair (limit ${RATIO_LIMIT}): the slow path is back`);
});
