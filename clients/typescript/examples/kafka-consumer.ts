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
 * --kill-in-handler-after N, --kill-after N, --no-helper.
 *
 * The message value is `{"n": N, "poison": bool, "amount": 100}`; the handler throws
 * `poison message N` for a poison one, else sleeps --handler-ms and appends `N\n` to the ledger.
 */
import { closeSync, openSync, writeSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { Kafka, logLevel, type KafkaMessage } from "kafkajs";
import { IdemdClient, onceConsumer, Outcome, type ConsumedMessage, type Processed } from "../src";

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
  },
});
function required(name: "brokers" | "topic" | "group" | "ledger" | "dead-letters"): string {
  const value = flags[name];
  if (!value) throw new Error(`kafka-consumer: --${name} is required`);
  return value;
}
const optionalNumber = (text: string | undefined): number | undefined => (text === undefined ? undefined : Number(text));

const topic = required("topic");
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
      try {
        await consumer.commitOffsets([{ topic, partition, offset: next }]);
      } catch (err) {
        // A rebalance took the partition (the next owner gets the message again and the helper
        // replays it), or the broker is away: deliver it again here.
        process.stderr.write(`kafka-consumer: commit of ${topic}/${partition}@${next} failed: ${String(err)}\n`);
        consumer.seek({ topic, partition, offset: message.offset });
      }
    },
  });
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
