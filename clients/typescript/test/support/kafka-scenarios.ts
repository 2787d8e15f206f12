/**
 * Plays one scenario of clients/conformance/consumer-scenarios.json as consumer-scenarios.md's
 * "The runner" says: a fresh topic, group and key prefix; the messages produced up front; the
 * consumer program (dist/examples/kafka-consumer.js) started, stopped and killed as separate
 * processes; a 60 s bound on everything being accounted for and committed.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Kafka, logLevel, Partitioners, type Admin } from "kafkajs";
import { conformanceDir, sdkRoot } from "./paths";

export interface ConsumerEntry {
  name: string;
  kill_after_side_effect_of?: number;
  kill_in_handler_after_side_effect_of?: number;
  start_after_side_effects?: number;
  start_after_exit_of?: string;
  stop_after_side_effects?: number;
}

export interface Scenario {
  name: string;
  partitions?: number;
  key_header?: string;
  lease?: string;
  handler_ms?: number;
  produce: { messages: number; duplicate_every?: number; duplicate_to_other_partition?: boolean; poison?: number[] };
  consumers: ConsumerEntry[];
  negative_control?: boolean;
  expect: {
    side_effects: "each_once" | "each_once_except_poison";
    dead_letters: Array<{ message: number; reason_includes: string }>;
    duplicates_skipped_at_least?: number;
  };
}

export interface ScenarioFile {
  defaults: { partitions: number; key_header: string; lease?: string; handler_ms: number };
  scenarios: Scenario[];
}

export function loadScenarios(): ScenarioFile {
  return JSON.parse(readFileSync(path.join(conformanceDir, "consumer-scenarios.json"), "utf8")) as ScenarioFile;
}

/** What a played scenario left behind, for {@link checkExpect}. */
export interface Played {
  /** Ledger lines, in order. */
  ledger: number[];
  deadLetters: Array<{ message: number; reason: string }>;
  /** Sum of the `duplicates` counts the consumers printed on a clean exit. */
  duplicates: number;
  /**
   * After a kill inside a handler (`kill_in_handler_after_side_effect_of`): how long the partition
   * stalled, from the moment the runner saw the killed consumer gone to the moment the killed
   * message was decided again (dead-lettered with the helper, its side effect repeated without),
   * both seen by the runner's 100 ms polls. Undefined without such a kill, or when the message was
   * never decided again.
   */
  stallMs?: number;
}

/** The consumer program's --mode values; test.sh plays every scenario in each (IDEMD_CONSUMER_MODES narrows them). */
export type Mode = "sequential" | "pipelined" | "parallel";

/**
 * The program's --parallelism in the pipelined and parallel modes: fewer in flight than a
 * scenario's poll, so that a helper claiming more than its window would show (the crash bound).
 */
export const SCENARIO_PARALLELISM = 4;

const BOUND_MS = 60_000;
const PROGRAM = path.join(sdkRoot, "dist", "examples", "kafka-consumer.js");
const ALICE = "conformance-token-alice-3f9a";

/** "10s", "1500ms" → milliseconds. */
export function durationMs(text: string): number {
  const match = /^(\d+)(ms|s)$/.exec(text);
  if (!match) throw new Error(`unsupported duration ${JSON.stringify(text)}`);
  return Number(match[1]) * (match[2] === "s" ? 1000 : 1);
}

export class KafkaScenarios {
  private readonly kafka: Kafka;
  private readonly admin: Admin;

  constructor(private readonly brokers: string, private readonly idemdAddress: string) {
    this.kafka = new Kafka({ clientId: "idemd-ts-scenarios", brokers: brokers.split(","), logLevel: logLevel.ERROR });
    this.admin = this.kafka.admin();
  }

  async connect(): Promise<void> {
    await this.admin.connect();
  }

  async close(): Promise<void> {
    await this.admin.disconnect();
  }

