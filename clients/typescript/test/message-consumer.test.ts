/** The consumer helper's outcomes against a live idemd (no broker: messages are built by hand). */
import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  DEFAULT_CONSUMER_LEASE_MS,
  fingerprintV1,
  IdemdClient,
  MissingKeyError,
  onceConsumer,
  Outcome,
  type ConsumedMessage,
  type DeadLetter,
  type OnceConsumerOptions,
  v1,
} from "../src";
import { startIdemd, type IdemdServer } from "./support/idemd";

const ALICE = "conformance-token-alice-3f9a";
const ENDPOINT = "kafka:unit";
/** conformance idemd.toml: an expired lease on this endpoint is taken over (attempt 2). */
const TAKEOVER_ENDPOINT = "POST /v1/takeover";

let offsets = 0;
function message(key: string | undefined, value = '{"n":1}'): ConsumedMessage {
  return {
    value: Buffer.from(value),
    headers: key === undefined ? {} : { "idempotency-key": Buffer.from(key) },
    topic: "orders.v1",
    partition: 3,
    offset: String(offsets++),
  };
}

describe("onceConsumer against a live idemd", () => {
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

  /** Holds `key` as another consumer would, with a lease that is never extended nor completed. */
  async function claimElsewhere(endpoint: string, key: string, value: string, leaseMs: number): Promise<string> {
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

  test("the first delivery executes, a redelivery is a duplicate and does not run", async () => {
    letters = [];
    let runs = 0;
    const process = onceConsumer(client, options())(() => void runs++);
    const key = randomUUID();
    const first = await process(message(key));
    const again = await process(message(key));
    assert.deepEqual([first.outcome, first.mayCommit, again.outcome, again.mayCommit, runs], ["executed", true, "duplicate", true, 1]);
    assert.deepEqual(letters, []);
  });

  test("a handler that throws is dead-lettered with the stored reason, and so is its redelivery", async () => {
    letters = [];
    let runs = 0;
    const process = onceConsumer(client, options())(() => {
      runs++;
      throw new Error("poison message 4");
    });
    const key = randomUUID();
    const first = await process(message(key));
    assert.deepEqual([first.outcome, first.mayCommit], [Outcome.DEAD_LETTERED, true]);
    assert.equal(first.deadLetter?.kind, "handler_failed");
    assert.equal(first.deadLetter?.reason, "Error: poison message 4");
    const again = await process(message(key));
    assert.equal(again.outcome, Outcome.DEAD_LETTERED);
    assert.equal(runs, 1, "the redelivery did not run the handler");
    assert.equal(letters.length, 2);
    assert.equal(letters[1]!.kind, "outcome_unknown");
    assert.match(letters[1]!.reason, /outcome unknown.*Error: poison message 4/);
  });

  test("a key reused with another value is dead-lettered as a fingerprint mismatch", async () => {
    letters = [];
    const process = onceConsumer(client, options())(() => undefined);
    const key = randomUUID();
    assert.equal((await process(message(key, '{"n":1}'))).outcome, Outcome.EXECUTED);
    const other = await process(message(key, '{"n":2}'));
    assert.deepEqual([other.outcome, other.deadLetter?.kind], [Outcome.DEAD_LETTERED, "fingerprint_mismatch"]);
  });

  test("a key whose holder's lease expired is dead-lettered as unknown, never run", async () => {
    letters = [];
    let runs = 0;
    const process = onceConsumer(client, options({ maxWaitMs: 3_000 }))(() => void runs++);
    const key = randomUUID();
    await claimElsewhere(ENDPOINT, key, '{"n":1}', 1_000);
    const result = await process(message(key));
    assert.deepEqual([result.outcome, result.deadLetter?.kind, runs], [Outcome.DEAD_LETTERED, "outcome_unknown", 0]);
    assert.match(result.deadLetter!.reason, /unknown/i);
  });

  test("a key whose earlier attempt was recorded FAILED is dead-lettered with that reason, never run", async () => {
    letters = [];
    let runs = 0;
    const process = onceConsumer(client, options())(() => void runs++);
    const key = randomUUID();
    const leaseToken = await claimElsewhere(ENDPOINT, key, '{"n":1}', 10_000);
    await client.fail({ endpoint: ENDPOINT, key, leaseToken, disposition: v1.Disposition.DISPOSITION_FAILED, reason: "card declined" });
    const result = await process(message(key));
    assert.deepEqual([result.outcome, result.deadLetter?.kind, runs], [Outcome.DEAD_LETTERED, "earlier_failed", 0]);
    assert.match(result.deadLetter!.reason, /failed: card declined/);
  });

  test("a takeover (attempt 2) is dead-lettered as unknown, never run", async () => {
    letters = [];
    let runs = 0;
    const process = onceConsumer(client, options({ endpoint: TAKEOVER_ENDPOINT }))(() => void runs++);
    const key = randomUUID();
    await claimElsewhere(TAKEOVER_ENDPOINT, key, '{"n":1}', 1_000);
    await sleep(1_300);
    const result = await process(message(key));
    assert.deepEqual([result.outcome, result.deadLetter?.kind, runs], [Outcome.DEAD_LETTERED, "outcome_unknown", 0]);
    assert.match(result.deadLetter!.reason, /attempt 2/);
  });

  test("a duplicate waits for a holder that finishes within maxWait, one slower than its lease included", async () => {
    letters = [];
    let runs = 0;
    const handler = async (): Promise<void> => {
      runs++;
      await sleep(2_500);
    };
    const process = onceConsumer(client, options({ leaseMs: 1_000, maxWaitMs: 5_000 }))(handler);
    const key = randomUUID();
    const holder = process(message(key));
    await sleep(200);
    const duplicate = await process(message(key));
    assert.deepEqual([(await holder).outcome, duplicate.outcome, runs], [Outcome.EXECUTED, Outcome.DUPLICATE, 1]);
    assert.deepEqual(letters, []);
  });

  test("the lease asked for is DEFAULT_CONSUMER_LEASE_MS, not the policy's, alone and in a batch", async () => {
    // The conformance idemd.toml's default lease is 10 s: a consumer killed inside its handler
    // would hold the redelivered message that long; the consumer default is 5 s (issue 52).
    letters = [];
    const left: number[] = [];
    const process = onceConsumer(client, options())(async (message) => {
      const key = String(message.headers!["idempotency-key"]);
      const looked = await client.lookup({ endpoint: ENDPOINT, key });
      left.push(looked.record!.leaseExpiresAt!.getTime() - Date.now());
    });
    assert.equal((await process(message(randomUUID()))).outcome, Outcome.EXECUTED);
    const outs = await process.processBatch([message(randomUUID()), message(randomUUID())]);
    assert.deepEqual(outs.map((o) => o.outcome), [Outcome.EXECUTED, Outcome.EXECUTED]);
    assert.equal(left.length, 3, String(left));
    for (const ms of left) {
      // Just claimed: about the whole lease left (the clock is the same one).
      assert.ok(ms > DEFAULT_CONSUMER_LEASE_MS - 2_000 && ms <= DEFAULT_CONSUMER_LEASE_MS + 200, `leases left: ${left}`);
    }
  });

  test("a duplicate whose holder does not finish within maxWait is to be retried, not committed", async () => {
    letters = [];
    const process = onceConsumer(client, options({ maxWaitMs: 300 }))(() => sleep(1_500));
    const key = randomUUID();
    const holder = process(message(key));
    await sleep(100);
    const duplicate = await process(message(key));
    assert.deepEqual([duplicate.outcome, duplicate.mayCommit], [Outcome.RETRY, false]);
    assert.equal((await holder).outcome, Outcome.EXECUTED);
    assert.equal((await process(message(key))).outcome, Outcome.DUPLICATE);
  });

  test("an unreachable idemd is to be retried", async () => {
    const down = new IdemdClient({ address: "127.0.0.1:1", tls: false, deadlineMs: 1_000 });
    try {
      let runs = 0;
      const result = await onceConsumer(down, options({ transportRetries: 0 }))(() => void runs++)(message(randomUUID()));
      assert.deepEqual([result.outcome, result.mayCommit, runs], [Outcome.RETRY, false, 0]);
    } finally {
      down.close();
    }
  });

  test("a dead-letter hook that throws makes the delivery a retry; the next one reaches the hook again", async () => {
    let calls = 0;
    const process = onceConsumer(client, options({
      deadLetter: () => {
        if (++calls === 1) throw new Error("dead-letter topic unreachable");
      },
    }))(() => {
      throw new Error("boom");
    });
    const key = randomUUID();
    const first = await process(message(key));
    assert.deepEqual([first.outcome, first.mayCommit], [Outcome.RETRY, false]);
    assert.equal((await process(message(key))).outcome, Outcome.DEAD_LETTERED);
    assert.equal(calls, 2);
  });

  test("a message without its key header is refused with MissingKeyError before any call", async () => {
    let runs = 0;
    const process = onceConsumer(client, options())(() => void runs++);
    await assert.rejects(process(message(undefined)), (err: unknown) => {
      assert.ok(err instanceof MissingKeyError);
      assert.match(err.message, /"idempotency-key" header/);
      return true;
    });
    assert.equal(runs, 0);
  });

  test("the topic-partition-offset fallback keys a redelivery of the same record, not a second send", async () => {
    letters = [];
    let runs = 0;
    const process = onceConsumer(client, options({ key: "topic-partition-offset" }))(() => void runs++);
    const record = { ...message(undefined), topic: `eu.pay_ments.${randomUUID()}` };
    const escaped = record.topic.replace(/_/g, "__").replace(/\./g, "_d");
    assert.equal((await process(record)).key, `${escaped}-3-${record.offset}`);
    assert.ok(escaped.startsWith("eu_dpay__ments_d"), escaped);
    assert.equal((await process(record)).outcome, Outcome.DUPLICATE);
    assert.equal((await process({ ...record, offset: "999999" })).outcome, Outcome.EXECUTED);
    assert.equal(runs, 2);
  });
});
