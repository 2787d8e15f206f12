/**
 * The proxy matrix (clients/conformance/proxy-matrix.md, issue 51): the SDK's transports calling
 * idemd through a real nginx (scripts/nginx.sh) with each profile's limits — h2c, TLS, a GOAWAY
 * every 10 requests, 4 streams per connection, a 1 s idle timeout — in executor runs (sequential,
 * 32 in flight, replays), raw Claim + Complete runs, and 300 executor calls in flight through
 * nginx's defaults; every key then looked up by a direct client (no nginx). Prints one
 * `proxy-matrix:` line per run. Last, the check itself: the default transport with its fix turned
 * off (no waiting for SETTINGS, calls the server never took surfaced as errors) must fail it.
 *
 * IDEMD_MATRIX_TRANSPORTS / IDEMD_MATRIX_PROFILES (comma-separated) narrow a run by hand.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { GrpcStatus, IdemdClient, RpcError, v1, type IdemdClientOptions } from "../src";
import * as clientModule from "../src/client";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { repoRoot } from "./support/paths";

const SDK = "typescript";
const ENDPOINT = "POST /v1/proxy-matrix";
const TOKEN = "conformance-token-alice-3f9a";
const LEASE_MS = 10_000;
const RUN_LIMIT_MS = 120_000;
/** scripts/nginx.sh (IDEMD_NGINX_SH: another copy, for a run by hand). */
const NGINX = process.env.IDEMD_NGINX_SH || path.join(repoRoot, "scripts", "nginx.sh");
const PROFILES = (process.env.IDEMD_MATRIX_PROFILES ?? "h2c,tls,goaway,streams4,idle1s").split(",");
/** The default transport first (node:http2), then every other the SDK offers. */
const TRANSPORTS = (process.env.IDEMD_MATRIX_TRANSPORTS ?? "node-http2,grpc-js").split(",");
const TLS_PROFILES = new Set(["tls", "goaway"]);
/** The options key that turns the default transport's fix off (a test hook, see src/client.ts). */
const TRANSPORT_FIX = (clientModule as Record<string, unknown>).TRANSPORT_FIX as symbol | undefined;

/**
 * Connections opened per transport, counted at node:http2's connect (both transports call it once
 * per connection; grpc-js's options carry maxSendHeaderBlockLength): nginx 1.22 logs no GOAWAY
 * at `info`, so a run shows that it met its GOAWAYs by the connections it needed.
 */
const connections = new Map<string, number>();
const nodeHttp2 = createRequire(__filename)("node:http2") as { connect: (...args: unknown[]) => unknown };
const connect = nodeHttp2.connect;
nodeHttp2.connect = (...args: unknown[]) => {
  const options = args[1] as Record<string, unknown> | undefined;
  const transport = options && "maxSendHeaderBlockLength" in options ? "grpc-js" : "node-http2";
  connections.set(transport, (connections.get(transport) ?? 0) + 1);
  return connect(...args);
};

interface RunResult {
  calls: number;
  errors: number;
  violations: number;
  /** Errors on requests idemd did receive (allowed in raw runs: the outcome is unknown). */
  received: number;
  seconds: number;
  notes: string[];
}

function certsDir(): string {
  const dir = process.env.IDEMD_TEST_CERTS;
  if (!dir || !existsSync(path.join(dir, "ca.pem"))) {
    throw new Error("IDEMD_TEST_CERTS (with ca.pem, server.crt, server.key) is required: `make test-certs`");
  }
  return dir;
}

