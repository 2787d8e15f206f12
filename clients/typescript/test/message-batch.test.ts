/**
 * processBatch (the consumer helper for a whole poll) against a live idemd: outcomes as
 * processing each message alone, the orderings, the crash bound's mechanism (only the messages
 * in hand are claimed), lease extension, and the fallback against a server without ClaimBatch
 * (the previous release, IDEMD_PREVIOUS_BIN; test.sh sets it).
 */
import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  fingerprintV1,
  IdemdClient,
  MissingKeyError,
  NoSideEffectError,
  onceConsumer,
  Ordering,
  Outcome,
  RpcError,
  v1,
  type ConsumedMessage,
  type DeadLetter,
  type OnceConsumerOptions,
  type Processed,
} from "../src";
import { startIdemd, type IdemdServer } from "./support/idemd";

const ALICE = "conformance-token-alice-3f9a";
const ENDPOINT = "kafka:batch";
/** conformance idemd.toml: an expired lease on this endpoint is taken over (attempt 2). */
const TAKEOVER_ENDPOINT = "POST /v1/takeover";

/** n messages over partitions 0..parts-1 (offset = index), keys prefix-0.., value {"n":i}. */
function poll(prefix: string, n: number, parts: number): ConsumedMessage[] {
  return Array.from({ length: n }, (_, i) => ({
    value: Buffer.from(`{"n":${i}}`),
    headers: { "idempotency-key": Buffer.from(`${prefix}-${i}`) },
    topic: "payments",
    partition: i % parts,
    offset: String(i),
  }));
}

const valueOf = (message: ConsumedMessage): string => Buffer.from(message.value ?? "").toString("utf8");

function counts(outs: Processed[]): Record<string, number> {
  const n: Record<string, number> = {};
  for (const out of outs) n[out.outcome] = (n[out.outcome] ?? 0) + 1;
  return n;
}

/** Holds `key` as another consumer would, with a lease that is never extended nor completed. */
async function claimElsewhere(client: IdemdClient, endpoint: string, key: string, value: string, leaseMs: number): Promise<string> {
  const claimed = await client.claim({
    endpoint,
    key,
    attemptId: randomBytes(16).toString("base64url"),
    lease: { seconds: Math.floor(leaseMs / 1000), nanos: (leaseMs % 1000) * 1e6 },
    sha256: fingerprintV1({ method: "CONSUME", path: endpoint, body: value }),
  });
  assert.ok(claimed.claimed, "the key was free");
  return claimed.claimed.leaseToken;
}

async function lookupState(client: IdemdClient, key: string): Promise<string> {
  try {
    const found = await client.lookup({ endpoint: ENDPOINT, key });
    return v1.stateToJSON(found.record!.state).replace(/^STATE_/, "");
  } catch (err) {
    if (err instanceof RpcError) return err.codeName;
    throw err;
  }
}

