/**
 * The consumer helper: the executor shaped for a message loop (docs/sdk.md, "Consumers";
 * clients/conformance/consumer-scenarios.md holds it to its rules against a real Kafka broker).
 *
 * Brokers deliver at least once: a rebalance, a crash before the offset commit or a producer's
 * retry delivers a message again. {@link onceConsumer} runs a handler once per message key
 * across consumers and restarts, and tells the loop whether it may commit the offset. It knows
 * no broker: the loop builds a {@link ConsumedMessage} from whatever its client delivers.
 * {@link MessageProcessor.processBatch} does the same for a whole poll, with the bookkeeping in
 * ClaimBatch / CompleteBatch calls and up to `parallelism` messages in flight (issue 52).
 */
import { createHash, randomBytes } from "node:crypto";
import { Metadata, status as GrpcStatus } from "@grpc/grpc-js";
import { downstreamKey } from "./downstream";
import { InProgressError, KeyReuseError, NoSideEffectError, OutcomePendingError, RpcError } from "./errors";
import {
  capReason,
  errorText,
  executeOnce,
  failReason,
  LeaseKeeper,
  optionalDuration,
  quietly,
  stateName,
  withTransportRetries,
  type HandlerContext,
} from "./executor";
import { fingerprintV1 } from "./fingerprint";
import {
  Disposition,
  type ClaimBatchResult,
  type ClaimRequest,
  type Claimed,
  type DeepPartial,
  type ItemError,
} from "./gen/idemd/v1/idempotency";
import type { ExecutorClient } from "./types";

/** A header value as broker clients hand it over (kafkajs: `Buffer | string | array`). */
export type MessageHeaderValue = string | Uint8Array | ReadonlyArray<string | Uint8Array> | undefined;

/** One delivered message, built by the caller from its broker client's record. */
export interface ConsumedMessage {
  /** The payload; its bytes are the fingerprint, so a reused key with another value is refused. */
  value: Uint8Array | string | null;
  /** Headers by name (kafkajs' `message.headers` fits as is). */
  headers?: Readonly<Record<string, MessageHeaderValue>>;
  topic: string;
  partition: number;
  /** The offset, as the client gives it (kafkajs: a decimal string). */
  offset: string | number | bigint;
}

/**
 * Where a message's idempotency key comes from.
 *
 * - `{ header: "idempotency-key" }` (recommended): a key the producer chose per operation (its
 *   idempotency key or message id). It catches every duplicate: redeliveries, and a producer
 *   that sends the same thing twice (a retry after a lost ack, a replayed outbox). A message
 *   without the header is refused with a {@link MissingKeyError}.
 * - `"topic-partition-offset"`: the fallback when producers set no key. It only catches
 *   redeliveries of one record; a producer's second send gets a new offset, hence a new key, and
 *   runs again.
 */
export type KeySource = { header: string } | "topic-partition-offset";

/** What the loop does next, per {@link Processed.outcome}. */
export const Outcome = {
  /** The handler ran and its success is recorded: commit. */
  EXECUTED: "executed",
  /** An earlier delivery succeeded; the handler did not run: commit. */
  DUPLICATE: "duplicate",
  /** The dead-letter hook got the message (see {@link DeadLetter.kind}): commit. */
  DEAD_LETTERED: "dead_lettered",
  /**
   * Nothing decided (another consumer still holds the key after `maxWaitMs`, idemd unreachable,
   * or the dead-letter hook threw): do not commit; deliver this message again before any later
   * message of its partition (seek back to its offset).
   */
  RETRY: "retry",
} as const;
export type Outcome = (typeof Outcome)[keyof typeof Outcome];

/** Why a message went to the dead-letter hook. */
export type DeadLetterKind =
  /** The handler threw on this delivery (its claim is recorded as failed, with `reason`). */
  | "handler_failed"
  /** An earlier delivery's handler failed: running it again silently could repeat or mask it. */
  | "earlier_failed"
  /**
   * An earlier delivery's outcome is unknown: it died inside the handler, its lease expired, it
   * was taken over, or its success could not be recorded. The side effect may have happened.
   */
  | "outcome_unknown"
  /** The key was used before with a different message value. */
  | "fingerprint_mismatch";

/** What the dead-letter hook gets. */
export interface DeadLetter {
  message: ConsumedMessage;
  key: string;
  kind: DeadLetterKind;
  /** Human-readable; for `handler_failed`, the reason stored in idemd (`<Kind>: <message>`). */
  reason: string;
  /** The handler's error (`handler_failed`) or the executor's refusal. */
  error: unknown;
}