class Nginx {
  readonly dir = mkdtempSync(path.join(tmpdir(), "idemd-ts-nginx-"));
  address = "";
  constructor(readonly profile: string) {}
  start(upstream: string): void {
    const args = ["start", "--dir", this.dir, "--upstream", upstream, "--profile", this.profile];
    if (TLS_PROFILES.has(this.profile)) args.push("--certs", certsDir());
    this.address = execFileSync("bash", [NGINX, ...args], { encoding: "utf8" }).trim();
  }
  count(what: string): number {
    return Number(execFileSync("bash", [NGINX, "count", "--dir", this.dir, what], { encoding: "utf8" }).trim() || "0");
  }
  stats(transport: string): { refusals: number; connections: number } {
    return { refusals: this.count("concurrent streams exceeded"), connections: connections.get(transport.replace(/\(.*/, "")) ?? 0 };
  }
  stop(): void {
    execFileSync("bash", [NGINX, "stop", "--dir", this.dir]);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** `items` through `fn`, `limit` at a time; resolves to how many never finished within `limitMs`. */
async function pool<T>(items: T[], limit: number, limitMs: number, fn: (item: T) => Promise<void>): Promise<number> {
  let next = 0;
  let finished = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const item = items[next++]!;
      await fn(item);
      finished += 1;
    }
  };
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, limitMs);
  });
  await Promise.race([Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker)), timeout]);
  clearTimeout(timer);
  return items.length - finished;
}

function requestOf(key: string) {
  return { method: "POST", path: "/v1/proxy-matrix", body: `{"key":"${key}"}`, contentType: "application/json" };
}

function describeError(err: unknown): string {
  return err instanceof RpcError ? `${err.codeName}: ${err.details}` : String(err);
}

/** The key's record by a direct Lookup: its state name and stored body, or NOT_FOUND. */
async function lookup(direct: IdemdClient, key: string): Promise<{ state: string; body: string }> {
  for (let attempt = 0; ; attempt++) {
    try {
      const { record } = await direct.lookup({ endpoint: ENDPOINT, key, includeResponse: true });
      return {
        state: v1.stateToJSON(record?.state ?? v1.State.STATE_UNSPECIFIED).replace(/^STATE_/, ""),
        body: Buffer.from(record?.response?.body ?? []).toString(),
      };
    } catch (err) {
      if (err instanceof RpcError && err.code === GrpcStatus.NOT_FOUND) return { state: "NOT_FOUND", body: "" };
      if (attempt >= 3) throw err;
    }
  }
}

/** Executor calls on fresh keys, `inFlight` at a time; the handler answers with the key. */
async function executorRun(
  client: IdemdClient,
  direct: IdemdClient,
  keys: string[],
  inFlight: number,
  handled: Map<string, number>,
): Promise<RunResult> {
  const started = Date.now();
  const notes: string[] = [];
  let errors = 0;
  let violations = 0;
  const hangs = await pool(keys, inFlight, RUN_LIMIT_MS, async (key) => {
    try {
      const result = await client.executeOnce({
        endpoint: ENDPOINT,
        key,
        request: requestOf(key),
        leaseMs: LEASE_MS,
        handler: () => {
          handled.set(key, (handled.get(key) ?? 0) + 1);
          return { status: 201, body: key };
        },
      });
      if (result.replayed || result.response.body.toString() !== key) {
        violations += 1;
        notes.push(`${key}: answered replayed=${result.replayed} body ${result.response.body.toString()}`);
      }
    } catch (err) {
      errors += 1;
      notes.push(`${key}: ${describeError(err)}`);
    }
  });
  const seconds = (Date.now() - started) / 1000;
  await pool(keys, 32, RUN_LIMIT_MS, async (key) => {
    const calls = handled.get(key) ?? 0;
    const record = await lookup(direct, key);
    if (calls !== 1 || record.state !== "COMPLETED" || record.body !== key) {
      violations += 1;
      notes.push(`${key}: handler ran ${calls} times, ${record.state} with body ${JSON.stringify(record.body)}`);
    }
  });
  if (hangs > 0) notes.push(`${hangs} calls hung past ${RUN_LIMIT_MS / 1000} s`);
  return { calls: keys.length, errors: errors + hangs, violations, received: 0, seconds, notes };
}

