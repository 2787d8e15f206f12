/**
 * Types the client and the executor share, in a file that imports neither: `IdemdClient`'s
 * `executeOnce` runs the executor, and the executor calls the client's RPCs, so the executor
 * names the calls it needs here instead of importing the client's file.
 */
import type { Metadata } from "@grpc/grpc-js";
import type {
  ClaimBatchRequest,
  ClaimBatchResponse,
  ClaimRequest,
  CompleteBatchRequest,
  CompleteBatchResponse,
  ClaimResponse,
  CompleteRequest,
  CompleteResponse,
  DeepPartial,
  ExtendLeaseRequest,
  ExtendLeaseResponse,
  FailRequest,
  FailResponse,
} from "./gen/idemd/v1/idempotency";

/** Per-call options of the raw RPCs. */
export interface CallOptions {
  /** Deadline of this call in milliseconds (default: the client's `deadlineMs`). */
  deadlineMs?: number;
  /** Cancels the call (it then fails with `CANCELLED`). */
  signal?: AbortSignal;
  /** Extra request metadata. */
  metadata?: Metadata;
}

/**
 * The calls the executor makes, as `IdemdClient` implements them (its class declares it, so the
 * compiler keeps the two in step).
 */
export interface ExecutorClient {
  /** Default per-call deadline in milliseconds; the executor stretches it for server-side waits. */
  readonly deadlineMs: number;
  claim(request: DeepPartial<ClaimRequest>, options?: CallOptions): Promise<ClaimResponse>;
  complete(request: DeepPartial<CompleteRequest>, options?: CallOptions): Promise<CompleteResponse>;
  fail(request: DeepPartial<FailRequest>, options?: CallOptions): Promise<FailResponse>;
  extendLease(request: DeepPartial<ExtendLeaseRequest>, options?: CallOptions): Promise<ExtendLeaseResponse>;
  /** The batch RPCs of the consumer helper's `processBatch`; without them it processes message by message. */
  claimBatch?(request: DeepPartial<ClaimBatchRequest>, options?: CallOptions): Promise<ClaimBatchResponse>;
  completeBatch?(request: DeepPartial<CompleteBatchRequest>, options?: CallOptions): Promise<CompleteBatchResponse>;
}