/** The result of {@link onceConsumer}'s processor for one delivery. */
export interface Processed {
  outcome: Outcome;
  /** True for all but {@link Outcome.RETRY}: the offset may be committed. */
  mayCommit: boolean;
  key: string;
  /** Set when `outcome` is `dead_lettered`. */
  deadLetter?: DeadLetter;
  /** Set when `outcome` is `retry`: why (an {@link InProgressError}, an {@link RpcError}, the hook's error). */
  error?: unknown;
}

/** The per-message side effect. `context` is the executor's (`signal`, `downstreamKey`, ...). */
export type MessageHandler = (message: ConsumedMessage, context: HandlerContext) => Promise<void> | void;

export interface OnceConsumerOptions {
  /** The idemd endpoint the keys are claimed under, e.g. `"kafka:payments"` (selects its policy). */
  endpoint: string;
  /** Where the key comes from (see {@link KeySource}). */
  key: KeySource;
  /**
   * Called for every message that must not run (again) silently. It runs at least once per such
   * delivery (again after a crash before the commit, or when it threw): make it idempotent, e.g.
   * keyed by {@link DeadLetter.key}. If it throws, the outcome is `retry`.
   */
  deadLetter: (letter: DeadLetter) => Promise<void> | void;
  /**
   * Lease to request, in milliseconds (default {@link DEFAULT_CONSUMER_LEASE_MS}, 5 s); extended at
   * half while the handler runs.
   */
  leaseMs?: number;
  /** How long a duplicate waits for another consumer that holds its key, in milliseconds (default 5000). */
  maxWaitMs?: number;
  /** Dedup window to request, in milliseconds (default: the endpoint policy's). */
  ttlMs?: number;
  /** How often an idemd call is retried on a transport error before the outcome is `retry` (default 4). */
  transportRetries?: number;
}

/** A message has no value for the key header that {@link OnceConsumerOptions.key} names. */
export class MissingKeyError extends Error {
  override readonly name = "MissingKeyError";
  constructor(readonly header: string, readonly topic: string, readonly partition: number, readonly offset: string) {
    super(`message ${topic}/${partition}@${offset} has no "${header}" header to take its idempotency key from`);
  }
}

/** Transport failures: idemd (or the way to it) may be back on the next delivery. */
const TRANSIENT = new Set<GrpcStatus>([
  GrpcStatus.UNAVAILABLE,
  GrpcStatus.DEADLINE_EXCEEDED,
  GrpcStatus.ABORTED,
  GrpcStatus.CANCELLED,
  GrpcStatus.RESOURCE_EXHAUSTED,
]);
const MAX_KEY_LENGTH = 255;
const DEFAULT_MAX_WAIT_MS = 5_000;

/**
 * The lease a consumer asks for unless `leaseMs` says otherwise: kept alive at half while the
 * handler runs, so a slow handler keeps its key, and a consumer killed inside one holds the
 * redelivered message (its partition) at most this long rather than the endpoint policy's default
 * lease (60 s unless configured, sized for HTTP clients that retry seconds apart). Issue 52.
 */
export const DEFAULT_CONSUMER_LEASE_MS = 5_000;

/** Thrown inside the executor's handler so that a takeover is recorded as unknown, not run. */
class TakenOver extends Error {
  constructor(readonly attempt: number) {
    super(`outcome unknown: an earlier attempt's lease expired and this delivery took the key over as attempt ${attempt}`);
  }
}

/**
 * What {@link onceConsumer} returns for a handler: called with one message, it processes that
 * message; {@link MessageProcessor.processBatch} processes a whole poll.
 */
export interface MessageProcessor {
  (message: ConsumedMessage): Promise<Processed>;
  /**
   * The processor for a whole poll: one {@link Processed} per message, in `messages`' order,
   * each meaning exactly what processing that message alone would return. The bookkeeping is
   * batched and pipelined: as slots free up (at most `parallelism` messages in flight), the
   * next messages' keys are claimed in one ClaimBatch call, each claimed handler starts the
   * moment the answer arrives (its lease extended while it runs), and the finished handlers'
   * successes are recorded together in CompleteBatch calls that overlap the next claims. A
   * message whose key an earlier message of the poll has in flight waits until that one is
   * decided (and is then a duplicate).
   *
   * Commit offsets in order: per partition, up to (not including) its first message that may
   * not be committed (`retry`). With `per_key` ordering a later message of that partition may
   * already have run; redelivered, it is a duplicate.
   *
   * The crash bound: a key is claimed only for a free slot, and every claimed handler starts as
   * soon as its ClaimBatch answers (nothing else runs in between). A process killed at any
   * point therefore parks as outcome-unknown at most `parallelism` messages, and only those
   * whose handler had started; the rest of the poll was never claimed and runs normally when
   * delivered again.
   *
   * The dead-letter hook may be called for several messages at once (its calls overlap): make
   * it safe for that. Against a server without ClaimBatch (`UNIMPLEMENTED`), each message is
   * processed as on its own, still up to `parallelism` at once.
   *
   * Rejects, as processing one message throws, on a configuration error: a message whose key
   * cannot be derived (before anything is claimed), or idemd refusing a claim for another
   * reason than a transport failure (then after the messages in flight are settled, claiming
   * no more).
   */
  processBatch(messages: readonly ConsumedMessage[], options?: BatchOptions): Promise<Processed[]>;
}

