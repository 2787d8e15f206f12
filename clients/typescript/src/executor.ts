/**
 * The executor: the client half of the idempotency contract (docs/sdk.md).
 *
 *   Claim → claimed     → run the handler → Complete (or Fail RELEASE / Fail UNKNOWN)
 *         → replayed    → return the stored response
 *         → in_progress → wait (server-side, then backoff with full jitter) and Claim again
 *         → mismatch    → KeyReuseError (422)
 *         → pending     → OutcomePendingError (409)
 */
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { status as GrpcStatus } from "@grpc/grpc-js";
import { downstreamKey } from "./downstream";
import {
  InProgressError,
  KeyReuseError,
  NoSideEffectError,
  OutcomePendingError,
  RpcError,
} from "./errors";
import { fingerprintV1 } from "./fingerprint";
import {
  Disposition,
  State,
  stateToJSON,
  type ClaimRequest,
  type Claimed,
  type DeepPartial,
  type StoredResponse,
} from "./gen/idemd/v1/idempotency";
import type { Duration } from "./gen/google/protobuf/duration";
import type { ExecutorClient } from "./types";

/** Headers in order, repeats kept: `[["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"]]`. */
export type HeaderList = Array<[name: string, value: string]>;

/**
 * The headers a handler returns: `[name, value]` pairs in order, repeats kept. Plain
 * `string[][]` is accepted too, because that is what TypeScript infers for
 * `[["Content-Type", "application/json"]]` in a handler written outside the `executeOnce` call;
 * an entry that is not exactly two strings makes the execution fail with a `TypeError`.
 */
export type HandlerHeaders = ReadonlyArray<readonly [name: string, value: string] | readonly string[]>;

/** The request whose fingerprint identifies the operation (same on every retry). */
export interface RequestDescription {
  /** HTTP method (compared case-insensitively). */
  method: string;
  /** Request path, hashed byte for byte (include the query string or not, consistently). */
  path: string;
  /** Body; a string is sent as UTF-8. JSON bodies are canonicalized before hashing. */
  body?: string | Uint8Array;
  /** Media type; `application/json` and `*+json` select JSON canonicalization. */
  contentType?: string;
  /** JSON Pointers of volatile fields (client timestamps, nonces) to leave out of the fingerprint. */
  ignoreFields?: string[];
}

/** What a handler returns: the HTTP response to store and replay. */
export interface HandlerResponse {
  /** HTTP status, 100..599. */
  status: number;
  /** Headers, `[name, value]` pairs replayed in this order with repeats kept. */
  headers?: HandlerHeaders;
  /** Body; a string is stored as UTF-8. */
  body?: string | Uint8Array;
  /** Pointer to a body kept elsewhere, for responses over the policy's size cap. */
  bodyRef?: string;
}

/** A stored response, as returned by {@link IdemdClient.executeOnce}. */
export interface HttpResponse {
  status: number;
  headers: HeaderList;
  body: Buffer;
  /** `""` unless the handler stored a pointer instead of the body. */
  bodyRef: string;
}

/** What the handler gets. */
export interface HandlerContext {
  endpoint: string;
  key: string;
  /** 1 for the first execution, incremented on every takeover. */
  attempt: number;
  /**
   * Aborted when the lease is lost (another caller took the key over): stop if you still can.
   * A response produced after that cannot be stored.
   */
  signal: AbortSignal;
  /** {@link downstreamKey} of this operation's key: the idempotency key for a third-party call. */
  downstreamKey(step: string): string;
}

/**
 * The side effect {@link IdemdClient.executeOnce} runs at most once per key. Annotate a handler
 * defined apart from the call with it: `const charge: Handler = async (ctx) => ({ status: 201 })`.
 */
export type Handler = (context: HandlerContext) => Promise<HandlerResponse> | HandlerResponse;

export interface ExecuteOnceOptions {
  /** Logical endpoint, e.g. `"POST /v1/payments"` (selects the server's policy). */
  endpoint: string;
  /** The client's idempotency key: 1 to 255 characters of `[A-Za-z0-9_-]`. */
  key: string;
  /** The request that identifies the operation. */
  request: RequestDescription;
  /** The side effect. Runs at most once per key; throw {@link NoSideEffectError} if nothing happened. */
  handler: Handler;
  /**
   * `"server"` (default): send the request and let idemd fingerprint it (applies the endpoint
   * policy's `ignore_fields` too). `"local"`: compute fingerprint v1 here and send the digest
   * (bodies over 1 MiB; only `request.ignoreFields` apply). Use one choice per endpoint.
   */
  fingerprint?: "server" | "local";
  /** How long to wait for an in-flight duplicate to finish, in milliseconds (default 5000). */
  maxWaitMs?: number;
  /**
   * Lease to request, in milliseconds (default: the endpoint policy's). The lease is extended
   * at half this length while the handler runs; without it, the length is estimated from the
   * server's lease expiry and the local clock.
   */
  leaseMs?: number;
  /** Dedup window to request, in milliseconds (default: the endpoint policy's). */
  ttlMs?: number;
  /** How often a Claim, Complete or Fail is retried on a transport error (default 4). */
  transportRetries?: number;
  /** Aborts the Claim and the waiting (not a running handler). */
  signal?: AbortSignal;
}

