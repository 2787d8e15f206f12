/**
 * A Kafka consumer (kafkajs) whose side effect runs once per message key: the consumer program of
 * clients/conformance/consumer-scenarios.md, and the full form of the README's consumer block.
 *
 * The loop's rules: auto-commit off; a message's offset is committed only after `onceConsumer`
 * said it may be (executed, duplicate, dead-lettered), one message at a time per partition, so in
 * order; on `retry` the partition is sought back to that message, which is delivered again before
 * any later one. SIGTERM finishes the message in hand, commits it, leaves the group and exits 0,
 * printing `{"executed":N,"duplicates":N,"dead_lettered":N,"retries":N}` on stdout.
 *
 *   node dist/examples/kafka-consumer.js --brokers 127.0.0.1:9092 --topic orders --group g \
 *     --idemd 127.0.0.1:50051 --token "$IDEMD_TOKEN" --ledger ledger.txt --dead-letters dlq.jsonl
 *
 * Flags (the scenario settings of consumer-scenarios.md): --brokers (comma-separated), --topic,
 * --group, --idemd, --token, --endpoint (default `kafka:<topic>`), --key-header (default
 * `idempotency-key`), --lease-ms, --max-wait-ms, --handler-ms, --ledger, --dead-letters,
 * --kill-in-handler-after N, --kill-after N, --no-helper, --mode, --parallelism.
 *
 * --mode: `sequential` (the default; the scenarios rely on it): one message in hand, through the
 * per-message processor. `pipelined` and `parallel`: each poll (the partition batches kafkajs
 * hands over together) goes to `processBatch` whole, with `per_partition` ordering (each partition
 * in offset order, partitions side by side) or `per_key` ordering (keys side by side), at most
 * --parallelism messages in flight (default the helper's, 256); the messages it says to retry are
 * processed again in place after a pause, and each partition is committed up to its first
 * message still undecided. A crash then leaves outcome-unknown only messages whose handler had
 * started, at most --parallelism of them.
 *
 * The message value is `{"n": N, "poison": bool, "amount": 100}`; the handler throws
 * `poison message N` for a poison one, else sleeps --handler-ms and appends `N\n` to the ledger.
 */
