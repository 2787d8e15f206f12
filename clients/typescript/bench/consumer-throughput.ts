/**
 * Messages per second of the consumer program (examples/kafka-consumer.ts) without the helper (its
 * no-helper mode) and with it in each of its --mode values: one consumer, a fresh 4-partition
 * topic of N messages (each its own key), kafkajs' default fetch. The clock runs from the first
 * side effect to the group's commits reaching the end of every partition, so the group join is not
 * counted. In no-helper and sequential mode each message's offset is committed on its own, in
 * pipelined and parallel mode each partition batch's once (as the program does).
 *
 *   IDEMD_TEST_KAFKA_BROKERS=HOST:PORT IDEMD_BIN=target/release/idemd \
 *     node dist/bench/consumer-throughput.js [--messages 10000] [--partitions 4]
 *
 * IDEMD_CONSUMER_BENCH_MODES: the helper's modes to measure (default "parallel pipelined
 * sequential"; no-helper always runs first); IDEMD_CONSUMER_BENCH_RUNS: rounds of all of them
 * (default 3); IDEMD_CONSUMER_BENCH_PARALLELISM: the program's --parallelism.
 * (bench/consumer.sh runs it under scripts/kafka.sh run.) Prints one line per run and mode:
 * `consumer throughput: run 1, parallel, 10000 messages, 4 partitions: X s, Y msg/s`.
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { Kafka, logLevel, Partitioners } from "kafkajs";
import { startIdemd } from "../test/support/idemd";
import { createTopic } from "../test/support/kafka-scenarios";

const { values: flags } = parseArgs({
  options: { messages: { type: "string", default: "10000" }, partitions: { type: "string", default: "4" } },
});
const total = Number(flags.messages);
const modes = (process.env.IDEMD_CONSUMER_BENCH_MODES ?? "").split(/\s+/).filter((mode) => mode !== "");
if (modes.length === 0) modes.push("parallel", "pipelined", "sequential");
const runs = Number(process.env.IDEMD_CONSUMER_BENCH_RUNS) > 0 ? Number(process.env.IDEMD_CONSUMER_BENCH_RUNS) : 3;
const parallelism = process.env.IDEMD_CONSUMER_BENCH_PARALLELISM;
const partitions = Number(flags.partitions);
const brokers = process.env.IDEMD_TEST_KAFKA_BROKERS;
if (!brokers) throw new Error("IDEMD_TEST_KAFKA_BROKERS is unset: run under scripts/kafka.sh run --");
const program = path.join(__dirname, "..", "examples", "kafka-consumer.js");
const kafka = new Kafka({ clientId: "idemd-ts-bench", brokers: brokers.split(","), logLevel: logLevel.ERROR });

function lines(file: string): number {
  if (!existsSync(file)) return 0;
  let count = 0;
  for (const byte of readFileSync(file)) if (byte === 10) count++;
  return count;
}

/** One run in `mode`: "no-helper" or the program's --mode. */
async function measure(run: number, mode: string, idemdAddress: string): Promise<void> {
  const admin = kafka.admin();
  await admin.connect();
  const topic = `bench-${randomBytes(4).toString("hex")}`;
  const dir = mkdtempSync(path.join(tmpdir(), "idemd-ts-bench-"));
  try {
    await createTopic(admin, topic, partitions);
    const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await producer.connect();
    for (let start = 1; start <= total; start += 1000) {
      const messages = [];
      for (let n = start; n < Math.min(start + 1000, total + 1); n++) {
        messages.push({
          partition: n % partitions,
          headers: { "idempotency-key": `${topic}-${n}` },
          value: JSON.stringify({ n, poison: false, amount: 100 }),
        });
      }
      await producer.send({ topic, messages, acks: -1 });
    }
    await producer.disconnect();

    const ledger = path.join(dir, "ledger.txt");
    const args = [program, "--brokers", brokers!, "--topic", topic, "--group", `${topic}-group`, "--idemd", idemdAddress,
      "--token", "conformance-token-alice-3f9a", "--ledger", ledger, "--dead-letters", path.join(dir, "dead-letters.jsonl")];
    if (mode === "no-helper") args.push("--no-helper");
    else {
      args.push("--mode", mode);
      if (parallelism) args.push("--parallelism", parallelism);
    }
    const child = spawn(process.execPath, args, { stdio: ["ignore", "ignore", "inherit"] });
    let started = 0;
    try {
      for (;;) {
        if (child.exitCode !== null) throw new Error(`the consumer exited with ${child.exitCode}`);
        const done = lines(ledger);
        if (done > 0 && started === 0) started = performance.now();
        if (done >= total) {
          const ends = await admin.fetchTopicOffsets(topic);
          const [committed] = await admin.fetchOffsets({ groupId: `${topic}-group`, topics: [topic] });
          const atEnd = ends.every(({ partition, high }) =>
            committed?.partitions.find((p) => p.partition === partition)?.offset === high);
          if (atEnd) break;
        }
        await sleep(done >= total ? 20 : 50);
      }
    } finally {
      child.kill("SIGTERM");
    }
    const seconds = (performance.now() - started) / 1000;
    console.log(`consumer throughput: run ${run}, ${mode}, ${total} messages, ${partitions} partitions: ` +
      `${seconds.toFixed(2)} s, ${Math.round(total / seconds)} msg/s`);
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
    await admin.disconnect();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const idemd = await startIdemd();
  try {
    for (let run = 1; run <= runs; run++) {
      for (const mode of ["no-helper", ...modes]) await measure(run, mode, idemd.address);
    }
  } finally {
    await idemd.stop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
