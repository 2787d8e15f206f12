/**
 * The consumer helper: the executor shaped for a message loop (docs/sdk.md, "Consumers";
 * clients/conformance/consumer-scenarios.md holds it to its rules against a real Kafka broker).
 *
 * Brokers deliver at least once: a rebalance, a crash before the offset commit or a producer's
 * retry delivers a message again. {@link onceConsumer} runs a handler once per message key
 * across consumers and restarts, and tells the loop whether it may commit the offset. It knows
 * no broker: the loop builds a {@link ConsumedMessage} from whatever its client delivers.
 */
import { status as GrpcStatus } from "@grpc/grpc-js";
import { InProgressError, KeyReuseError, OutcomePendingError, RpcError } from "./errors";
import { executeOnce, failReason, type HandlerContext } from "./executor";
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
  /** Lease to request, in milliseconds (default: the endpoint policy's); extended while the handler runs. */
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

/** Thrown inside the executor's handler so that a takeover is recorded as unknown, not run. */
class TakenOver extends Error {
  constructor(readonly attempt: number) {
    super(`outcome unknown: an earlier attempt's lease expired and this delivery took the key over as attempt ${attempt}`);
  }
}

/**
 * Wraps a per-message handler: `const process = onceConsumer(idemd, options)(handler)`, then
 * `const { outcome, mayCommit } = await process(message)` for each delivery, in order per
 * partition. The handler runs at most once per key (claim, run with lease extension, record);
 * a delivery whose earlier attempt failed or has an unknown outcome goes to `deadLetter`.
 * A message without its key header throws {@link MissingKeyError}; other refusals of idemd
 * (bad token, invalid key) throw too: they are configuration errors, not per-message ones.
 */
export function onceConsumer(
  client: ExecutorClient,
  options: OnceConsumerOptions,
): (handler: MessageHandler) => (message: ConsumedMessage) => Promise<Processed> {
  return (handler) => (message) => processOnce(client, options, handler, message);
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
      leaseMs: options.leaseMs,
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

/** The idemd key of a message: its header's value, or `<topic>-<partition>-<offset>`. */
export function messageKey(message: ConsumedMessage, source: KeySource): string {
  if (source === "topic-partition-offset") {
    // idemd keys are [A-Za-z0-9_-]: "_" is written "__" and "." "_d", so distinct topics stay
    // distinct, and the numeric partition and offset read from the right. Every SDK spells it so.
    const topic = message.topic.replace(/_/g, "__").replace(/\./g, "_d");
    const key = `${topic}-${message.partition}-${String(message.offset)}`;
    if (key.length > MAX_KEY_LENGTH) {
      throw new RangeError(`the key ${key.slice(0, 40)}... is longer than ${MAX_KEY_LENGTH} characters`);
    }
    return key;
  }
  const raw = message.headers?.[source.header];
  const values = (Array.isArray(raw) ? raw : raw === undefined ? [] : [raw]) as Array<string | Uint8Array>;
  const texts = [...new Set(values.map((v) => (typeof v === "string" ? v : Buffer.from(v).toString("utf8"))))];
  if (texts.length !== 1 || texts[0] === "") {
    if (texts.length > 1) {
      throw new TypeError(`message ${message.topic}/${message.partition}@${String(message.offset)} has ${texts.length} different "${source.header}" headers`);
    }
    throw new MissingKeyError(source.header, message.topic, message.partition, String(message.offset));
  }
  return texts[0]!;
}

function valueBytes(value: Uint8Array | string | null): Buffer {
  if (value === null) return Buffer.alloc(0);
  if (typeof value === "string") return Buffer.from(value, "utf8");
  return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}