/** The first keys of a completed run again: each must replay, the handler not called. */
async function replayRun(client: IdemdClient, keys: string[], handled: Map<string, number>): Promise<RunResult> {
  const started = Date.now();
  const notes: string[] = [];
  let errors = 0;
  let violations = 0;
  const hangs = await pool(keys, 1, RUN_LIMIT_MS, async (key) => {
    try {
      const result = await client.executeOnce({
        endpoint: ENDPOINT,
        key,
        request: requestOf(key),
        leaseMs: LEASE_MS,
        handler: () => {
          handled.set(key, (handled.get(key) ?? 0) + 1);
          return { status: 201, body: "again" };
        },
      });
      if (!result.replayed || result.response.body.toString() !== key || handled.get(key) !== 1) {
        violations += 1;
        notes.push(`${key}: replayed=${result.replayed}, body ${result.response.body.toString()}, handler ran ${handled.get(key)} times`);
      }
    } catch (err) {
      errors += 1;
      notes.push(`${key}: ${describeError(err)}`);
    }
  });
  return { calls: keys.length, errors: errors + hangs, violations, received: 0, seconds: (Date.now() - started) / 1000, notes };
}

/**
 * Raw Claim then Complete, 32 in flight, no retries: every surfaced error is checked against
 * the key's record. An error for a request idemd never got is a violation; one for a request it
 * did get must be UNAVAILABLE or DEADLINE_EXCEEDED (outcome unknown).
 */
async function rawRun(client: IdemdClient, direct: IdemdClient, keys: string[]): Promise<RunResult> {
  const started = Date.now();
  const failures: Array<{ key: string; phase: "claim" | "complete"; error: unknown }> = [];
  const completed: string[] = [];
  const notes: string[] = [];
  let violations = 0;
  const hangs = await pool(keys, 32, RUN_LIMIT_MS, async (key) => {
    let leaseToken: string;
    try {
      const claim = await client.claim({
        endpoint: ENDPOINT,
        key,
        attemptId: randomBytes(8).toString("hex"),
        lease: { seconds: LEASE_MS / 1000, nanos: 0 },
        request: { ...requestOf(key), body: Buffer.from(requestOf(key).body) },
      });
      if (!claim.claimed) {
        violations += 1;
        notes.push(`${key}: a fresh key's Claim was not claimed`);
        return;
      }
      leaseToken = claim.claimed.leaseToken;
    } catch (error) {
      failures.push({ key, phase: "claim", error });
      return;
    }
    try {
      await client.complete({ endpoint: ENDPOINT, key, leaseToken, response: { status: 201, body: Buffer.from(key) } });
      completed.push(key);
    } catch (error) {
      failures.push({ key, phase: "complete", error });
    }
  });
  const seconds = (Date.now() - started) / 1000;
  let received = 0;
  await pool(failures, 32, RUN_LIMIT_MS, async ({ key, phase, error }) => {
    const { state } = await lookup(direct, key);
    const neverForwarded = phase === "claim" ? state === "NOT_FOUND" : state === "IN_PROGRESS";
    const unknown = error instanceof RpcError && (error.code === GrpcStatus.UNAVAILABLE || error.code === GrpcStatus.DEADLINE_EXCEEDED);
    if (neverForwarded || !unknown) {
      violations += 1;
      if (notes.length < 10) notes.push(`${key}: ${phase} failed (${describeError(error)}), key ${state}`);
    } else {
      received += 1;
    }
  });
  await pool(completed, 32, RUN_LIMIT_MS, async (key) => {
    const { state, body } = await lookup(direct, key);
    if (state !== "COMPLETED" || body !== key) {
      violations += 1;
      notes.push(`${key}: completed, yet ${state} with body ${JSON.stringify(body)}`);
    }
  });
  if (hangs > 0) notes.push(`${hangs} calls hung past ${RUN_LIMIT_MS / 1000} s`);
  return { calls: keys.length, errors: failures.length + hangs, violations: violations + hangs, received, seconds, notes };
}

function report(transport: string, profile: string, run: string, result: RunResult, nginx: Nginx, before: { refusals: number; connections: number }): void {
  const now = nginx.stats(transport);
  const extra = [
    `nginx: ${now.refusals - before.refusals} concurrent streams exceeded (all transports of the profile); client: ${now.connections - before.connections} connections opened`,
    ...(result.received > 0 ? [`${result.received} errors on requests idemd received`] : []),
  ].join("; ");
  console.log(
    `proxy-matrix: ${SDK} ${transport} ${profile} ${run}: ${result.calls} calls, ${result.errors} errors, ` +
      `${result.violations} violations, ${result.seconds.toFixed(1)} s (${extra})`,
  );
  for (const note of result.notes.slice(0, 10)) console.log(`  ${note}`);
}