describe("processBatch against a live idemd", () => {
  let server: IdemdServer;
  let client: IdemdClient;
  let letters: DeadLetter[];
  const options = (extra: Partial<OnceConsumerOptions> = {}): OnceConsumerOptions => ({
    endpoint: ENDPOINT,
    key: { header: "idempotency-key" },
    deadLetter: (letter) => void letters.push(letter),
    ...extra,
  });

  before(async () => {
    server = await startIdemd();
    client = new IdemdClient({ address: server.address, token: ALICE, tls: false });
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });

  test("700 messages, 3 repeated keys, 2 poison: each key runs once; redelivered, nothing runs", async () => {
    letters = [];
    const messages = poll(randomUUID(), 700, 4);
    for (const i of [10, 20, 30]) messages.push(messages[i]!); // repeats, as a producer retry makes them
    const poison = new Set(['{"n":5}', '{"n":600}']);
    const runs = new Map<string, number>();
    const handler = (message: ConsumedMessage, fail: boolean): void => {
      const value = valueOf(message);
      runs.set(value, (runs.get(value) ?? 0) + 1);
      if (fail && poison.has(value)) throw new Error(`poison ${value}`);
    };
    const process = onceConsumer(client, options())((message) => handler(message, true));
    const outs = await process.processBatch(messages, { parallelism: 1000 });
    assert.equal(outs.length, messages.length);
    outs.forEach((out, i) => {
      const want = i >= 700 ? Outcome.DUPLICATE : poison.has(valueOf(messages[i]!)) ? Outcome.DEAD_LETTERED : Outcome.EXECUTED;
      assert.equal(out.outcome, want, `message ${i}`);
      assert.equal(out.mayCommit, true, `message ${i}`);
      assert.equal(out.key, messages[i]!.headers!["idempotency-key"]!.toString(), `message ${i}`);
    });
    assert.equal(runs.size, 700);
    for (const [value, n] of runs) assert.equal(n, 1, `${value} ran ${n} times`);
    assert.equal(letters.length, 2);
    assert.deepEqual(letters.map((l) => [l.kind, l.reason]).sort(), [
      ["handler_failed", 'Error: poison {"n":5}'],
      ["handler_failed", 'Error: poison {"n":600}'],
    ]);

    const again = await onceConsumer(client, options())((message) => handler(message, false)).processBatch(messages);
    assert.deepEqual(counts(again), { [Outcome.DUPLICATE]: 701, [Outcome.DEAD_LETTERED]: 2 });
    assert.equal(runs.size, 700);
    for (const [value, n] of runs) assert.equal(n, 1, `${value} ran again on redelivery`);
    for (const letter of letters.slice(2)) {
      assert.equal(letter.kind, "outcome_unknown");
      assert.match(letter.reason, /poison/);
    }
  });

  test("per_partition keeps offset order, one handler per partition; a held key retries the rest of its partition", async () => {
    letters = [];
    const prefix = randomUUID();
    const messages = poll(prefix, 60, 3);
    await claimElsewhere(client, ENDPOINT, `${prefix}-30`, '{"n":30}', 30_000); // partition 0
    const last = new Map<number, number>();
    let running = 0;
    let most = 0;
    const process = onceConsumer(client, options({ maxWaitMs: 200 }))(async (message) => {
      running++;
      most = Math.max(most, running);
      try {
        const offset = Number(message.offset);
        const prev = last.get(message.partition);
        last.set(message.partition, offset);
        if (prev !== undefined && offset <= prev) throw new Error(`partition ${message.partition}: offset ${offset} after ${prev}`);
        await sleep(2);
      } finally {
        running--;
      }
    });
    const outs = await process.processBatch(messages, { ordering: Ordering.PER_PARTITION });
    outs.forEach((out, i) => {
      const want = i % 3 === 0 && i >= 30 ? Outcome.RETRY : Outcome.EXECUTED;
      assert.equal(out.outcome, want, `message ${i} (partition ${i % 3})`);
      assert.equal(out.mayCommit, want !== Outcome.RETRY);
    });
    assert.ok(most <= 3, `${most} handlers ran at once over 3 partitions`);
    assert.equal(last.get(0), 27, "partition 0 went past its held message");
    assert.deepEqual(letters, []);
  });

  test("only the messages in hand are claimed: while the first 4 handlers block, later keys are not found", async () => {
    letters = [];
    const prefix = randomUUID();
    const messages = poll(prefix, 20, 1);
    let started = 0;
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const process = onceConsumer(client, options())(async () => {
      if (++started <= 4) await released;
    });
    const done = process.processBatch(messages, { parallelism: 4 });
    for (let waited = 0; started < 4 && waited < 10_000; waited += 5) await sleep(5);
    assert.equal(started, 4, "the first window of 4 started");
    await sleep(100); // anything claimed early would show now
    assert.equal(started, 4);
    for (let i = 0; i < 20; i++) {
      assert.equal(await lookupState(client, `${prefix}-${i}`), i < 4 ? "IN_PROGRESS" : "NOT_FOUND", `message ${i}`);
    }
    release();
    assert.deepEqual(counts(await done), { [Outcome.EXECUTED]: 20 });
  });

  test("handlers slower than their lease keep it (heartbeats) and all execute", async () => {
    letters = [];
    const process = onceConsumer(client, options({ leaseMs: 1_000 }))(async (_message, context) => {
      await sleep(2_500, undefined, { signal: context.signal });
    });
    const outs = await process.processBatch(poll(randomUUID(), 8, 2));
    assert.deepEqual(counts(outs), { [Outcome.EXECUTED]: 8 });
  });

  test("a success waiting for its CompleteBatch beside a slower handler keeps its lease", async () => {
    letters = [];
    // parallelism 16: successes are recorded 2 at a time while a handler still runs, so the fast
    // message's success waits for the slow one, 2.5 leases long.
    const process = onceConsumer(client, options({ leaseMs: 1_000 }))(async (message) => {
      if (valueOf(message) === '{"n":1}') await sleep(2_500);
    });
    const messages = poll(randomUUID(), 2, 2);
    const done = process.processBatch(messages, { parallelism: 16 });
    // Past the fast message's first lease: another consumer finds its key still held, not expired.
    await sleep(1_800);
    const elsewhere = await onceConsumer(client, options({ maxWaitMs: 0 }))(() => undefined)(messages[0]!);
    assert.equal(elsewhere.outcome, Outcome.RETRY, `elsewhere: ${String(elsewhere.error)}`);
    assert.deepEqual((await done).map((o) => o.outcome), [Outcome.EXECUTED, Outcome.EXECUTED]);
    assert.deepEqual(letters, []);
  });

  test("each claim answer is decided as processing the message alone decides it", async () => {
    letters = [];
    const prefix = randomUUID();
    const messages = poll(prefix, 6, 2);
    // 0: used before with another value; 1: recorded FAILED; 2: no-side-effect error (released);
    // 3: held by another consumer that completes within maxWait; 4, 5: fresh.
    await onceConsumer(client, options())(() => undefined)({ ...messages[0]!, value: Buffer.from("other") });
    const failed = await claimElsewhere(client, ENDPOINT, `${prefix}-1`, '{"n":1}', 10_000);
    await client.fail({ endpoint: ENDPOINT, key: `${prefix}-1`, leaseToken: failed, disposition: v1.Disposition.DISPOSITION_FAILED, reason: "card declined" });
    const held = await claimElsewhere(client, ENDPOINT, `${prefix}-3`, '{"n":3}', 10_000);
    setTimeout(() => void client.complete({ endpoint: ENDPOINT, key: `${prefix}-3`, leaseToken: held, response: { status: 200 } }), 300);
    const ran: string[] = [];
    const process = onceConsumer(client, options())((message) => {
      ran.push(valueOf(message));
      if (valueOf(message) === '{"n":2}') throw new NoSideEffectError("declined before charging");
    });
    const outs = await process.processBatch(messages);
    assert.deepEqual(outs.map((o) => [o.outcome, o.deadLetter?.kind]), [
      [Outcome.DEAD_LETTERED, "fingerprint_mismatch"],
      [Outcome.DEAD_LETTERED, "earlier_failed"],
      [Outcome.DEAD_LETTERED, "handler_failed"],
      [Outcome.DUPLICATE, undefined],
      [Outcome.EXECUTED, undefined],
      [Outcome.EXECUTED, undefined],
    ]);
    assert.deepEqual(ran.sort(), ['{"n":2}', '{"n":4}', '{"n":5}']);
    assert.match(outs[1]!.deadLetter!.reason, /failed: card declined/);
    // Released (no side effect): the next delivery runs it again.
    const again = await onceConsumer(client, options())(() => undefined)(messages[2]!);
    assert.equal(again.outcome, Outcome.EXECUTED);
  });

  test("a takeover (attempt 2) is dead-lettered as unknown, never run", async () => {
    letters = [];
    const prefix = randomUUID();
    const messages = poll(prefix, 3, 1);
    await claimElsewhere(client, TAKEOVER_ENDPOINT, `${prefix}-1`, '{"n":1}', 1_000);
    await sleep(1_200);
    let runs = 0;
    const process = onceConsumer(client, options({ endpoint: TAKEOVER_ENDPOINT }))(() => void runs++);
    const outs = await process.processBatch(messages);
    assert.deepEqual(outs.map((o) => [o.outcome, o.deadLetter?.kind]), [
      [Outcome.EXECUTED, undefined],
      [Outcome.DEAD_LETTERED, "outcome_unknown"],
      [Outcome.EXECUTED, undefined],
    ]);
    assert.equal(runs, 2);
  });

  test("a dead-letter hook that throws makes that message a retry", async () => {
    const process = onceConsumer(client, options({ deadLetter: () => { throw new Error("queue down"); } }))((message) => {
      if (valueOf(message) === '{"n":1}') throw new Error("poison");
    });
    const outs = await process.processBatch(poll(randomUUID(), 3, 1));
    assert.deepEqual(outs.map((o) => [o.outcome, o.mayCommit]), [
      [Outcome.EXECUTED, true],
      [Outcome.RETRY, false],
      [Outcome.EXECUTED, true],
    ]);
    assert.match(String(outs[1]!.error), /queue down/);
  });

  test("a message without its key header rejects the batch before anything is claimed", async () => {
    const prefix = randomUUID();
    const messages = poll(prefix, 3, 1);
    messages[2] = { ...messages[2]!, headers: {} };
    let runs = 0;
    const process = onceConsumer(client, options())(() => void runs++);
    await assert.rejects(process.processBatch(messages), MissingKeyError);
    assert.equal(runs, 0);
    assert.equal(await lookupState(client, `${prefix}-0`), "NOT_FOUND");
  });

  test("an unreachable idemd makes every message a retry", async () => {
    const down = new IdemdClient({ address: "127.0.0.1:1", token: ALICE, tls: false, deadlineMs: 500 });
    try {
      let runs = 0;
      const process = onceConsumer(down, options({ transportRetries: 1 }))(() => void runs++);
      const outs = await process.processBatch(poll(randomUUID(), 5, 2), { ordering: Ordering.PER_PARTITION });
      assert.deepEqual(counts(outs), { [Outcome.RETRY]: 5 });
      assert.equal(runs, 0);
    } finally {
      down.close();
    }
  });

  test("an empty poll is an empty answer", async () => {
    assert.deepEqual(await onceConsumer(client, options())(() => undefined).processBatch([]), []);
  });
});

