/**
 * What the executor's Claim + Complete pair costs from this SDK, per transport, one call in
 * flight: the same client options and idemd, `executeOnce` on a fresh key with a handler that
 * does nothing, the transports interleaved in rounds so that a burst of load on a shared machine
 * lands on both alike. Prints p50/p99 wall time and the process's CPU time per pair.
 *
 *   node dist/bench/pair.js --idemd HOST:PORT [--pairs 2000] [--rounds 5]
 *
 * Against a development idemd (no tokens file: tenant `bench` in `x-tenant-id`, plaintext).
 */
import { randomBytes } from "node:crypto";
import { IdemdClient } from "../src";

const BODY = '{"amount":4200,"currency":"usd","customer":"cus_8812"}';
/** The default (node:http2) and grpc-js; `http2` is the default's old name. */
const TRANSPORTS = ["grpc-js", "node-http2"] as const;

function arg(name: string, fallback?: string): string {
  const i = process.argv.indexOf(`--${name}`);
  const value = i >= 0 ? process.argv[i + 1] : fallback;
  if (value === undefined) {
    process.stderr.write(`pair bench: --${name} is required\n`);
    process.exit(2);
  }
  return value;
}

async function pair(client: IdemdClient, key: string): Promise<void> {
  await client.executeOnce({
    endpoint: "POST /pay",
    key,
    request: { method: "POST", path: "/pay", body: BODY, contentType: "application/json" },
    maxWaitMs: 0,
    handler: () => ({ status: 201 }),
  });
}

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!;
}

async function main(): Promise<void> {
  const address = arg("idemd");
  const pairs = Number(arg("pairs", "2000"));
  const rounds = Number(arg("rounds", "5"));
  const prefix = randomBytes(6).toString("hex");
  const clients = Object.fromEntries(TRANSPORTS.map((t) => [t, new IdemdClient({ address, tenantId: "bench", tls: false, transport: t })]));
  const wall: Record<string, number[]> = Object.fromEntries(TRANSPORTS.map((t) => [t, []]));
  const cpu: Record<string, number> = Object.fromEntries(TRANSPORTS.map((t) => [t, 0]));
  for (const t of TRANSPORTS) for (let i = 0; i < 200; i++) await pair(clients[t]!, `${prefix}-warm-${t}-${i}`);
  const perRound = Math.ceil(pairs / rounds);
  for (let r = 0; r < rounds; r++) {
    for (const t of TRANSPORTS) {
      const cpuStart = process.cpuUsage();
      for (let i = 0; i < perRound; i++) {
        const started = process.hrtime.bigint();
        await pair(clients[t]!, `${prefix}-${t}-${r}-${i}`);
        wall[t]!.push(Number(process.hrtime.bigint() - started) / 1e6);
      }
      const used = process.cpuUsage(cpuStart);
      cpu[t]! += (used.user + used.system) / 1000;
    }
  }
  for (const t of TRANSPORTS) {
    const sorted = wall[t]!.sort((a, b) => a - b);
    console.log(`pair ${t.padEnd(10)}: ${sorted.length} pairs, p50 ${pct(sorted, 0.5).toFixed(3)} ms, p99 ${pct(sorted, 0.99).toFixed(3)} ms, client CPU ${(cpu[t]! / sorted.length).toFixed(3)} ms per pair`);
  }
  for (const c of Object.values(clients)) c.close();
}

main().catch((error: unknown) => {
  process.stderr.write(`pair bench: ${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