import { closeSync, openSync, writeSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { Kafka, logLevel, type KafkaMessage } from "kafkajs";
import { IdemdClient, onceConsumer, Ordering, Outcome, type BatchOptions, type ConsumedMessage, type Processed } from "../src";

const { values: flags } = parseArgs({
  options: {
    brokers: { type: "string" },
    topic: { type: "string" },
    group: { type: "string" },
    idemd: { type: "string", default: "127.0.0.1:50051" },
    token: { type: "string" },
    endpoint: { type: "string" },
    "key-header": { type: "string", default: "idempotency-key" },
    "lease-ms": { type: "string" },
    "max-wait-ms": { type: "string", default: "5000" },
    "handler-ms": { type: "string", default: "0" },
    ledger: { type: "string" },
    "dead-letters": { type: "string" },
    "kill-in-handler-after": { type: "string" },
    "kill-after": { type: "string" },
    "no-helper": { type: "boolean", default: false },
    mode: { type: "string", default: "sequential" },
    parallelism: { type: "string" },
  },
});
function required(name: "brokers" | "topic" | "group" | "ledger" | "dead-letters"): string {
  const value = flags[name];
  if (!value) throw new Error(`kafka-consumer: --${name} is required`);
  return value;
}
const optionalNumber = (text: string | undefined): number | undefined => (text === undefined ? undefined : Number(text));

const topic = required("topic");
const mode = flags.mode!;
if (mode !== "sequential" && mode !== "pipelined" && mode !== "parallel") {
  throw new Error("kafka-consumer: --mode is sequential, pipelined or parallel");
}
const batchOptions: BatchOptions = {
  ordering: mode === "pipelined" ? Ordering.PER_PARTITION : Ordering.PER_KEY,
  parallelism: optionalNumber(flags.parallelism),
};
const handlerMs = Number(flags["handler-ms"]);
const killInHandlerAfter = optionalNumber(flags["kill-in-handler-after"]);
const killAfter = optionalNumber(flags["kill-after"]);
// O_APPEND, and one write per line: a line is whole in the file even if the process is killed.
const ledger = openSync(required("ledger"), "a");
const deadLetters = openSync(required("dead-letters"), "a");

interface Order {
  n: number;
  poison: boolean;
  amount: number;
}
const orderOf = (message: ConsumedMessage): Order => JSON.parse(Buffer.from(message.value ?? "").toString("utf8")) as Order;

/** The side effect: once per message, or the scenario's bug to catch. */
async function handle(message: ConsumedMessage): Promise<void> {
  const order = orderOf(message);
  if (order.poison) throw new Error(`poison message ${order.n}`);
  await sleep(handlerMs);
  writeSync(ledger, `${order.n}\n`);
  if (order.n === killInHandlerAfter) process.kill(process.pid, "SIGKILL");
}

const idemd = new IdemdClient({ address: flags.idemd!, token: flags.token, tls: false });
const processOnce = onceConsumer(idemd, {
  endpoint: flags.endpoint ?? `kafka:${topic}`,
  key: { header: flags["key-header"]! },
  leaseMs: optionalNumber(flags["lease-ms"]),
  maxWaitMs: Number(flags["max-wait-ms"]),
  // Idempotent enough for the scenarios: the runner reads the set of message numbers.
  deadLetter: ({ message, reason }) => {
    writeSync(deadLetters, `${JSON.stringify({ message: orderOf(message).n, reason })}\n`);
  },
})(handle);

/** The negative control: what a consumer without idempotency does. */
async function withoutHelper(message: ConsumedMessage): Promise<Processed> {
  try {
    await handle(message);
    return { outcome: Outcome.EXECUTED, mayCommit: true, key: "" };
  } catch (err) {
    writeSync(deadLetters, `${JSON.stringify({ message: orderOf(message).n, reason: String(err) })}\n`);
    return { outcome: Outcome.DEAD_LETTERED, mayCommit: true, key: "" };
  }
}

const counts = { executed: 0, duplicates: 0, dead_lettered: 0, retries: 0 };
const kafka = new Kafka({
  clientId: "idemd-kafka-consumer",
  brokers: required("brokers").split(","),
  logLevel: logLevel.ERROR,
  // kafkajs logs on stdout by default; stdout carries this program's summary.
  logCreator: () => ({ namespace, log }) =>
    process.stderr.write(`kafkajs ${namespace}: ${log.message}${log.error ? `: ${String(log.error)}` : ""}\n`),
});
// A short session so that a killed consumer's partitions move in seconds; a handler longer than
// that keeps the membership with the heartbeats sent while it runs (below).
const consumer = kafka.consumer({ groupId: required("group"), sessionTimeout: 6_000, heartbeatInterval: 1_000 });

async function main(): Promise<void> {
  // A crash kafkajs does not restart from would leave this process idle and the scenario hung.
  consumer.on(consumer.events.CRASH, ({ payload }) => {
    if (!payload.restart) {
      process.stderr.write(`kafka-consumer: the consumer crashed: ${String(payload.error)}\n`);
      process.exit(1);
    }
  });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  if (mode !== "sequential" && !flags["no-helper"]) {
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      // Every partition of a fetch at once, so that one poll's batches meet in processBatch.
      partitionsConsumedConcurrently: 1_000,
      eachBatch: async ({ batch, resolveOffset, heartbeat }) => {
        const keepalive = setInterval(() => heartbeat().catch(() => undefined), 1_000);
        let decided: number;
        try {
          decided = await poll.add(batch.messages.map((m) => toConsumedMessage(batch.topic, batch.partition, m)));
        } finally {
          clearInterval(keepalive);
        }
        // Committed up to the first message not decided (on shutdown only: retries are done in
        // place); that one and the rest come again, here or at the partition's next owner.
        if (decided > 0) {
          const last = batch.messages[decided - 1]!;
          resolveOffset(last.offset);
          await commit(batch.topic, batch.partition, (BigInt(last.offset) + 1n).toString());
        }
        if (decided < batch.messages.length) {
          consumer.seek({ topic: batch.topic, partition: batch.partition, offset: batch.messages[decided]!.offset });
        }
      },
    });
    return;
  }
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ topic, partition, message, heartbeat }) => {
      const delivered = toConsumedMessage(topic, partition, message);
      const keepalive = setInterval(() => heartbeat().catch(() => undefined), 1_000);
      let result: Processed;
      try {
        result = await (flags["no-helper"] ? withoutHelper(delivered) : processOnce(delivered));
      } finally {
        clearInterval(keepalive);
      }
      count(result);
      if (!result.mayCommit) {
        // Not decided: this message comes again before any later one of its partition.
        consumer.seek({ topic, partition, offset: message.offset });
        await sleep(200); // so that an unreachable idemd is not asked again in a tight loop
        return;
      }
      if (result.outcome === Outcome.EXECUTED && orderOf(delivered).n === killAfter) process.kill(process.pid, "SIGKILL");
      const next = (BigInt(message.offset) + 1n).toString();
      if (!(await commit(topic, partition, next))) consumer.seek({ topic, partition, offset: message.offset });
    },
  });
}

