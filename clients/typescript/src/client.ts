import { readFileSync } from "node:fs";
import {
  credentials as grpcCredentials,
  Metadata,
  status as GrpcStatus,
  type CallOptions as GrpcCallOptions,
  type ChannelCredentials,
  type ChannelOptions,
  type ClientUnaryCall,
  type ServiceError,
} from "@grpc/grpc-js";
import { RpcError } from "./errors";
import { H2Transport } from "./h2";
import { Http2Transport, parseTarget } from "./transport";
import { executeOnce, type ExecuteOnceOptions, type ExecuteResult } from "./executor";
import {
  ClaimRequest,
  CompleteRequest,
  ExtendLeaseRequest,
  FailRequest,
  IdempotencyClient as GeneratedIdempotencyClient,
  IdempotencyService,
  ListPendingRequest,
  LookupRequest,
  ReconcileRequest,
  ClaimResponse,
  CompleteResponse,
  ExtendLeaseResponse,
  FailResponse,
  ListPendingResponse,
  LookupResponse,
  ReconcileResponse,
  type DeepPartial,
  type MessageFns,
} from "./gen/idemd/v1/idempotency";
import type { CallOptions, ExecutorClient } from "./types";

/** TLS settings of the connection to idemd. */
export interface TlsOptions {
  /** PEM file of the CA that signed idemd's certificate (default: the system roots). */
  caFile?: string;
  /** PEM of that CA, given directly. */
  ca?: string | Buffer;
  /** Expected name in the server certificate, when it differs from the address's host. */
  serverNameOverride?: string;
  /**
   * PEM file of the client certificate (chain) presented to an idemd that requires client
   * certificates (mTLS, `--tls-client-ca`); its tenant then comes from the certificate.
   * Needs `keyFile` or `key`.
   */
  certFile?: string;
  /** PEM of that client certificate (chain), given directly. Needs `keyFile` or `key`. */
  cert?: string | Buffer;
  /** PEM file of the client certificate's private key. Needs `certFile` or `cert`. */
  keyFile?: string;
  /** PEM of that private key, given directly. Needs `certFile` or `cert`. */
  key?: string | Buffer;
}

export interface IdemdClientOptions {
  /** `host:port` of idemd (any target grpc-js accepts, e.g. `dns:///idemd.internal:50051`). */
  address: string;
  /** Bearer token, sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  /**
   * Tenant for a development server that runs without authentication (`x-tenant-id`).
   * Ignored by a server with a tokens file.
   */
  tenantId?: string;
  /**
   * `true` (default): TLS with the system roots; an object: TLS with those settings;
   * `false`: plaintext (local development, or a sidecar that terminates TLS).
   */
  tls?: boolean | TlsOptions;
  /** Default deadline of every call, in milliseconds (default 10 000). */
  deadlineMs?: number;
  /**
   * Extra grpc-js channel options. Setting them makes `"grpc-js"` the default `transport`, so
   * that they apply to the RPCs too.
   */
  channelOptions?: ChannelOptions;
  /**
   * What carries the RPCs. `"http2"` (the default): the SDK's own unary gRPC transport, HTTP/2
   * framed by the SDK on one socket per client (src/h2.ts), a third of the CPU of a grpc-js call
   * and the fastest path for the executor and the middleware. `"node-http2"`: the same gRPC over
   * one `node:http2` session per client (about half of grpc-js's CPU), should the SDK's framing
   * and a server or proxy disagree. `"grpc-js"`: the grpc-js channel of {@link IdemdClient.raw}
   * (its channel options, name resolvers and proxy support); also the default when
   * `channelOptions` are set or the address is not `host:port` / `dns:///host:port`.
   */
  transport?: "http2" | "node-http2" | "grpc-js";
}

const DEFAULT_DEADLINE_MS = 10_000;
const USER_AGENT = "idemd-typescript/0.1.0";

/**
 * A client of idemd: the raw RPCs (promises of the generated message types; failures reject
 * with {@link RpcError}) and the {@link IdemdClient.executeOnce} helper.
 */