/** Which messages of a poll {@link MessageProcessor.processBatch} may run side by side. */
export const Ordering = {
  /**
   * The default: messages with different keys side by side (up to `parallelism`); two with one
   * key one after the other, in poll order. Side effects of a partition may happen out of
   * offset order; offsets are still committed in order.
   */
  PER_KEY: "per_key",
  /**
   * Each partition's messages one at a time, in offset order; the partitions of the poll side by
   * side (at most `parallelism` of them). For side effects that must happen in partition order.
   */
  PER_PARTITION: "per_partition",
} as const;
export type Ordering = (typeof Ordering)[keyof typeof Ordering];

/** Options of {@link MessageProcessor.processBatch}. */
export interface BatchOptions {
  /** {@link Ordering.PER_KEY} (default) or {@link Ordering.PER_PARTITION}. */
  ordering?: Ordering;
  /**
   * How many messages are in flight at once (being claimed, running, being completed), and so
   * the most handlers running at once and the most a crash can leave outcome-unknown
   * (default {@link DEFAULT_PARALLELISM}). 1: one message at a time in poll order, with the
   * bookkeeping still in batch calls.
   */
  parallelism?: number;
}

/**
 * The default `parallelism` of {@link MessageProcessor.processBatch}: enough that a fast
 * handler's bookkeeping rides in batches of dozens to hundreds of keys, few enough that a crash
 * parks at most that many messages (only those whose handler started).
 */
export const DEFAULT_PARALLELISM = 256;

/**
 * Wraps a per-message handler: `const process = onceConsumer(idemd, options)(handler)`, then
 * `const { outcome, mayCommit } = await process(message)` for each delivery, in order per
 * partition (or `await process.processBatch(messages)` for a whole poll, see
 * {@link MessageProcessor.processBatch}). The handler runs at most once per key (claim, run
 * with lease extension, record); a delivery whose earlier attempt failed or has an unknown
 * outcome goes to `deadLetter`. A message without its key header throws
 * {@link MissingKeyError}; other refusals of idemd (bad token, invalid key) throw too: they
 * are configuration errors, not per-message ones.
 */
export function onceConsumer(
  client: ExecutorClient,
  options: OnceConsumerOptions,
): (handler: MessageHandler) => MessageProcessor {
  return (handler) =>
    Object.assign((message: ConsumedMessage) => processOnce(client, options, handler, message), {
      processBatch: async (messages: readonly ConsumedMessage[], batch?: BatchOptions) =>
        new Batch(client, options, handler, messages, batch ?? {}).run(),
    });
}

async function processOnce(
  client: ExecutorClient,
  options: OnceConsumerOptions,
  handler: MessageHandler,
  message: ConsumedMessage,
): Promise<Processed> {
  const key = messageKey(message, options.key);
  const value = valueBytes(message.value);
  let handlerRan = false;
  let handlerThrew = false;
  try {
    const result = await executeOnce(client, {
      endpoint: options.endpoint,
      key,
      // The value's bytes as they are (no JSON canonicalization): the fingerprint is the payload.
      // The one fingerprint every SDK's helper sends (consumer-scenarios.md): method CONSUME,
      // path the endpoint, the value's bytes, no content type (no JSON canonicalization).
      request: { method: "CONSUME", path: options.endpoint, body: value },
      fingerprint: "local",
      leaseMs: options.leaseMs ?? DEFAULT_CONSUMER_LEASE_MS,
      ttlMs: options.ttlMs,
      maxWaitMs: options.maxWaitMs ?? DEFAULT_MAX_WAIT_MS,
      transportRetries: options.transportRetries,
      handler: async (context) => {
        // A takeover (attempt > 1) means an earlier attempt may have run the side effect.
        if (context.attempt > 1) throw new TakenOver(context.attempt);
        handlerRan = true;
        try {
          await handler(message, context);
        } catch (err) {
          handlerThrew = true;
          throw err;
        }
        return { status: 200 };
      },
    });
    return result.replayed ? decided(Outcome.DUPLICATE, key) : decided(Outcome.EXECUTED, key);
  } catch (err) {
    const letter = deadLetterOf(err, handlerThrew, message, key);
    if (letter) {
      try {
        await options.deadLetter(letter);
      } catch (hookError) {
        return { outcome: Outcome.RETRY, mayCommit: false, key, error: hookError };
      }
      return { outcome: Outcome.DEAD_LETTERED, mayCommit: true, key, deadLetter: letter };
    }
    // After the handler ran, whatever failed (recording the success), the next delivery asks
    // idemd again and can only replay or dead-letter: retrying is safe.
    if (err instanceof InProgressError || isTransient(err) || handlerRan) {
      return { outcome: Outcome.RETRY, mayCommit: false, key, error: err };
    }
    throw err;
  }
}