  /** Plays `scenario` (with or without the helper) and returns what it left for the checks. */
  async play(file: ScenarioFile, scenario: Scenario, index: number, noHelper: boolean, mode: Mode = "sequential"): Promise<Played> {
    const settings = { ...file.defaults, ...scenario };
    const prefix = randomBytes(6).toString("hex");
    const topic = `consumer-${prefix}-${index}`;
    const group = `${topic}-group`;
    const partitions = settings.partitions;
    const dir = mkdtempSync(path.join(tmpdir(), "idemd-ts-kafka-"));
    const ledgerFile = path.join(dir, "ledger.txt");
    const deadLetterFile = path.join(dir, "dead-letters.jsonl");
    const running = new Map<string, Consumer>();
    const exited = new Set<string>();
    const summaries: string[] = [];
    try {
      await createTopic(this.admin, topic, partitions);
      await this.produce(topic, partitions, settings.key_header, prefix, scenario.produce);
      const total = scenario.produce.messages;

      const pending = [...scenario.consumers];
      const stopSent = new Set<ConsumerEntry>();
      const deadline = Date.now() + BOUND_MS;
      let killed: number | undefined, killedAt = 0, stallMs: number | undefined;
      for (;;) {
        const ledger = readLedger(ledgerFile);
        const deadLetters = readDeadLetters(deadLetterFile);
        if (killed !== undefined && stallMs === undefined &&
            (deadLetters.some((d) => d.message === killed) || ledger.filter((n) => n === killed).length > 1)) {
          stallMs = Date.now() - killedAt;
        }
        for (const name of [...running.keys()]) {
          const consumer = running.get(name)!;
          if (consumer.exit !== undefined) {
            running.delete(name);
            exited.add(name);
            if (killed === undefined && consumer.entry.kill_in_handler_after_side_effect_of !== undefined) {
              killed = consumer.entry.kill_in_handler_after_side_effect_of;
              killedAt = Date.now();
            }
            if (consumer.summary) summaries.push(consumer.summary);
            if (consumer.exit.code !== null && consumer.exit.code !== 0) {
              throw new Error(`consumer ${name} exited with ${consumer.exit.code}:\n${consumer.stderr.slice(-3000)}`);
            }
          }
        }
        for (const entry of [...pending]) {
          const ready =
            (entry.start_after_side_effects === undefined || ledger.length >= entry.start_after_side_effects) &&
            (entry.start_after_exit_of === undefined || exited.has(entry.start_after_exit_of));
          if (ready && !running.has(entry.name)) {
            pending.splice(pending.indexOf(entry), 1);
            exited.delete(entry.name);
            running.set(entry.name, this.start(entry, {
              topic, group, partitions, noHelper, mode, ledgerFile, deadLetterFile,
              keyHeader: settings.key_header, leaseMs: settings.lease === undefined ? undefined : durationMs(settings.lease), handlerMs: settings.handler_ms,
            }));
          }
        }
        for (const entry of scenario.consumers) {
          const consumer = running.get(entry.name);
          if (consumer?.entry === entry && entry.stop_after_side_effects !== undefined &&
              ledger.length >= entry.stop_after_side_effects && !stopSent.has(entry)) {
            stopSent.add(entry);
            consumer.child.kill("SIGTERM");
          }
        }
        const accounted = new Set([...ledger, ...deadLetters.map((d) => d.message)]);
        if (pending.length === 0 && accounted.size >= total && (await this.committedToEnd(topic, group))) break;
        if (Date.now() > deadline) {
          throw new Error(`not settled within ${BOUND_MS / 1000} s: ${accounted.size}/${total} messages accounted for, ` +
            `pending consumers [${pending.map((e) => e.name).join(", ")}]\n` +
            [...running.values()].map((c) => `${c.entry.name}: ${c.stderr.slice(-1500)}`).join("\n"));
        }
        await sleep(100);
      }
      for (const [name, consumer] of running) {
        const exit = await consumer.stop();
        if (consumer.summary) summaries.push(consumer.summary);
        if (exit.code !== 0) throw new Error(`consumer ${name} did not exit 0 on SIGTERM (${JSON.stringify(exit)}):\n${consumer.stderr.slice(-3000)}`);
      }
      running.clear();
      return {
        ledger: readLedger(ledgerFile),
        deadLetters: readDeadLetters(deadLetterFile),
        duplicates: summaries.reduce((sum, line) => sum + ((JSON.parse(line) as { duplicates: number }).duplicates ?? 0), 0),
        stallMs,
      };
    } finally {
      for (const consumer of running.values()) consumer.child.kill("SIGKILL");
      await this.admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    }
  }