export interface ExecuteResult {
  /** The handler's response, or the stored response of an earlier execution. */
  response: HttpResponse;
  /** True when the response is a replay (HTTP front ends add `Idempotent-Replayed: true`). */
  replayed: boolean;
  /** The attempt number of the claim that ran the handler; undefined on replay. */
  attempt: number | undefined;
}

const DEFAULT_MAX_WAIT_MS = 5_000;
const DEFAULT_TRANSPORT_RETRIES = 4;
const BACKOFF_BASE_MS = 50;
const BACKOFF_CAP_MS = 1_000;
const TRANSPORT_BACKOFF_BASE_MS = 100;
const TRANSPORT_BACKOFF_CAP_MS = 2_000;
const MAX_REASON_BYTES = 1024;

/** Transport failures after which the same call is retried (with the same attempt_id). */
const RETRYABLE = new Set<GrpcStatus>([GrpcStatus.UNAVAILABLE, GrpcStatus.DEADLINE_EXCEEDED, GrpcStatus.ABORTED]);

/**
 * True when the same call may be retried. `CANCELLED` counts unless the caller aborted: the
 * executor never cancels a call itself, and idemd (tonic) answers an expired `grpc-timeout`
 * with `CANCELLED "Timeout expired"` when its timer fires before the client's.
 */
function isTransient(err: unknown, signal?: AbortSignal): boolean {
  if (!(err instanceof RpcError)) return false;
  if (RETRYABLE.has(err.code)) return true;
  return err.code === GrpcStatus.CANCELLED && !signal?.aborted;
}

/** See {@link IdemdClient.executeOnce}. */
export async function executeOnce(client: ExecutorClient, options: ExecuteOnceOptions): Promise<ExecuteResult> {
  const { endpoint, key, request, signal } = options;
  const maxWaitMs = options.maxWaitMs ?? DEFAULT_MAX_WAIT_MS;
  const retries = options.transportRetries ?? DEFAULT_TRANSPORT_RETRIES;
  const body = toBuffer(request.body);
  const claim: DeepPartial<ClaimRequest> = {
    endpoint,
    key,
    // One attempt_id per execute: a Claim retried after a lost response gets the same lease.
    attemptId: randomBytes(16).toString("base64url"),
    lease: optionalDuration(options.leaseMs),
    ttl: optionalDuration(options.ttlMs),
  };
  if ((options.fingerprint ?? "server") === "local") {
    claim.sha256 = fingerprintV1({ ...request, body });
  } else {
    claim.request = {
      method: request.method,
      path: request.path,
      body,
      contentType: request.contentType ?? "",
      ignoreFields: request.ignoreFields ?? [],
    };
  }

  const waitUntil = Date.now() + maxWaitMs;
  for (let round = 0; ; round++) {
    const response = await withTransportRetries(retries, signal, () => {
      // Server-side wait bounded by what is left of the budget (also on a transport retry).
      const remaining = Math.max(0, waitUntil - Date.now());
      return client.claim(
        { ...claim, wait: remaining > 0 ? toDuration(remaining) : undefined },
        { deadlineMs: client.deadlineMs + remaining, signal },
      );
    });
    if (response.claimed) {
      return runClaimed(client, options, response.claimed, retries);
    }
    if (response.replayed) {
      return { response: toHttpResponse(response.replayed.response), replayed: true, attempt: undefined };
    }
    if (response.mismatch) {
      throw new KeyReuseError(response.httpStatus, response.errorCode);
    }
    if (response.pending) {
      throw new OutcomePendingError(
        stateName(response.pending.state),
        response.pending.reason,
        response.httpStatus,
        response.errorCode,
      );
    }
    if (response.inProgress) {
      const retryAfterMs = durationMs(response.inProgress.retryAfter);
      const left = waitUntil - Date.now();
      if (left <= 0) {
        throw new InProgressError(
          retryAfterMs,
          response.inProgress.leaseExpiresAt,
          response.httpStatus,
          response.errorCode,
        );
      }
      // Exponential backoff with full jitter, never sooner than the server's retry_after and
      // never past the wait budget (the last Claim then runs without a wait).
      const jitter = Math.random() * Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** round);
      await sleep(Math.min(left, Math.max(retryAfterMs, jitter)), undefined, { signal });
      continue;
    }
    throw new Error("idemd answered a Claim without an outcome (newer server?)");
  }
}