function decided(outcome: Outcome, key: string): Processed {
  return { outcome, mayCommit: true, key };
}

function deadLetterOf(err: unknown, handlerThrew: boolean, message: ConsumedMessage, key: string): DeadLetter | undefined {
  const letter = (kind: DeadLetterKind, reason: string): DeadLetter => ({ message, key, kind, reason, error: err });
  if (handlerThrew) return letter("handler_failed", failReason(err));
  if (err instanceof TakenOver) return letter("outcome_unknown", err.message);
  if (err instanceof KeyReuseError) {
    return letter("fingerprint_mismatch", "fingerprint mismatch: the key was used before with a different message value");
  }
  if (err instanceof OutcomePendingError) {
    if (err.state === "FAILED") return letter("earlier_failed", `an earlier attempt failed: ${err.reason}`);
    const how = err.state === "IN_PROGRESS" ? "its lease expired" : "recorded as unknown";
    return letter("outcome_unknown", `outcome unknown: an earlier attempt ${how}: ${err.reason}`);
  }
  return undefined;
}

function isTransient(err: unknown): boolean {
  return err instanceof RpcError && TRANSIENT.has(err.code);
}

/**
 * The idemd key of a message: its header's value (the last one when the name repeats, as Kafka's
 * `Headers.lastHeader`), or `<topic>-<partition>-<offset>`, a topic too long for idemd's 255
 * characters standing in as `h_` and the first 32 hex digits of its SHA-256. Every SDK derives the
 * same key (clients/conformance/consumer-key-v1.json).
 */
export function messageKey(message: ConsumedMessage, source: KeySource): string {
  if (source === "topic-partition-offset") {
    // idemd keys are [A-Za-z0-9_-]: "_" is written "__" and "." "_d", so distinct topics stay
    // distinct, and the numeric partition and offset read from the right. Every SDK spells it so.
    const suffix = `-${message.partition}-${String(message.offset)}`;
    let topic = message.topic.replace(/_/g, "__").replace(/\./g, "_d");
    if (topic.length + suffix.length > MAX_KEY_LENGTH) {
      // Kafka allows 249 characters and escaping lengthens them.
      topic = `h_${createHash("sha256").update(message.topic, "utf8").digest("hex").slice(0, 32)}`;
    }
    return topic + suffix;
  }
  const raw = message.headers?.[source.header];
  const values = (Array.isArray(raw) ? raw : raw === undefined ? [] : [raw]) as Array<string | Uint8Array>;
  const last = values.at(-1);
  const text = last === undefined ? "" : typeof last === "string" ? last : Buffer.from(last).toString("utf8");
  if (text === "") {
    throw new MissingKeyError(source.header, message.topic, message.partition, String(message.offset));
  }
  return text;
}

function valueBytes(value: Uint8Array | string | null): Buffer {
  if (value === null) return Buffer.alloc(0);
  if (typeof value === "string") return Buffer.from(value, "utf8");
  return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}

/** The server's limit on the items of one ClaimBatch or CompleteBatch. */
const MAX_BATCH_ITEMS = 500;

/** What a batch's handler left to record. */
interface Ran {
  index: number;
  fenced: { endpoint: string; key: string; leaseToken: string };
  keeper: LeaseKeeper;
  /** Set when the handler threw (or the claim was a takeover: a {@link TakenOver}). */
  error?: unknown;
  failed: boolean;
}

/**
 * One processBatch call's state. Node runs it on one thread: every callback below changes the
 * state, then calls pump(), which starts what the free slots allow.
 */
