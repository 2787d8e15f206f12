/**
 * The errors of the idemd client.
 *
 * The executor's outcomes that an HTTP front end must answer with an error status each have
 * their own class carrying `httpStatus` and `errorCode` (as reported by idemd):
 * {@link KeyReuseError} (422), {@link OutcomePendingError} (409) and {@link InProgressError}
 * (409). A failed RPC is an {@link RpcError}. A handler marks "failed before any side effect"
 * with {@link NoSideEffectError} (or {@link noSideEffect}).
 */
import { Metadata, status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";
import { decodeStatusDetails, type FieldViolation } from "./rpc-status";

/** Base class of the executor's refusals that map to an HTTP error answer. */
export abstract class IdempotencyError extends Error {
  /** What an HTTP front end should answer (422 or 409). */
  abstract readonly httpStatus: number;
  /** `idempotency_key_reuse`, `outcome_pending` or `request_in_progress`. */
  abstract readonly errorCode: string;
}

/**
 * The key was used before with a different request (HTTP 422 `idempotency_key_reuse`).
 * Permanent for this key: never retried.
 */
export class KeyReuseError extends IdempotencyError {
  override readonly name = "KeyReuseError";
  readonly httpStatus: number;
  readonly errorCode: string;
  constructor(httpStatus = 422, errorCode = "idempotency_key_reuse") {
    super("the idempotency key was already used with a different request");
    this.httpStatus = httpStatus || 422;
    this.errorCode = errorCode || "idempotency_key_reuse";
  }
}

/**
 * The outcome of an earlier execution of this key is undecided (HTTP 409 `outcome_pending`):
 * it needs reconciliation (Reconcile), never a re-execution.
 */
export class OutcomePendingError extends IdempotencyError {
  override readonly name = "OutcomePendingError";
  readonly httpStatus: number;
  readonly errorCode: string;
  constructor(
    /** `IN_PROGRESS` (lease expired), `UNKNOWN` or `FAILED`. */
    readonly state: string,
    /** Why the record is pending (the Fail reason, or the expired lease). */
    readonly reason: string,
    httpStatus = 409,
    errorCode = "outcome_pending",
  ) {
    super(`the outcome of an earlier execution is pending (${state}); it must be reconciled`);
    this.httpStatus = httpStatus || 409;
    this.errorCode = errorCode || "outcome_pending";
  }
}

/**
 * Another execution still holds the key after the wait budget was spent
 * (HTTP 409 `request_in_progress`; answer with `Retry-After`).
 */
export class InProgressError extends IdempotencyError {
  override readonly name = "InProgressError";
  readonly httpStatus: number;
  readonly errorCode: string;
  constructor(
    /** The server's hint for when to retry, in milliseconds. */
    readonly retryAfterMs: number,
    /** When the holder's lease runs out, if known. */
    readonly leaseExpiresAt: Date | undefined,
    httpStatus = 409,
    errorCode = "request_in_progress",
  ) {
    super("another execution of this idempotency key is still in progress");
    this.httpStatus = httpStatus || 409;
    this.errorCode = errorCode || "request_in_progress";
  }

  /** `Retry-After` header value: whole seconds, at least 1. */
  get retryAfterSeconds(): number {
    return Math.max(1, Math.ceil(this.retryAfterMs / 1000));
  }
}

/**
 * Thrown (or wrapped with {@link noSideEffect}) by a handler that failed before any side
 * effect happened: the executor releases the key (Fail RELEASE) so that a retry executes
 * again, then rethrows this error. Any other handler error is treated as ambiguous
 * (Fail UNKNOWN): the key then needs reconciliation.
 */
export class NoSideEffectError extends Error {
  override readonly name: string = "NoSideEffectError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** Marks `err` as "failed before any side effect" (see {@link NoSideEffectError}). */
export function noSideEffect(err: unknown): NoSideEffectError {
  if (err instanceof NoSideEffectError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new NoSideEffectError(message, { cause: err });
}

/** True when `err` is marked as "failed before any side effect". */
export function isNoSideEffect(err: unknown): boolean {
  return err instanceof NoSideEffectError;
}

/** A failed idemd RPC: the gRPC status plus idemd's `ErrorInfo` / `BadRequest` details. */
export class RpcError extends Error {
  override readonly name = "RpcError";
  /** Numeric gRPC status code (`status.NOT_FOUND`, ...). */
  readonly code: GrpcStatus;
  /** The code's name, e.g. `FAILED_PRECONDITION`. */
  readonly codeName: string;
  /** The server's message. */
  readonly details: string;
  /** `google.rpc.ErrorInfo` reason, e.g. `LEASE_LOST`, `OUTCOME_UNKNOWN`. */
  readonly reason: string | undefined;
  /** `google.rpc.ErrorInfo` domain. */
  readonly domain: string | undefined;
  /** `google.rpc.ErrorInfo` metadata. */
  readonly errorMetadata: Readonly<Record<string, string>>;
  /** `google.rpc.BadRequest` field violations (which request field was refused). */
  readonly fieldViolations: readonly FieldViolation[];
  /** The response trailers. */
  readonly metadata: Metadata;

  constructor(code: GrpcStatus, details: string, metadata: Metadata = new Metadata(), options?: { cause?: unknown }) {
    const codeName = GrpcStatus[code] ?? `CODE_${code}`;
    super(`${codeName}: ${details}`, options);
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.metadata = metadata;
    const decoded = decodeStatusDetails(metadata);
    this.reason = decoded.errorInfo?.reason;
    this.domain = decoded.errorInfo?.domain;
    this.errorMetadata = decoded.errorInfo?.metadata ?? {};
    this.fieldViolations = decoded.fieldViolations;
  }

  /** Wraps a grpc-js `ServiceError`. */
  static fromServiceError(err: ServiceError): RpcError {
    return new RpcError(err.code, err.details, err.metadata ?? new Metadata(), { cause: err });
  }
}