  private async produce(topic: string, partitions: number, keyHeader: string, prefix: string, spec: Scenario["produce"]): Promise<void> {
    const producer = this.kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await producer.connect();
    try {
      const messages = [];
      for (let n = 1; n <= spec.messages; n++) {
        const record = {
          partition: n % partitions,
          headers: { [keyHeader]: `${prefix}-${n}` },
          value: JSON.stringify({ n, poison: (spec.poison ?? []).includes(n), amount: 100 }),
        };
        messages.push(record);
        if (spec.duplicate_every && n % spec.duplicate_every === 0) {
          messages.push({ ...record, partition: spec.duplicate_to_other_partition ? (n + 1) % partitions : record.partition });
        }
      }
      await producer.send({ topic, messages, acks: -1 });
    } finally {
      await producer.disconnect();
    }
  }

  private async committedToEnd(topic: string, group: string): Promise<boolean> {
    const ends = await this.admin.fetchTopicOffsets(topic);
    const [committed] = await this.admin.fetchOffsets({ groupId: group, topics: [topic] });
    return ends.every(({ partition, high }) => {
      const offset = committed?.partitions.find((p) => p.partition === partition)?.offset ?? "-1";
      return BigInt(high) === 0n || BigInt(offset) >= BigInt(high);
    });
  }

  private start(entry: ConsumerEntry, s: {
    topic: string; group: string; partitions: number; noHelper: boolean; mode: Mode; ledgerFile: string; deadLetterFile: string;
    keyHeader: string; leaseMs: number | undefined; handlerMs: number;
  }): Consumer {
    if (!existsSync(PROGRAM)) throw new Error(`${PROGRAM} is missing: build first (npm run build)`);
    const args = [
      PROGRAM,
      "--brokers", this.brokers,
      "--topic", s.topic, "--group", s.group,
      "--idemd", this.idemdAddress, "--token", ALICE,
      "--key-header", s.keyHeader, "--handler-ms", String(s.handlerMs),
      "--ledger", s.ledgerFile, "--dead-letters", s.deadLetterFile,
    ];
    // Without a lease the program passes none: the consumer's default, DEFAULT_CONSUMER_LEASE_MS.
    if (s.leaseMs !== undefined) args.push("--lease-ms", String(s.leaseMs));
    if (entry.kill_after_side_effect_of !== undefined) args.push("--kill-after", String(entry.kill_after_side_effect_of));
    if (entry.kill_in_handler_after_side_effect_of !== undefined) {
      args.push("--kill-in-handler-after", String(entry.kill_in_handler_after_side_effect_of));
    }
    if (s.noHelper) args.push("--no-helper");
    else if (s.mode !== "sequential") args.push("--mode", s.mode, "--parallelism", String(SCENARIO_PARALLELISM));
    return new Consumer(entry, spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] }));
  }
}

/** One consumer process and what it printed. */
class Consumer {
  exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  summary: string | undefined;
  stderr = "";
  private readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  constructor(readonly entry: ConsumerEntry, readonly child: ChildProcess) {
    let stdout = "";
    child.stdout!.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr!.on("data", (chunk: Buffer) => (this.stderr = (this.stderr + chunk.toString()).slice(-20_000)));
    this.exited = new Promise((resolve) =>
      child.once("close", (code, signal) => {
        this.exit = { code, signal };
        this.summary = stdout.trim().split("\n").filter((line) => line.startsWith("{")).pop();
        resolve(this.exit);
      }),
    );
  }

  /** SIGTERM, then SIGKILL after 20 s. */
  async stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    if (this.exit) return this.exit;
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 20_000);
    try {
      return await this.exited;
    } finally {
      clearTimeout(timer);
    }
  }
}

/**
 * Creates `topic` and waits for its partitions' leaders. kafkajs' own wait (waitForLeaders) gives
 * up when a metadata request races the new topic on a loaded broker ("This server does not host
 * this topic-partition"); the topic is created all the same, so that wait is done again here.
 */