class Batch {
  private readonly outs: Array<Processed | undefined>;
  private readonly keys: string[];
  private readonly values: Buffer[];
  /** In flight: being claimed, running, being completed. */
  private readonly active: boolean[];
  private inFlight = 0;
  private undecided = 0;
  /** How many in-flight messages have each key (0 or 1). */
  private readonly activeKeys = new Map<string, number>();
  /** The poll's previous message with the same key, or -1. */
  private readonly prevSameKey: number[];
  /** Every message before it is decided. */
  private lo = 0;
  /** Per partition (topic and number), its messages in poll order, and how many are decided. */
  private readonly partitions = new Map<string, { queue: number[]; head: number; blocked: boolean }>();
  private readonly partitionOf: string[];
  private readonly ordering: Ordering;
  private readonly parallelism: number;
  private readonly retries: number;
  /** The server has no ClaimBatch: messages are processed one by one. */
  private fallback: boolean;
  private claiming = 0;
  private running = 0;
  private finished: Ran[] = [];
  private fatal: { error: unknown } | undefined;
  private settled = false;
  private resolve!: (outs: Processed[]) => void;
  private reject!: (err: unknown) => void;

  constructor(
    private readonly client: ExecutorClient,
    private readonly options: OnceConsumerOptions,
    private readonly handler: MessageHandler,
    private readonly messages: readonly ConsumedMessage[],
    batch: BatchOptions,
  ) {
    const n = messages.length;
    this.ordering = batch.ordering ?? Ordering.PER_KEY;
    if (this.ordering !== Ordering.PER_KEY && this.ordering !== Ordering.PER_PARTITION) {
      throw new TypeError(`processBatch: ordering is "${Ordering.PER_KEY}" or "${Ordering.PER_PARTITION}", not ${String(batch.ordering)}`);
    }
    this.parallelism = Math.max(1, Math.floor(batch.parallelism ?? DEFAULT_PARALLELISM));
    this.retries = options.transportRetries ?? 4;
    this.fallback = client.claimBatch === undefined || client.completeBatch === undefined;
    this.outs = new Array<Processed | undefined>(n).fill(undefined);
    this.active = new Array<boolean>(n).fill(false);
    this.prevSameKey = new Array<number>(n).fill(-1);
    // As processing one message: a key that cannot be derived throws (here before any claim).
    this.keys = messages.map((message) => messageKey(message, options.key));
    this.values = messages.map((message) => valueBytes(message.value));
    this.partitionOf = messages.map((m) => `${m.topic}\u0000${m.partition}`);
    const last = new Map<string, number>();
    for (let i = 0; i < n; i++) {
      const previous = last.get(this.keys[i]!);
      if (previous !== undefined) this.prevSameKey[i] = previous;
      last.set(this.keys[i]!, i);
      const p = this.partitionOf[i]!;
      let partition = this.partitions.get(p);
      if (!partition) this.partitions.set(p, (partition = { queue: [], head: 0, blocked: false }));
      partition.queue.push(i);
    }
    this.undecided = n;
  }