describe("processBatch against a server without ClaimBatch", () => {
  const previous = process.env.IDEMD_PREVIOUS_BIN;
  test("every message is processed alone, with the same outcomes", { skip: previous ? false : "IDEMD_PREVIOUS_BIN is unset (test.sh sets it)" }, async () => {
    const server = await startIdemd({ bin: previous! });
    const client = new IdemdClient({ address: server.address, token: ALICE, tls: false });
    try {
      const letters: DeadLetter[] = [];
      const messages = poll(randomUUID(), 30, 3);
      messages.push(messages[4]!);
      const runs = new Map<string, number>();
      const processor = onceConsumer(client, { endpoint: ENDPOINT, key: { header: "idempotency-key" }, deadLetter: (l) => void letters.push(l) })(
        (message) => {
          const value = valueOf(message);
          runs.set(value, (runs.get(value) ?? 0) + 1);
          if (value === '{"n":7}') throw new Error("poison");
        },
      );
      const outs = await processor.processBatch(messages);
      outs.forEach((out, i) => {
        const want = i === 30 ? Outcome.DUPLICATE : i === 7 ? Outcome.DEAD_LETTERED : Outcome.EXECUTED;
        assert.equal(out.outcome, want, `message ${i}`);
      });
      assert.equal(runs.size, 30);
      for (const [value, n] of runs) assert.equal(n, 1, `${value} ran ${n} times`);
      assert.equal(letters.length, 1);
    } finally {
      client.close();
      await server.stop();
    }
  });
});