/** Commits `offset` (the next message's); false if that failed. */
async function commit(topic: string, partition: number, offset: string): Promise<boolean> {
  try {
    await consumer.commitOffsets([{ topic, partition, offset }]);
    return true;
  } catch (err) {
    // A rebalance took the partition (the next owner gets the messages again and the helper
    // replays them), or the broker is away: deliver them again here.
    process.stderr.write(`kafka-consumer: commit of ${topic}/${partition}@${offset} failed: ${String(err)}\n`);
    return false;
  }
}

/**
 * The pipelined and parallel modes' poll: the partition batches kafkajs hands over together
 * (eachBatch, all partitions at once) are gathered for one turn of the event loop and processed
 * as one poll. `add` resolves to how many of its messages are decided (a prefix: all of them,
 * unless shutdown came while some were to be retried).
 */
const poll = {
  pending: [] as Array<{ messages: ConsumedMessage[]; done: (decided: number) => void; fail: (err: unknown) => void }>,
  add(messages: ConsumedMessage[]): Promise<number> {
    return new Promise<number>((done, fail) => {
      if (this.pending.length === 0) setImmediate(() => this.flush());
      this.pending.push({ messages, done, fail });
    });
  },
  flush(): void {
    const entries = this.pending;
    this.pending = [];
    processPoll(entries.flatMap((entry) => entry.messages)).then((decided) => {
      let at = 0;
      for (const entry of entries) {
        const mine = decided.slice(at, at + entry.messages.length);
        at += entry.messages.length;
        const first = mine.indexOf(false);
        entry.done(first < 0 ? mine.length : first);
      }
    }, (err: unknown) => entries.forEach((entry) => entry.fail(err)));
  },
};

/**
 * Hands the whole poll to processBatch, then the messages it says to retry again (after a
 * pause) until each is decided or shutdown comes; returns which messages are decided. With
 * --kill-after N: SIGKILL once message N is reported executed, before any commit.
 */
async function processPoll(messages: ConsumedMessage[]): Promise<boolean[]> {
  const decided = new Array<boolean>(messages.length).fill(false);
  let undecided = messages.map((_, i) => i);
  let pause = 100;
  while (undecided.length > 0) {
    const results = await processOnce.processBatch(undecided.map((i) => messages[i]!), batchOptions);
    const again: number[] = [];
    let reason: unknown;
    undecided.forEach((i, n) => {
      const result = results[n]!;
      count(result);
      if (!result.mayCommit) {
        reason ??= result.error;
        again.push(i);
        return;
      }
      decided[i] = true;
      if (result.outcome === Outcome.EXECUTED && orderOf(messages[i]!).n === killAfter) process.kill(process.pid, "SIGKILL");
    });
    undecided = again;
    if (undecided.length === 0 || stopping) break;
    process.stderr.write(`kafka-consumer: retrying ${undecided.length} messages: ${String(reason)}\n`);
    await sleep(pause);
    pause = Math.min(2 * pause, 2_000);
  }
  return decided;
}

function toConsumedMessage(topic: string, partition: number, message: KafkaMessage): ConsumedMessage {
  return { value: message.value, headers: message.headers, topic, partition, offset: message.offset };
}

function count(result: Processed): void {
  if (result.outcome === Outcome.EXECUTED) counts.executed++;
  else if (result.outcome === Outcome.DUPLICATE) counts.duplicates++;
  else if (result.outcome === Outcome.DEAD_LETTERED) counts.dead_lettered++;
  else counts.retries++;
}

let stopping = false;
async function shutdown(): Promise<void> {
  if (stopping) return;
  stopping = true;
  // disconnect() lets the message in hand finish (and commit), then leaves the group.
  await consumer.disconnect();
  idemd.close();
  closeSync(ledger);
  closeSync(deadLetters);
  process.stdout.write(`${JSON.stringify(counts)}\n`);
  process.exit(0);
}
process.on("SIGTERM", () => void shutdown());
process.on("SIGINT", () => void shutdown());

main().catch((err: unknown) => {
  process.stderr.write(`kafka-consumer: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