async function runClaimed(
  client: ExecutorClient,
  options: ExecuteOnceOptions,
  claimed: Claimed,
  retries: number,
): Promise<ExecuteResult> {
  const { endpoint, key } = options;
  const leaseToken = claimed.leaseToken;
  const fenced = { endpoint, key, leaseToken };
  const leaseMs =
    options.leaseMs ??
    Math.max(1_000, (claimed.leaseExpiresAt?.getTime() ?? Date.now() + 60_000) - Date.now());
  const lost = new AbortController();
  const keeper = new LeaseKeeper(client, fenced, leaseMs, lost);
  keeper.start();
  // Complete and Fail are retried on a transport error until the lease ends (at least
  // `retries` times): a key is not left IN_PROGRESS because one connection went away.
  const deliver = <T>(call: () => Promise<T>): Promise<T> => withTransportRetries(retries, undefined, call, () => keeper.expiresAt);

  let stored: StoredResponse;
  try {
    const produced = await options.handler({
      endpoint,
      key,
      attempt: claimed.attempt,
      signal: lost.signal,
      downstreamKey: (step: string) => downstreamKey(key, step),
    });
    stored = toStoredResponse(produced);
  } catch (err) {
    keeper.stop();
    if (err instanceof NoSideEffectError) {
      await quietly(deliver(() => client.fail({ ...fenced, disposition: Disposition.DISPOSITION_RELEASE })));
    } else {
      // Ambiguous: the side effect may have happened. Never release.
      await quietly(deliver(() =>
        client.fail({ ...fenced, disposition: Disposition.DISPOSITION_UNKNOWN, reason: failReason(err) }),
      ));
    }
    throw err;
  }
  keeper.stop();

  try {
    await deliver(() => client.complete({ ...fenced, response: stored }));
  } catch (err) {
    // LEASE_LOST / ALREADY_COMPLETED / NOT_IN_PROGRESS: the record is someone else's now.
    // Anything else (response over the size cap, a transport that failed until the lease
    // ended, ...): the side effect happened but its response may not be stored, so the outcome
    // is recorded as unknown for reconciliation.
    if (!(err instanceof RpcError && err.code === GrpcStatus.FAILED_PRECONDITION)) {
      try {
        await deliver(() => client.fail({
          ...fenced,
          disposition: Disposition.DISPOSITION_UNKNOWN,
          reason: capReason(`the response could not be stored: ${errorText(err)}`),
        }));
      } catch (failErr) {
        // A Complete whose answer was lost did store the response (a retried Complete with the
        // same response is idempotent; Fail then finds the key completed under our lease): the
        // caller must not see a failure for a COMPLETED key.
        if (failErr instanceof RpcError && failErr.code === GrpcStatus.FAILED_PRECONDITION && failErr.reason === "ALREADY_COMPLETED") {
          return { response: toHttpResponse(stored), replayed: false, attempt: claimed.attempt };
        }
      }
    }
    throw err;
  }
  return { response: toHttpResponse(stored), replayed: false, attempt: claimed.attempt };
}

/** Extends the lease at half its length while the handler runs (the consumer helper's batches use it too). */
export class LeaseKeeper {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** When the lease ends by the local clock (measured from before the call that set it). */
  expiresAt: number;

  constructor(
    private readonly client: ExecutorClient,
    private readonly fenced: { endpoint: string; key: string; leaseToken: string },
    private readonly leaseMs: number,
    private readonly lost: AbortController,
  ) {
    this.expiresAt = Date.now() + leaseMs;
  }

  start(): void {
    this.schedule(this.leaseMs / 2);
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => void this.extend(), delayMs);
  }

  private async extend(): Promise<void> {
    const sent = Date.now();
    try {
      await this.client.extendLease(
        { ...this.fenced, lease: toDuration(this.leaseMs) },
        { deadlineMs: Math.min(this.client.deadlineMs, this.leaseMs / 2) },
      );
      this.expiresAt = Math.max(this.expiresAt, sent + this.leaseMs);
      this.schedule(this.leaseMs / 2);
    } catch (err) {
      if (this.stopped) return;
      if (isTransient(err)) {
        this.schedule(Math.min(this.leaseMs / 4, 1_000));
      } else {
        // LEASE_LOST (taken over), NOT_IN_PROGRESS, NOT_FOUND: tell the handler.
        this.stopped = true;
        this.lost.abort(err);
      }
    }
  }
}