export class IdemdClient implements ExecutorClient {
  /** The generated grpc-js client, for anything not wrapped here (streams of future versions). */
  readonly raw: GeneratedIdempotencyClient;
  /** Default per-call deadline in milliseconds. */
  readonly deadlineMs: number;
  private readonly token: string | undefined;
  private readonly tenantId: string | undefined;
  /** The SDK's own transport (its framing or node:http2), or undefined when the RPCs go through grpc-js. */
  private readonly http2: H2Transport | Http2Transport | undefined;

  constructor(options: IdemdClientOptions) {
    if (!options.address) throw new TypeError("IdemdClient: address is required");
    this.deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    this.token = options.token;
    this.tenantId = options.tenantId;
    const tls = options.tls ?? true;
    const channelOptions: ChannelOptions = { "grpc.primary_user_agent": USER_AGENT, ...options.channelOptions };
    if (typeof tls === "object" && tls.serverNameOverride) {
      channelOptions["grpc.ssl_target_name_override"] = tls.serverNameOverride;
      channelOptions["grpc.default_authority"] = tls.serverNameOverride;
    }
    const pems = tlsPems(tls);
    // grpc-js connects on its first call only, so an unused `raw` costs no connection.
    this.raw = new GeneratedIdempotencyClient(options.address, channelCredentials(tls, pems), channelOptions);
    const transport = options.transport ?? (options.channelOptions === undefined ? "http2" : "grpc-js");
    const target = parseTarget(options.address);
    if ((transport === "http2" || transport === "node-http2") && target !== undefined) {
      const headers: Record<string, string> = {
        "content-type": "application/grpc",
        te: "trailers",
        "user-agent": USER_AGENT,
      };
      if (this.token !== undefined) headers.authorization = `Bearer ${this.token}`;
      if (this.tenantId !== undefined) headers["x-tenant-id"] = this.tenantId;
      this.http2 = new (transport === "http2" ? H2Transport : Http2Transport)({
        target,
        tls: tls === false ? undefined : {
          ...(pems?.ca ? { ca: pems.ca } : {}),
          ...(pems?.cert && pems.key ? { cert: pems.cert, key: pems.key } : {}),
        },
        serverNameOverride: typeof tls === "object" ? tls.serverNameOverride : undefined,
      }, headers);
    } else if (options.transport === "http2" || options.transport === "node-http2") {
      throw new TypeError(`IdemdClient: the ${transport} transport dials host:port or dns:///host:port, not ${options.address}`);
    }
  }

