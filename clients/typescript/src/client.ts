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
import { Http2Transport, parseTarget, proxyFor } from "./transport";
import { executeOnce, type ExecuteOnceOptions, type ExecuteResult } from "./executor";
import {
  ClaimBatchRequest,
  ClaimBatchResponse,
  ClaimRequest,
  CompleteBatchRequest,
  CompleteBatchResponse,
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
   * What carries the RPCs. `"node-http2"` (the default; `"http2"` is the same, the name of the
   * default before issue 51): the SDK's unary gRPC over one `node:http2` session per client
   * (Node's nghttp2 does the HTTP/2), which waits for the server's SETTINGS, keeps to its stream
   * limit and moves the calls a server or proxy never took (REFUSED_STREAM, above a GOAWAY's
   * last stream) to a new connection; about half of grpc-js's CPU per call. `"grpc-js"`: the
   * grpc-js channel of {@link IdemdClient.raw} (its channel options and name resolvers); also the
   * default when `channelOptions` are set or the address is not `host:port` / `dns:///host:port`.
   */
  transport?: "node-http2" | "http2" | "grpc-js";
  /**
   * HTTP CONNECT proxy of the `node-http2` transport, `http://[user:password@]host:port`; `false`:
   * none. Default, as grpc-js: `grpc_proxy`, `https_proxy` or `http_proxy` from the environment,
   * unless the address's host is in `no_grpc_proxy` / `no_proxy`. (grpc-js reads only the
   * environment: with `transport: "grpc-js"` a URL here is refused, `false` turns its proxy off.)
   */
  proxy?: string | false;
  /**
   * Interval of keepalive PINGs on the open connection, in ms (default: none). A connection whose
   * PING is not answered within `keepaliveTimeoutMs` is closed and the next call reconnects; with
   * grpc-js these are `grpc.keepalive_time_ms` / `grpc.keepalive_timeout_ms`, PINGs without calls allowed.
   */
  keepaliveMs?: number;
  /** How long a keepalive PING may go unanswered (default 20 000 ms). */
  keepaliveTimeoutMs?: number;
}

const DEFAULT_DEADLINE_MS = 10_000;
/**
 * Test hook (not API): `{ [TRANSPORT_FIX]: false }` in the options turns off what the node-http2
 * transport does for proxies (wait for SETTINGS, move calls never taken), for the proxy matrix's
 * test of its own check.
 */
export const TRANSPORT_FIX = Symbol.for("idemd.transportFix");
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
  /** The node:http2 transport, or undefined when the RPCs go through grpc-js. */
  private readonly http2: Http2Transport | undefined;

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
    if (options.keepaliveMs) {
      channelOptions["grpc.keepalive_time_ms"] ??= options.keepaliveMs;
      channelOptions["grpc.keepalive_timeout_ms"] ??= options.keepaliveTimeoutMs ?? 20_000;
      channelOptions["grpc.keepalive_permit_without_calls"] ??= 1;
    }
    if (options.proxy === false) channelOptions["grpc.enable_http_proxy"] = 0;
    const pems = tlsPems(tls);
    // grpc-js connects on its first call only, so an unused `raw` costs no connection.
    this.raw = new GeneratedIdempotencyClient(options.address, channelCredentials(tls, pems), channelOptions);
    const transport = options.transport ?? (options.channelOptions === undefined ? "node-http2" : "grpc-js");
    const target = parseTarget(options.address);
    if ((transport === "http2" || transport === "node-http2") && target !== undefined) {
      const headers: Record<string, string> = {
        "content-type": "application/grpc",
        te: "trailers",
        "user-agent": USER_AGENT,
      };
      if (this.token !== undefined) headers.authorization = `Bearer ${this.token}`;
      if (this.tenantId !== undefined) headers["x-tenant-id"] = this.tenantId;
      this.http2 = new Http2Transport({
        target,
        tls: tls === false ? undefined : {
          ...(pems?.ca ? { ca: pems.ca } : {}),
          ...(pems?.cert && pems.key ? { cert: pems.cert, key: pems.key } : {}),
        },
        serverNameOverride: typeof tls === "object" ? tls.serverNameOverride : undefined,
        proxy: proxyFor(target.host, options.proxy),
        keepaliveMs: options.keepaliveMs,
        keepaliveTimeoutMs: options.keepaliveTimeoutMs,
        robust: (options as { [TRANSPORT_FIX]?: boolean })[TRANSPORT_FIX],
      }, headers);
    } else if (options.transport === "http2" || options.transport === "node-http2") {
      throw new TypeError(`IdemdClient: the ${transport} transport dials host:port or dns:///host:port, not ${options.address}`);
    } else if (typeof options.proxy === "string") {
      throw new TypeError("IdemdClient: grpc-js takes its proxy from grpc_proxy / https_proxy only; set that, or use the node-http2 transport");
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

  /**
   * Claim for up to 500 keys of one endpoint in one call (an item's empty endpoint is the
   * batch's); each item is answered as {@link IdemdClient.claim} would answer it alone (a
   * response or an item error), in order. `UNIMPLEMENTED` from a server older than this RPC.
   */
  claimBatch(request: DeepPartial<ClaimBatchRequest>, options?: CallOptions): Promise<ClaimBatchResponse> {
    const message = ClaimBatchRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.claimBatch.path, ClaimBatchRequest, ClaimBatchResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.claimBatch(message, md, co, cb));
  }

  /** Complete for up to 500 claimed keys of one endpoint in one call, answered per item, in order. */
  completeBatch(request: DeepPartial<CompleteBatchRequest>, options?: CallOptions): Promise<CompleteBatchResponse> {
    const message = CompleteBatchRequest.fromPartial(request);
    if (this.http2) return this.call(IdempotencyService.completeBatch.path, CompleteBatchRequest, CompleteBatchResponse, message, options);
    return this.unary(options, (md, co, cb) => this.raw.completeBatch(message, md, co, cb));
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
    const deadline = new Date(Date.now() + (options?.deadlineMs ?? this.deadlineMs));
    const attempt = (moves: number): Promise<Res> => new Promise<Res>((resolve, reject) => {
      const onAbort = (): void => call.cancel();
      const call = start(this.callMetadata(options?.metadata), { deadline }, (error, response) => {
        signal?.removeEventListener("abort", onAbort);
        if (!error) resolve(response);
        // A stream the server refused (RST_STREAM REFUSED_STREAM, or above a GOAWAY's last
        // stream: nghttp2 closes those with that code) was never processed. grpc-js sends such
        // a call again once; through a proxy that sends GOAWAY every few requests that is not
        // enough, so the call goes again, as the node-http2 transport does, within its deadline.
        else if (isRefused(error) && moves < MAX_REFUSED_MOVES && Date.now() < deadline.getTime() && !signal?.aborted) {
          resolve(attempt(moves + 1));
        } else reject(RpcError.fromServiceError(error));
      });
      signal?.addEventListener("abort", onAbort, { once: true });
    });
    return attempt(0);
  }
}

/** How often a grpc-js call refused by the server is sent again. */
const MAX_REFUSED_MOVES = 100;

/** grpc-js's report of a stream the server refused (RST_STREAM REFUSED_STREAM), never processed. */
function isRefused(error: ServiceError): boolean {
  return error.code === GrpcStatus.UNAVAILABLE && error.details === "Stream refused by server";
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