/**
 * `call`, again on a transport error, at most `retries` times, or, with `until`, as often as it
 * takes until that time (a lease's end) once those are spent.
 */
export async function withTransportRetries<T>(
  retries: number,
  signal: AbortSignal | undefined,
  call: () => Promise<T>,
  until?: () => number,
): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      const left = until ? until() - Date.now() : 0;
      if (!isTransient(err, signal) || (attempt >= retries && left <= 0) || signal?.aborted) {
        throw err;
      }
      const capMs = Math.min(TRANSPORT_BACKOFF_CAP_MS, TRANSPORT_BACKOFF_BASE_MS * 2 ** attempt);
      const delay = Math.random() * capMs;
      await sleep(attempt >= retries ? Math.min(delay, left) : delay, undefined, { signal });
    }
  }
}

export async function quietly(promise: Promise<unknown>): Promise<void> {
  try {
    await promise;
  } catch {
    // Best effort: if Fail cannot be recorded, the lease expires and the record becomes
    // pending, which is the safe side.
  }
}

export function errorText(err: unknown): string {
  if (err instanceof Error) return err.message || err.name;
  return String(err);
}

/**
 * What a thrown value says in a stored Fail reason: `<Kind>: <message>`, the format every SDK
 * and framework middleware shares (clients/conformance/http-scenarios.md). `<Kind>` is the
 * error's `name` (`Error`, `TypeError`, or what a subclass sets), `thrown` for a value that is
 * not an Error (`throw "boom"` → `thrown: boom`).
 */
export function failureText(err: unknown): string {
  if (err instanceof Error) return `${err.name || "Error"}: ${err.message}`;
  let text: string;
  try {
    text = String(err);
  } catch {
    text = Object.prototype.toString.call(err); // e.g. an object without a prototype
  }
  return `thrown: ${text}`;
}

/**
 * A handler failure whose Fail reason is `storedReason` (capped), not the `<Kind>: <message>`
 * of the error itself: how a wrapper (the HTTP middleware) records the error it wraps, or a
 * reason of its own, without its own class name showing up in the record.
 */
export class FailWithReason extends Error {
  constructor(readonly storedReason: string) {
    super(storedReason);
  }
}

/** The Fail reason of a handler's error (the consumer helper hands it to the dead-letter hook). */
export function failReason(err: unknown): string {
  return capReason(err instanceof FailWithReason ? err.storedReason : failureText(err));
}

/** At most 1024 bytes of UTF-8 (the server's limit on a reason), cut on a character boundary. */
export function capReason(text: string): string {
  const bytes = Buffer.from(text, "utf8");
  if (bytes.length <= MAX_REASON_BYTES) return text;
  let end = MAX_REASON_BYTES;
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end).toString("utf8");
}

function toBuffer(body: string | Uint8Array | undefined): Buffer {
  if (body === undefined) return Buffer.alloc(0);
  if (typeof body === "string") return Buffer.from(body, "utf8");
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

function toStoredResponse(response: HandlerResponse): StoredResponse {
  if (
    response === null ||
    typeof response !== "object" ||
    !Number.isInteger(response.status) ||
    response.status < 100 ||
    response.status > 599
  ) {
    throw new TypeError("the handler must return a response with an integer status in 100..599");
  }
  return {
    status: response.status,
    headers: (response.headers ?? []).map(toHeader),
    body: toBuffer(response.body),
    bodyRef: response.bodyRef ?? "",
  };
}

function toHeader(header: unknown): { name: string; value: string } {
  if (!Array.isArray(header) || header.length !== 2 || !header.every((part) => typeof part === "string")) {
    throw new TypeError("the handler's headers must be [name, value] pairs of strings");
  }
  const [name, value] = header as [string, string];
  return { name, value };
}

function toHttpResponse(response: StoredResponse | undefined): HttpResponse {
  return {
    status: response?.status ?? 0,
    headers: (response?.headers ?? []).map((h): [string, string] => [h.name, h.value]),
    body: response?.body ?? Buffer.alloc(0),
    bodyRef: response?.bodyRef ?? "",
  };
}

export function stateName(state: State): string {
  return stateToJSON(state).replace(/^STATE_/, "");
}

export function optionalDuration(ms: number | undefined): Duration | undefined {
  return ms === undefined ? undefined : toDuration(ms);
}

function toDuration(ms: number): Duration {
  const whole = Math.max(0, Math.round(ms));
  return { seconds: Math.floor(whole / 1000), nanos: (whole % 1000) * 1_000_000 };
}

function durationMs(duration: Duration | undefined): number {
  if (!duration) return 0;
  return duration.seconds * 1000 + Math.floor(duration.nanos / 1_000_000);
}