  run(): Promise<Processed[]> {
    return new Promise<Processed[]>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
      this.pump();
    });
  }

  private decide(i: number, out: Processed): void {
    if (this.outs[i] !== undefined) return;
    this.outs[i] = out;
    this.undecided--;
    if (this.active[i]) {
      this.active[i] = false;
      this.inFlight--;
      const key = this.keys[i]!;
      const count = (this.activeKeys.get(key) ?? 1) - 1;
      if (count === 0) this.activeKeys.delete(key);
      else this.activeKeys.set(key, count);
    }
    if (out.outcome === Outcome.RETRY && this.ordering === Ordering.PER_PARTITION) {
      this.partitions.get(this.partitionOf[i]!)!.blocked = true;
    }
  }

  /** Starts claims for free slots and CompleteBatch calls for finished handlers; settles at the end. */
  private pump(): void {
    if (this.settled) return;
    // Claims wait for a few free slots rather than one, so that they ride in batches;
    // completions likewise, unless no handler is left to finish.
    const chunk = Math.max(1, Math.floor(this.parallelism / 8));
    const free = this.parallelism - this.inFlight;
    if (this.fatal === undefined && (free >= chunk || (free > 0 && this.claiming === 0 && this.running === 0))) {
      const next = this.pick(free);
      if (next.length > 0) this.start(next);
    }
    if (this.finished.length > 0 && (this.finished.length >= chunk || this.running === 0)) {
      const finished = this.finished;
      this.finished = [];
      this.complete(finished);
    }
    if (this.inFlight > 0) return;
    if (this.fatal !== undefined) {
      this.settled = true;
      this.reject(this.fatal.error);
      return;
    }
    // Unreachable with undecided messages left (pick always finds the first undecided message
    // of a key), but never return a message without an outcome.
    for (let i = 0; i < this.outs.length; i++) {
      if (this.outs[i] === undefined) {
        this.decide(i, { outcome: Outcome.RETRY, mayCommit: false, key: this.keys[i]!, error: new Error("processBatch could not start this message") });
      }
    }
    this.settled = true;
    this.resolve(this.outs as Processed[]);
  }

  /**
   * Up to `limit` messages to start, in poll order: undecided, not in flight, no message with
   * its key in flight or undecided before it, and with per_partition the first undecided
   * message of its partition.
   */
  private pick(limit: number): number[] {
    const eligible = (i: number): boolean => {
      if (this.outs[i] !== undefined || this.active[i] || (this.activeKeys.get(this.keys[i]!) ?? 0) > 0) return false;
      const p = this.prevSameKey[i]!;
      return p < 0 || this.outs[p] !== undefined;
    };
    const next: number[] = [];
    if (this.ordering === Ordering.PER_PARTITION) {
      for (const partition of this.partitions.values()) {
        const { queue } = partition;
        while (partition.head < queue.length && this.outs[queue[partition.head]!] !== undefined) partition.head++;
        if (partition.blocked) {
          // An earlier message of the partition is to be retried: nothing after it may run first.
          for (; partition.head < queue.length; partition.head++) {
            const i = queue[partition.head]!;
            this.decide(i, {
              outcome: Outcome.RETRY,
              mayCommit: false,
              key: this.keys[i]!,
              error: new Error("an earlier message of its partition must be retried first"),
            });
          }
          continue;
        }
        if (partition.head < queue.length && next.length < limit && eligible(queue[partition.head]!)) {
          next.push(queue[partition.head]!);
        }
      }
      return next;
    }
    while (this.lo < this.outs.length && this.outs[this.lo] !== undefined) this.lo++;
    const picked = new Set<string>();
    for (let i = this.lo; i < this.outs.length && next.length < limit; i++) {
      if (eligible(i) && !picked.has(this.keys[i]!)) {
        next.push(i);
        picked.add(this.keys[i]!);
      }
    }
    return next;
  }

  /** Claims next's keys in ClaimBatch calls of at most 500; each claimed handler starts as its answer arrives. */
  private start(next: number[]): void {
    for (const i of next) {
      this.active[i] = true;
      this.activeKeys.set(this.keys[i]!, (this.activeKeys.get(this.keys[i]!) ?? 0) + 1);
    }
    this.inFlight += next.length;
    if (this.fallback) {
      for (const i of next) this.single(i);
      return;
    }
    for (let lo = 0; lo < next.length; lo += MAX_BATCH_ITEMS) {
      const indexes = next.slice(lo, lo + MAX_BATCH_ITEMS);
      const claims = indexes.map((i) => this.claimRequest(i));
      this.claiming++;
      this.claimBatch(claims).then(
        (results) => {
          // The handlers start here, one after the other, before anything else: nothing may
          // come between a granted claim and its handler (the crash bound).
          indexes.forEach((i, n) => {
            const claimed = results[n]!.response?.claimed;
            if (claimed) {
              this.running++;
              void this.runClaimed(i, claims[n]!.key!, claimed);
            }
          });
          this.claiming--;
          indexes.forEach((i, n) => {
            if (!results[n]!.response?.claimed) this.settle(i, () => this.answer(i, results[n]!));
          });
          this.pump();
        },
        (err: unknown) => {
          this.claiming--;
          if (err instanceof RpcError && err.code === GrpcStatus.UNIMPLEMENTED) {
            // A server older than ClaimBatch: from now on, one message at a time.
            this.fallback = true;
            for (const i of indexes) this.single(i);
          } else if (isTransient(err)) {
            for (const i of indexes) this.decide(i, { outcome: Outcome.RETRY, mayCommit: false, key: this.keys[i]!, error: err });
          } else {
            this.fail(err);
            for (const i of indexes) this.decide(i, { outcome: Outcome.RETRY, mayCommit: false, key: this.keys[i]!, error: err });
          }
          this.pump();
        },
      );
    }
  }

  /** A configuration error: no more claims; processBatch rejects with it once the messages in flight settle. */
  private fail(err: unknown): void {
    this.fatal ??= { error: err };
  }

  /** Message i processed on its own (the fallback). */
  private single(i: number): void {
    this.settle(i, () => processOnce(this.client, this.options, this.handler, this.messages[i]!));
  }

  /** Decides message i with what `outcome` resolves to (a rejection is a configuration error). */
  private settle(i: number, outcome: () => Promise<Processed>): void {
    outcome().then(
      (out) => this.decide(i, out),
      (err: unknown) => {
        this.fail(err);
        this.decide(i, { outcome: Outcome.RETRY, mayCommit: false, key: this.keys[i]!, error: err });
      },
    ).finally(() => this.pump());
  }

  /** What processing message i alone would claim (its endpoint is the batch's). */
  private claimRequest(i: number): DeepPartial<ClaimRequest> {
    const { endpoint } = this.options;
    return {
      key: this.keys[i]!,
      attemptId: randomBytes(16).toString("base64url"),
      lease: optionalDuration(this.options.leaseMs ?? DEFAULT_CONSUMER_LEASE_MS),
      ttl: optionalDuration(this.options.ttlMs),
      sha256: fingerprintV1({ method: "CONSUME", path: endpoint, body: this.values[i]! }),
    };
  }

  /** One ClaimBatch, retried on a transport error as a Claim is (same attempt ids). */
  private async claimBatch(claims: Array<DeepPartial<ClaimRequest>>): Promise<ClaimBatchResult[]> {
    const response = await withTransportRetries(this.retries, undefined, () =>
      this.client.claimBatch!({ endpoint: this.options.endpoint, claims }),
    );
    if (response.results.length !== claims.length) {
      throw new RpcError(GrpcStatus.INTERNAL, `ClaimBatch answered ${response.results.length} results for ${claims.length} claims`);
    }
    return response.results;
  }

  /** Runs claimed message i's handler with its lease kept alive, as processing it alone does. */
  private async runClaimed(i: number, key: string, claimed: Claimed): Promise<void> {
    const { endpoint } = this.options;
    const fenced = { endpoint, key, leaseToken: claimed.leaseToken };
    // The lease asked for (every claim asks for one: the option or the consumer default).
    const leaseMs = this.options.leaseMs ?? DEFAULT_CONSUMER_LEASE_MS;
    const lost = new AbortController();
    const keeper = new LeaseKeeper(this.client, fenced, leaseMs, lost);
    keeper.start();
    const ran: Ran = { index: i, fenced, keeper, failed: false };
    try {
      // A takeover (attempt > 1) means an earlier attempt may have run the side effect.
      if (claimed.attempt > 1) throw new TakenOver(claimed.attempt);
      const context: HandlerContext = {
        endpoint,
        key,
        attempt: claimed.attempt,
        signal: lost.signal,
        downstreamKey: (step: string) => downstreamKey(key, step),
      };
      await this.handler(this.messages[i]!, context);
    } catch (err) {
      ran.failed = true;
      ran.error = err;
    }
    this.running--;
    if (!ran.failed) {
      // The lease stays extended until CompleteBatch answers: a success may wait in `finished`
      // for others longer than the lease.
      this.finished.push(ran);
      this.pump();
      return;
    }
    keeper.stop();
    this.settle(i, async () => {
      const err = ran.error;
      const deliver = (call: () => Promise<unknown>): Promise<void> =>
        quietly(withTransportRetries(this.retries, undefined, call, () => keeper.expiresAt));
      if (err instanceof NoSideEffectError) {
        await deliver(() => this.client.fail({ ...fenced, disposition: Disposition.DISPOSITION_RELEASE }));
      } else {
        // Ambiguous: the side effect may have happened. Never release.
        await deliver(() => this.client.fail({ ...fenced, disposition: Disposition.DISPOSITION_UNKNOWN, reason: failReason(err) }));
      }
      return this.deadLettered(i, deadLetterOf(err, !(err instanceof TakenOver), this.messages[i]!, key)!);
    });
  }

  /** The outcome of a claim item that did not grant the key, as processing the message alone decides it. */
  private async answer(i: number, result: ClaimBatchResult): Promise<Processed> {
    const key = this.keys[i]!;
    const message = this.messages[i]!;
    if (result.error) {
      const err = itemError(result.error);
      if (isTransient(err)) return { outcome: Outcome.RETRY, mayCommit: false, key, error: err };
      throw err;
    }
    const response = result.response!;
    if (response.replayed) return decided(Outcome.DUPLICATE, key);
    // Another consumer holds the key: wait for it (up to maxWaitMs) as processing it alone does.
    if (response.inProgress) return processOnce(this.client, this.options, this.handler, message);
    if (response.mismatch) {
      return this.deadLettered(i, deadLetterOf(new KeyReuseError(response.httpStatus, response.errorCode), false, message, key)!);
    }
    if (response.pending) {
      const err = new OutcomePendingError(stateName(response.pending.state), response.pending.reason, response.httpStatus, response.errorCode);
      return this.deadLettered(i, deadLetterOf(err, false, message, key)!);
    }
    throw new Error("idemd answered a Claim without an outcome (newer server?)");
  }

  private async deadLettered(i: number, letter: DeadLetter): Promise<Processed> {
    try {
      await this.options.deadLetter(letter);
    } catch (hookError) {
      return { outcome: Outcome.RETRY, mayCommit: false, key: this.keys[i]!, error: hookError };
    }
    return { outcome: Outcome.DEAD_LETTERED, mayCommit: true, key: this.keys[i]!, deadLetter: letter };
  }

  /** Records finished successes with CompleteBatch calls (at most 500 items each), then decides them. */
  private complete(finished: Ran[]): void {
    for (let lo = 0; lo < finished.length; lo += MAX_BATCH_ITEMS) {
      const chunk = finished.slice(lo, lo + MAX_BATCH_ITEMS);
      void this.completeChunk(chunk).then(
        (outs) => chunk.forEach((ran, n) => this.decide(ran.index, outs[n]!)),
        (err: unknown) => {
          this.fail(err);
          for (const ran of chunk) this.decide(ran.index, { outcome: Outcome.RETRY, mayCommit: false, key: ran.fenced.key, error: err });
        },
      ).finally(() => this.pump());
    }
  }

  /**
   * One CompleteBatch, retried on a transport error while the leases hold (a Complete is safe
   * to repeat), and each item's outcome as processing the message alone would decide it.
   */
  private async completeChunk(chunk: Ran[]): Promise<Processed[]> {
    const until = (): number => Math.min(...chunk.map((ran) => ran.keeper.expiresAt));
    let errors: Array<unknown>;
    try {
      const response = await withTransportRetries(this.retries, undefined, () =>
        this.client.completeBatch!({
          endpoint: this.options.endpoint,
          completions: chunk.map(({ fenced }) => ({ key: fenced.key, leaseToken: fenced.leaseToken, response: STORED })),
        }), until).finally(() => chunk.forEach((ran) => ran.keeper.stop()));
      if (response.results.length !== chunk.length) {
        throw new RpcError(GrpcStatus.INTERNAL, `CompleteBatch answered ${response.results.length} results for ${chunk.length} items`);
      }
      errors = response.results.map((result) => (result.error ? itemError(result.error) : undefined));
    } catch (err) {
      errors = chunk.map(() => err);
    }
    return Promise.all(chunk.map((ran, n) => (errors[n] === undefined ? decided(Outcome.EXECUTED, ran.fenced.key) : this.completeFailed(ran, errors[n]))));
  }

  /**
   * A success that could not be recorded: as processing the message alone, marked unknown
   * (unless the key is someone else's now) and `retry` (the next delivery can only replay or
   * dead-letter it).
   */
  private async completeFailed(ran: Ran, err: unknown): Promise<Processed> {
    const retry: Processed = { outcome: Outcome.RETRY, mayCommit: false, key: ran.fenced.key, error: err };
    if (err instanceof RpcError && (err.code === GrpcStatus.FAILED_PRECONDITION || err.code === GrpcStatus.NOT_FOUND)) return retry;
    try {
      await withTransportRetries(this.retries, undefined, () => this.client.fail({
        ...ran.fenced,
        disposition: Disposition.DISPOSITION_UNKNOWN,
        reason: capReason(`the response could not be stored: ${errorText(err)}`),
      }), () => ran.keeper.expiresAt);
    } catch (failErr) {
      // A CompleteBatch whose answer was lost did store the response.
      if (failErr instanceof RpcError && failErr.code === GrpcStatus.FAILED_PRECONDITION && failErr.reason === "ALREADY_COMPLETED") {
        return decided(Outcome.EXECUTED, ran.fenced.key);
      }
    }
    return retry;
  }
}

/** The response a consumer's execution stores (processing one message stores the same). */
const STORED = { status: 200 };

/** A batch item's error as the {@link RpcError} the single call would have thrown, details included. */
function itemError(error: ItemError): RpcError {
  const metadata = new Metadata();
  if (error.statusDetails.length > 0) metadata.set("grpc-status-details-bin", Buffer.from(error.statusDetails));
  return new RpcError(error.code as GrpcStatus, error.message, metadata);
}