function clientFor(nginx: Nginx, transport: string, extra: Record<string | symbol, unknown> = {}): IdemdClient {
  const port = nginx.address.split(":").pop();
  const tls = TLS_PROFILES.has(nginx.profile);
  const options = {
    // The certificate names localhost; nginx listens on 127.0.0.1.
    address: tls ? `localhost:${port}` : nginx.address,
    token: TOKEN,
    tls: tls ? { caFile: path.join(certsDir(), "ca.pem") } : false,
    transport,
    proxy: false,
    ...extra,
  };
  return new IdemdClient(options as unknown as IdemdClientOptions);
}

let idemd: IdemdServer;
let direct: IdemdClient;

before(async () => {
  idemd = await startIdemd();
  direct = new IdemdClient({ address: idemd.address, token: TOKEN, tls: false });
});
after(async () => {
  direct?.close();
  await idemd?.stop();
});

describe("proxy matrix", () => {
  for (const profile of PROFILES) {
    test(`through nginx, profile ${profile}: every transport, executor and raw runs`, async () => {
      const nginx = new Nginx(profile);
      nginx.start(idemd.address);
      const failed: string[] = [];
      try {
        // The transports side by side (their own clients and keys): the runs wait mostly on
        // idemd's durable writes, so this halves the wall time.
        await Promise.all(TRANSPORTS.map(async (transport) => {
          const client = clientFor(nginx, transport);
          const prefix = `${profile}-${transport}-${randomBytes(4).toString("hex")}`;
          const handled = new Map<string, number>();
          const keys = (run: string, n: number): string[] => Array.from({ length: n }, (_, i) => `${prefix}-${run}-${i}`);
          const check = (run: string, result: RunResult): void => {
            if (result.errors > 0 && run !== "raw") failed.push(`${transport} ${run}: ${result.errors} errors`);
            if (result.violations > 0) failed.push(`${transport} ${run}: ${result.violations} violations`);
          };
          try {
            const sequential = keys("seq", 300);
            const runs: Array<[string, () => Promise<RunResult>]> = [
              ["executor-sequential", () => executorRun(client, direct, sequential, 1, handled)],
              ["executor-concurrent", () => executorRun(client, direct, keys("conc", 600), 32, handled)],
              ["replays", () => replayRun(client, sequential.slice(0, 100), handled)],
              ["raw", () => rawRun(client, direct, keys("raw", 300))],
            ];
            if (profile === "h2c") runs.push(["executor-300-in-flight", () => executorRun(client, direct, keys("wide", 300), 300, handled)]);
            for (const [run, go] of runs) {
              const stats = nginx.stats(transport);
              const result = await go();
              report(transport, profile, run, result, nginx, stats);
              check(run, result);
            }
          } finally {
            client.close();
          }
        }));
      } finally {
        nginx.stop();
      }
      assert.deepEqual(failed, [], `the matrix failed on profile ${profile}`);
    });
  }

  test("the check itself: the default transport with its fix off fails the matrix (GOAWAY and stream limits)", { skip: TRANSPORT_FIX === undefined }, async () => {
    let violations = 0;
    for (const profile of ["goaway", "streams4"]) {
      const nginx = new Nginx(profile);
      nginx.start(idemd.address);
      const client = clientFor(nginx, "node-http2", { [TRANSPORT_FIX!]: false });
      try {
        const prefix = `fixoff-${profile}-${randomBytes(4).toString("hex")}`;
        const stats = nginx.stats("node-http2");
        const result = await rawRun(client, direct, Array.from({ length: 300 }, (_, i) => `${prefix}-${i}`));
        report("node-http2(fix-off)", profile, "raw", result, nginx, stats);
        violations += result.violations;
      } finally {
        client.close();
        nginx.stop();
      }
    }
    assert.ok(violations > 0, "the matrix found nothing wrong with a transport that surfaces refused calls");
  });
});