  /** Claims a key for one execution, or reports what happened to an earlier claim. */
  claim(request: DeepPartial<ClaimRequest>, options?: CallOptions): Promise<ClaimResponse> {
    const message = ClaimRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.claim.path, ClaimRequest, ClaimResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.claim(message, md, co, cb));
  }

  /** Stores the response of a claimed execution (fenced by the lease token). */
  complete(request: DeepPartial<CompleteRequest>, options?: CallOptions): Promise<CompleteResponse> {
    const message = CompleteRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.complete.path, CompleteRequest, CompleteResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.complete(message, md, co, cb));
  }

  /** Ends a claimed execution without a response: RELEASE, UNKNOWN or FAILED. */
  fail(request: DeepPartial<FailRequest>, options?: CallOptions): Promise<FailResponse> {
    const message = FailRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.fail.path, FailRequest, FailResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.fail(message, md, co, cb));
  }

  /** Pushes the lease of a long-running execution out. */
  extendLease(request: DeepPartial<ExtendLeaseRequest>, options?: CallOptions): Promise<ExtendLeaseResponse> {
    const message = ExtendLeaseRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.extendLease.path, ExtendLeaseRequest, ExtendLeaseResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.extendLease(message, md, co, cb));
  }

  /** Reads one record (`NOT_FOUND` when absent or expired). */
  lookup(request: DeepPartial<LookupRequest>, options?: CallOptions): Promise<LookupResponse> {
    const message = LookupRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.lookup.path, LookupRequest, LookupResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.lookup(message, md, co, cb));
  }

  /** Lists the records that need a decision (expired leases, UNKNOWN, FAILED). */
  listPending(request: DeepPartial<ListPendingRequest> = {}, options?: CallOptions): Promise<ListPendingResponse> {
    const message = ListPendingRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.listPending.path, ListPendingRequest, ListPendingResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.listPending(message, md, co, cb));
  }

  /** Decides a pending record: committed, released, failed or taken over. */
  reconcile(request: DeepPartial<ReconcileRequest>, options?: CallOptions): Promise<ReconcileResponse> {
    const message = ReconcileRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.reconcile.path, ReconcileRequest, ReconcileResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.reconcile(message, md, co, cb));
  }

  /**
   * Runs `handler` at most once per (endpoint, key), across retries, processes and machines,
   * and returns its response, or the stored response of an earlier execution
   * (`replayed: true`). See {@link ExecuteOnceOptions} and docs/sdk.md.
   */
  executeOnce(options: ExecuteOnceOptions): Promise<ExecuteResult> {
    return executeOnce(this, options);
  }

  /** Closes the connection. Calls in flight fail with `CANCELLED`/`UNAVAILABLE`. */
  close(): void {
    this.http2?.close();
    this.raw.close();
  }

  /** One RPC over the http2 transport, with the same errors and options as over grpc-js. */
  private async call<Req, Res>(
    path: string,
    requestType: MessageFns<Req>,
    responseType: MessageFns<Res>,
    message: Req,
    options: CallOptions | undefined,
  ): Promise<Res> {
    const signal = options?.signal;
    if (signal?.aborted) throw signal.reason ?? new Error("aborted");
    const bytes = await this.http2!.unary({
      path,
      body: requestType.encode(message).finish(),
      deadlineMs: options?.deadlineMs ?? this.deadlineMs,
      signal,
      metadata: options?.metadata,
    });
    try {
      return responseType.decode(bytes);
    } catch (err) {
      throw new RpcError(GrpcStatus.INTERNAL, `Response message parsing error: ${err instanceof Error ? err.message : String(err)}`, new Metadata(), { cause: err });
    }
  }

  private callMetadata(extra?: Metadata): Metadata {
    const md = new Metadata();
    if (this.token !== undefined) md.set("authorization", `Bearer ${this.token}`);
    if (this.tenantId !== undefined) md.set("x-tenant-id", this.tenantId);
    if (extra) md.merge(extra);
    return md;
  }

  private unary<Res>(
    options: CallOptions | undefined,
    start: (
      metadata: Metadata,
      callOptions: Partial<GrpcCallOptions>,
      callback: (error: ServiceError | null, response: Res) => void,
    ) => ClientUnaryCall,
  ): Promise<Res> {
    const signal = options?.signal;
    if (signal?.aborted) {
      return Promise.reject(signal.reason ?? new Error("aborted"));
    }
    return new Promise<Res>((resolve, reject) => {
      const deadline = new Date(Date.now() + (options?.deadlineMs ?? this.deadlineMs));
      const onAbort = (): void => call.cancel();
      const call = start(this.callMetadata(options?.metadata), { deadline }, (error, response) => {
        signal?.removeEventListener("abort", onAbort);
        if (error) reject(RpcError.fromServiceError(error));
        else resolve(response);
      });
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}

interface Pems {
  ca: Buffer | null;
  cert: Buffer | null;
  key: Buffer | null;
}

/** The PEMs of a `tls` object, read once (undefined for `true` / `false`). */
function tlsPems(tls: boolean | TlsOptions): Pems | undefined {
  if (typeof tls !== "object") return undefined;
  const ca = pem(tls.ca, tls.caFile);
  const cert = pem(tls.cert, tls.certFile);
  const key = pem(tls.key, tls.keyFile);
  // grpc-js refuses this too, but in its own terms (private key / certificate chain): name the
  // options the user actually set.
  if ((cert === null) !== (key === null)) {
    throw new TypeError(
      "IdemdClient: tls client certificate and key go together: set cert/certFile and key/keyFile, or neither",
    );
  }
  return { ca, cert, key };
}

function channelCredentials(tls: boolean | TlsOptions, pems: Pems | undefined): ChannelCredentials {
  if (tls === false) return grpcCredentials.createInsecure();
  if (pems === undefined) return grpcCredentials.createSsl();
  return grpcCredentials.createSsl(pems.ca, pems.key, pems.cert);
}

function pem(direct: string | Buffer | undefined, file: string | undefined): Buffer | null {
  if (direct !== undefined) return Buffer.from(direct);
  return file !== undefined ? readFileSync(file) : null;
}