export async function createTopic(admin: Admin, topic: string, partitions: number): Promise<void> {
  try {
    await admin.createTopics({ topics: [{ topic, numPartitions: partitions }], waitForLeaders: true });
    return;
  } catch (err) {
    const { type, code } = err as { type?: string; code?: number };
    if (type !== "UNKNOWN_TOPIC_OR_PARTITION" && code !== 3) throw err;
  }
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      const { topics } = await admin.fetchTopicMetadata({ topics: [topic] });
      const found = topics[0]?.partitions ?? [];
      if (found.length === partitions && found.every((p) => p.leader >= 0)) return;
    } catch (err) {
      if (Date.now() > deadline) throw err;
    }
    if (Date.now() > deadline) throw new Error(`topic ${topic}: no leader for every partition within 30 s`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

function readLedger(file: string): number[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8").split("\n").filter((line) => line !== "").map(Number);
}

function readDeadLetters(file: string): Array<{ message: number; reason: string }> {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8").split("\n").filter((line) => line !== "")
    .map((line) => JSON.parse(line) as { message: number; reason: string });
}

/** The failures of `expect.side_effects` (empty when it holds). */
export function sideEffectFailures(scenario: Scenario, played: Played): string[] {
  const poison = new Set(scenario.expect.side_effects === "each_once_except_poison" ? scenario.produce.poison ?? [] : []);
  const counts = new Map<number, number>();
  for (const n of played.ledger) counts.set(n, (counts.get(n) ?? 0) + 1);
  const failures: string[] = [];
  for (let n = 1; n <= scenario.produce.messages; n++) {
    const want = poison.has(n) ? 0 : 1;
    if ((counts.get(n) ?? 0) !== want) failures.push(`message ${n}: side effect ${counts.get(n) ?? 0} times, want ${want}`);
  }
  for (const n of counts.keys()) {
    if (n < 1 || n > scenario.produce.messages) failures.push(`unexpected message ${n} in the ledger`);
  }
  return failures;
}

/**
 * Every failure of `expect` (empty when the scenario holds). In the pipelined and parallel modes a
 * kill inside a handler may also park the other messages then in flight: a dead letter beyond the
 * expected ones is allowed only with an "unknown" reason, at most SCENARIO_PARALLELISM - 1 of them
 * (the window beside the killed handler), and such a message's side effect may be missing (parked
 * before its handler wrote it; never run twice).
 */
export function checkExpect(scenario: Scenario, played: Played, mode: Mode = "sequential"): string[] {
  const want = scenario.expect.dead_letters;
  const parkedBeside = new Set<number>();
  if (mode !== "sequential" && scenario.consumers.some((c) => c.kill_in_handler_after_side_effect_of !== undefined)) {
    const expected = new Set(want.map((d) => d.message));
    for (const d of played.deadLetters) {
      if (!expected.has(d.message) && d.reason.toLowerCase().includes("unknown")) parkedBeside.add(d.message);
    }
  }
  const failures = sideEffectFailures(scenario, played).filter((failure) => {
    const missing = /^message (\d+): side effect 0 times, want 1$/.exec(failure);
    return !(missing && parkedBeside.has(Number(missing[1])));
  });
  if (parkedBeside.size > SCENARIO_PARALLELISM - 1) {
    failures.push(`${parkedBeside.size} messages parked beside the killed handler, more than the ${SCENARIO_PARALLELISM - 1} others a window of ${SCENARIO_PARALLELISM} holds`);
  }
  const got = [...new Set(played.deadLetters.map((d) => d.message))].filter((n) => !parkedBeside.has(n)).sort((a, b) => a - b);
  const wanted = want.map((d) => d.message).sort((a, b) => a - b);
  if (JSON.stringify(got) !== JSON.stringify(wanted)) failures.push(`dead letters ${JSON.stringify(got)}, want ${JSON.stringify(wanted)}`);
  for (const { message, reason_includes } of want) {
    for (const line of played.deadLetters.filter((d) => d.message === message)) {
      if (!line.reason.toLowerCase().includes(reason_includes.toLowerCase())) {
        failures.push(`dead letter of ${message}: reason ${JSON.stringify(line.reason)} lacks ${JSON.stringify(reason_includes)}`);
      }
    }
  }
  const atLeast = scenario.expect.duplicates_skipped_at_least;
  if (atLeast !== undefined && played.duplicates < atLeast) failures.push(`${played.duplicates} duplicates skipped, want at least ${atLeast}`);
  return failures;
}
