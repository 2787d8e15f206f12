/**
 * Replay latency through the executor (clients/conformance/README.md, "Replay latency check"):
 * guards against transport regressions such as issue 12, where a missing TCP_NODELAY on the
 * server's accepted sockets made every reply that left in two TCP segments wait ~44 ms for the
 * client's delayed ACK. Not in dist/test/*.test.js: `npm run test:latency` (test.sh) runs it on
 * its own, after the rest of the suite, so that no other test competes with it for the CPU.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import { performance } from "node:perf_hooks";
import { IdemdClient, type HandlerResponse } from "../../src";
import { startIdemd, type IdemdServer } from "../support/idemd";
import { ENDPOINT, PAYMENT } from "../support/payment";

const ALICE = "conformance-token-alice-3f9a";
/** 1 KiB, every byte value four times, so that every byte is compared. */
const BODY = Buffer.from(Array.from({ length: 1024 }, (_, i) => i % 256));
const WARMUPS = 5;
const SAMPLES = 100;
const P50_LIMIT_MS = 10;

/** The nearest-rank percentile p (0 < p <= 100) of samples. */
function percentile(samples: readonly number[], p: number): number {
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length); // 1-based
  return sorted[Math.max(rank, 1) - 1]!;
}

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

test("nearest-rank percentiles", () => {
  const samples = Array.from({ length: 100 }, (_, i) => 100 - i); // 100 .. 1, unsorted
  assert.deepEqual([percentile(samples, 50), percentile(samples, 99)], [50, 99]);
  assert.equal(percentile([7], 99), 7);
});

test(`replay p50 of a 1 KiB body is at most ${P50_LIMIT_MS} ms`, async () => {
  const key = randomUUID();
  let calls = 0;
  const handler = (): HandlerResponse => {
    calls++;
    return { status: 201, headers: [["Content-Type", "application/octet-stream"]], body: BODY };
  };
  const execute = async (wantReplayed: boolean): Promise<number> => {
    const start = performance.now();
    const { response, replayed } = await client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler });
    const elapsed = performance.now() - start;
    assert.deepEqual(
      [response.status, response.headers, replayed],
      [201, [["Content-Type", "application/octet-stream"]], wantReplayed],
    );
    assert.ok(response.body.equals(BODY), `the body is not the 1,024 bytes (${response.body.length} bytes)`);
    return elapsed;
  };

  await execute(false);
  for (let i = 0; i < WARMUPS; i++) await execute(true);
  const samples: number[] = [];
  for (let i = 0; i < SAMPLES; i++) samples.push(await execute(true));
  assert.equal(calls, 1, "the handler ran once");

  const p50 = percentile(samples, 50);
  const p99 = percentile(samples, 99);
  const line = `latency: ${SAMPLES} replays of a 1 KiB body: p50 ${p50.toFixed(2)} ms, p99 ${p99.toFixed(2)} ms`;
  // In every run's output, passing or not: node --test passes a test file's stdout through
  // (as a "# " comment line with its TAP reporter).
  console.log(line);
  assert.ok(
    p50 <= P50_LIMIT_MS,
    `replay p50 ${p50.toFixed(2)} ms is over ${P50_LIMIT_MS} ms (p99 ${p99.toFixed(2)} ms): ` +
      "is TCP_NODELAY set on the server's accepted sockets?",
  );
});
