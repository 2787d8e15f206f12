/**
 * @idemd/client: TypeScript client of idemd, idempotency keys as a service.
 *
 * - {@link IdemdClient}: the raw RPCs (generated from proto/idemd/v1/idempotency.proto) and
 *   {@link IdemdClient.executeOnce}, the executor of docs/sdk.md.
 * - {@link fingerprintV1}: the request fingerprint, computed locally.
 * - {@link downstreamKey}: idempotency keys for third-party calls made by a handler.
 * - {@link onceConsumer}: the executor around a message consumer's per-message handler.
 */
export { IdemdClient } from "./client";
export type { IdemdClientOptions, TlsOptions } from "./client";
export type { CallOptions } from "./types";
export { executeOnce } from "./executor";
export type {
  ExecuteOnceOptions,
  ExecuteResult,
  Handler,
  HandlerContext,
  HandlerHeaders,
  HandlerResponse,
  HeaderList,
  HttpResponse,
  RequestDescription,
} from "./executor";
export {
  IdempotencyError,
  InProgressError,
  isNoSideEffect,
  KeyReuseError,
  NoSideEffectError,
  noSideEffect,
  OutcomePendingError,
  RpcError,
} from "./errors";
export { canonicalBody, FingerprintError, fingerprintV1, isJsonMediaType } from "./fingerprint";
export type { FingerprintErrorClass, FingerprintInput } from "./fingerprint";
export { downstreamKey } from "./downstream";
export type { ErrorInfo, FieldViolation } from "./rpc-status";
export { status as GrpcStatus } from "@grpc/grpc-js";
/** The generated message types and service definition of idemd.v1. */
export * as v1 from "./gen/idemd/v1/idempotency";
export { parseKey, Routes, DEFAULT_STORE_HEADERS } from "./http";
export type { Answer, IdempotencyOptions, Logger, RouteOptions } from "./http";
export { idempotency, idempotencyErrors } from "./express";
export { idempotencyPlugin } from "./fastify";
export type { FastifyIdempotencyOptions } from "./fastify";
export { withIdempotency } from "./fetch";
export { DEFAULT_CONSUMER_LEASE_MS, DEFAULT_PARALLELISM, MissingKeyError, messageKey, onceConsumer, Ordering, Outcome } from "./message-consumer";
export type {
  BatchOptions,
  ConsumedMessage,
  DeadLetter,
  DeadLetterKind,
  KeySource,
  MessageHandler,
  MessageHeaderValue,
  MessageProcessor,
  OnceConsumerOptions,
  Processed,
} from "./message-consumer";
export type { FetchHandler } from "./fetch";
