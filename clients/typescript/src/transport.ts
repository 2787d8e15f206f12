/**
 * The client's `"node-http2"` unary gRPC transport: one `node:http2` session per client, one
 * stream per call. The default is h2.ts (the same gRPC, HTTP/2 framed by the SDK, for about two
 * thirds of this one's CPU per call); this one stays as the fallback, and holds the gRPC parts
 * both share (status and error mapping, grpc-timeout, the receive limit).
 *
 * Why not grpc-js for these calls: every idemd RPC is unary, and grpc-js spends 0.3–0.5 ms of
 * CPU per call in its channel, resolver, load-balancing and filter stack (a Claim + Complete pair
 * took 2.1–2.6 ms from Node against ~1.0 ms from Go on the same idemd) where the same bytes over
 * bare `node:http2` cost 0.15–0.19 ms. The middleware makes that pair on every fresh key, so it
 * is what a request pays. grpc-js stays as `IdemdClient.raw` and as the `transport: "grpc-js"`
 * option (for its channel options, name resolution and proxies).
 *
 * What this keeps of gRPC over HTTP/2 (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md):
 * length-prefixed messages, `content-type: application/grpc`, `te: trailers`, `grpc-timeout`
 * from the deadline, the status from the trailers or from a trailers-only response, the
 * percent-encoded `grpc-message`, `-bin` metadata, and the same status codes grpc-js reports for
 * HTTP errors, stream resets and dropped connections.
 */
import * as http2 from "node:http2";
import * as net from "node:net";
import * as tls from "node:tls";
import { Metadata, status as GrpcStatus } from "@grpc/grpc-js";
import { RpcError } from "./errors";

/** Where to connect: `host:port`, `[v6]:port` or `dns:///host:port` (port 443 when absent). */
export interface Http2Target {
  host: string;
  port: number;
}

/** The target of a grpc-js address this transport can dial, or undefined (then grpc-js does). */
export function parseTarget(address: string): Http2Target | undefined {
  let rest = address;
  if (rest.startsWith("dns:///")) rest = rest.slice("dns:///".length);
  else if (rest.startsWith("dns:")) rest = rest.slice("dns:".length);
  if (rest === "" || rest.includes("/")) return undefined;
  let host: string;
  let port = "443";
  const v6 = /^\[([^\]]+)\](?::(\d+))?$/.exec(rest);
  if (v6) {
    host = v6[1]!;
    port = v6[2] ?? port;
  } else if (rest.split(":").length === 2) {
    [host, port] = rest.split(":") as [string, string];
  } else if (!rest.includes(":")) {
    host = rest;
  } else {
    return undefined; // a scheme (unix:, ipv4:, ...) or a bare IPv6 address: grpc-js knows them
  }
  const n = Number(port);
  if (host === "" || !/^\d+$/.test(port) || n < 1 || n > 65535) return undefined;
  return { host, port: n };
}

export interface Http2TransportOptions {
  target: Http2Target;
  /** TLS settings for `tls.connect` (ca, cert, key); undefined: plaintext. */
  tls: tls.ConnectionOptions | undefined;
  /** Name the server certificate must carry and `:authority`, when not the target's host. */
  serverNameOverride?: string;
}

/** grpc-js's default receive limit, kept so that a response it would refuse is refused here too. */
export const MAX_RECEIVE_BYTES = 4 * 1024 * 1024;
/**
 * Flow-control window of the session and of each stream: a replayed body of a few hundred KiB
 * then arrives in one round trip rather than one per 64 KiB (HTTP/2's default window).
 */
export const WINDOW_BYTES = 4 * 1024 * 1024;
/** setTimeout's largest delay; a longer deadline re-arms the timer. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Response headers or trailers, one string per name (an array when repeated). */
export type ResponseHeaders = Record<string, string | string[] | undefined>;

/** Per-call inputs, resolved by the client (deadline already defaulted). */
export interface UnaryCall {
  path: string;
  body: Uint8Array;
  deadlineMs: number;
  signal?: AbortSignal;
  metadata?: Metadata;
}

export class Http2Transport {
  private session: http2.ClientHttp2Session | undefined;
  private closed = false;
  private readonly authority: string;
  private readonly scheme: "http" | "https";

  constructor(private readonly options: Http2TransportOptions, private readonly baseHeaders: http2.OutgoingHttpHeaders) {
    const { host, port } = options.target;
    this.authority = options.serverNameOverride ?? (net.isIPv6(host) ? `[${host}]:${port}` : `${host}:${port}`);
    this.scheme = options.tls ? "https" : "http";
  }

  /** Sends one request message and resolves to the response message's bytes. */
  unary(call: UnaryCall): Promise<Uint8Array> {
    return new Promise<Uint8Array>((resolve, reject) => {
      const deadline = Date.now() + call.deadlineMs;
      let stream: http2.ClientHttp2Stream;
      try {
        stream = this.request(call, deadline);
      } catch (err) {
        reject(new RpcError(GrpcStatus.UNAVAILABLE, errorText(err), new Metadata(), { cause: err }));
        return;
      }
      const session = stream.session!;
      const chunks: Buffer[] = [];
      let received = 0;
      let httpStatus = 0;
      let statusHeaders: http2.IncomingHttpHeaders | undefined;
      let streamError: Error | undefined;
      let settled = false;
      let unwatch: (() => void) | undefined;

      const finish = (error: RpcError | undefined, message?: Uint8Array): void => {
        if (settled) return;
        settled = true;
        unwatch?.();
        if (error) reject(error);
        else resolve(message!);
      };
      // Ends the call locally with `code` and resets the stream so that the server stops too.
      const cancel = (code: GrpcStatus, details: string): void => {
        finish(new RpcError(code, details));
        if (!stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
      };
      unwatch = watchCall(deadline, call.signal, cancel);

      stream.on("response", (headers) => {
        httpStatus = Number(headers[":status"]);
        if (headers["grpc-status"] !== undefined) statusHeaders = headers; // trailers-only
      });
      stream.on("trailers", (trailers) => {
        statusHeaders = trailers;
      });
      stream.on("data", (chunk: Buffer) => {
        received += chunk.length;
        if (received > MAX_RECEIVE_BYTES + 5) {
          cancel(GrpcStatus.RESOURCE_EXHAUSTED, `Received message larger than max (${received - 5} vs. ${MAX_RECEIVE_BYTES})`);
          return;
        }
        chunks.push(chunk);
      });
      stream.on("error", (err) => {
        streamError = err;
      });
      stream.on("close", () => {
        if (settled) return;
        if (statusHeaders) {
          const error = statusError(statusHeaders);
          if (error) finish(error);
          else finish(...responseMessage(chunks, received, statusHeaders));
        } else if (httpStatus !== 0 && httpStatus !== 200) {
          finish(new RpcError(...httpStatusCode(httpStatus)));
        } else {
          finish(resetError(stream.rstCode, streamError, session.destroyed || session.closed));
        }
      });
    });
  }

  /** Closes the session; calls in flight end with `UNAVAILABLE`, later calls fail likewise. */
  close(): void {
    this.closed = true;
    this.session?.destroy();
    this.session = undefined;
  }

  private request(call: UnaryCall, deadline: number): http2.ClientHttp2Stream {
    if (this.closed) throw new Error("the client was closed");
    const headers: http2.OutgoingHttpHeaders = {
      ...(call.metadata ? call.metadata.toHttp2Headers() : undefined),
      ...this.baseHeaders,
      ":method": "POST",
      ":path": call.path,
      ":authority": this.authority,
      "grpc-timeout": grpcTimeout(deadline - Date.now()),
    };
    const frame = Buffer.allocUnsafe(5 + call.body.length);
    frame[0] = 0; // not compressed
    frame.writeUInt32BE(call.body.length, 1);
    frame.set(call.body, 5);
    let stream: http2.ClientHttp2Stream;
    try {
      stream = this.connection().request(headers, { endStream: false });
    } catch {
      // The session went away (GOAWAY, closed socket) before its "close" event reached us:
      // one new session, once.
      this.dropSession();
      stream = this.connection().request(headers, { endStream: false });
    }
    stream.end(frame);
    return stream;
  }

  /** The shared session, connecting when there is none or the last one went away. */
  private connection(): http2.ClientHttp2Session {
    const current = this.session;
    if (current && !current.closed && !current.destroyed) return current;
    const session = http2.connect(`${this.scheme}://${this.authority}`, {
      settings: { enablePush: false, initialWindowSize: WINDOW_BYTES },
      createConnection: () => dial(this.options),
    });
    // Failures reach the calls through their streams; without a listener an "error" would throw.
    session.on("error", () => {});
    session.once("connect", () => session.setLocalWindowSize(WINDOW_BYTES));
    session.once("goaway", () => this.dropSession(session));
    session.once("close", () => this.dropSession(session));
    // An idle client must not keep the process alive; a call in flight does through its timer.
    session.unref();
    this.session = session;
    return session;
  }

  private dropSession(session: http2.ClientHttp2Session | undefined = this.session): void {
    if (session !== undefined && this.session === session) this.session = undefined;
  }
}

/**
 * Calls `cancel` at `deadline` (DEADLINE_EXCEEDED) or when `signal` aborts
 * (CANCELLED), whichever comes first, once; returns what stops watching.
 */
export function watchCall(deadline: number, signal: AbortSignal | undefined, cancel: (code: GrpcStatus, details: string) => void): () => void {
  let timer: NodeJS.Timeout | undefined;
  const stop = (): void => {
    if (timer !== undefined) clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  };
  const fire = (code: GrpcStatus, details: string): void => {
    stop();
    cancel(code, details);
  };
  const onAbort = (): void => fire(GrpcStatus.CANCELLED, "Cancelled on client");
  const arm = (): boolean => {
    const left = deadline - Date.now();
    if (left <= 0) {
      fire(GrpcStatus.DEADLINE_EXCEEDED, "Deadline exceeded");
      return false;
    }
    timer = setTimeout(arm, Math.min(left, MAX_TIMER_MS));
    return true;
  };
  if (arm()) signal?.addEventListener("abort", onAbort, { once: true });
  return stop;
}

/** The socket to the target, TLS with ALPN h2 when configured, Nagle off. */
export function dial(options: Http2TransportOptions): net.Socket {
  const { host, port } = options.target;
  const override = options.serverNameOverride;
  const socket = options.tls
    ? tls.connect({
        ...options.tls,
        host,
        port,
        ALPNProtocols: ["h2"],
        // SNI carries names only; an IP address is checked against the certificate's IP SANs.
        ...(net.isIP(override ?? host) ? {} : { servername: override ?? host }),
        ...(override ? { checkServerIdentity: (_: string, cert: tls.PeerCertificate) => tls.checkServerIdentity(override, cert) } : {}),
      })
    : net.connect({ host, port });
  // A request is a HEADERS and a DATA frame written back to back: without this a second request
  // can wait for the ACK of the first (Nagle + delayed ACK, up to 40 ms on Linux).
  socket.setNoDelay(true);
  return socket;
}

/** `grpc-timeout`: at most 8 digits, in the finest unit that fits. */
export function grpcTimeout(ms: number): string {
  const m = Math.max(1, Math.ceil(ms));
  if (m < 1e8) return `${m}m`;
  const s = Math.ceil(m / 1000);
  if (s < 1e8) return `${s}S`;
  return `${Math.min(99_999_999, Math.ceil(s / 3600))}H`;
}

/** The error of a non-OK status in `headers` (trailers, or a trailers-only response), or undefined. */
export function statusError(headers: ResponseHeaders): RpcError | undefined {
  const code = Number(headers["grpc-status"]);
  if (code === GrpcStatus.OK) return undefined;
  const raw = headers["grpc-message"];
  const message = typeof raw === "string" ? raw : "";
  let details = message;
  try {
    details = decodeURIComponent(message);
  } catch {
    // Not valid percent-encoding: the text as sent.
  }
  const metadata = Metadata.fromHttp2Headers(headers);
  metadata.remove("grpc-status");
  metadata.remove("grpc-message");
  if (!Number.isInteger(code) || code < 0) {
    return new RpcError(GrpcStatus.UNKNOWN, `Invalid grpc-status ${String(headers["grpc-status"])}`, metadata);
  }
  return new RpcError(code, details, metadata);
}

/** The one message of an OK response, or the error grpc-js reports for a missing or odd one. */
export function responseMessage(
  chunks: Buffer[],
  received: number,
  trailers: ResponseHeaders,
): [RpcError | undefined, Uint8Array?] {
  const data = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, received);
  const metadata = (): Metadata => {
    const m = Metadata.fromHttp2Headers(trailers);
    m.remove("grpc-status");
    m.remove("grpc-message");
    return m;
  };
  if (data.length === 0) return [new RpcError(GrpcStatus.UNIMPLEMENTED, "No message received", metadata())];
  if (data.length < 5 || data.length !== 5 + data.readUInt32BE(1)) {
    return [new RpcError(GrpcStatus.INTERNAL, "Malformed response message framing", metadata())];
  }
  if (data[0] !== 0) {
    // No grpc-accept-encoding is sent, so a compressed message breaks the protocol.
    return [new RpcError(GrpcStatus.INTERNAL, "Received a compressed message that was not asked for", metadata())];
  }
  return [undefined, data.subarray(5)];
}

/** grpc-js's mapping of an HTTP status without a gRPC status. */
export function httpStatusCode(code: number): [GrpcStatus, string] {
  const details = `Received HTTP status code ${code}`;
  switch (code) {
    case 400: return [GrpcStatus.INTERNAL, details];
    case 401: return [GrpcStatus.UNAUTHENTICATED, details];
    case 403: return [GrpcStatus.PERMISSION_DENIED, details];
    case 404: return [GrpcStatus.UNIMPLEMENTED, details];
    case 429: case 502: case 503: case 504: return [GrpcStatus.UNAVAILABLE, details];
    default: return [GrpcStatus.UNKNOWN, details];
  }
}

/**
 * A stream that ended without a status: reset by the server (mapped as grpc-js maps RST_STREAM
 * codes), or lost with its connection (refused, closed, TLS refused), which is `UNAVAILABLE`.
 */
function resetError(rstCode: number | undefined, cause: Error | undefined, connectionLost: boolean): RpcError {
  const reset = (cause as { code?: string } | undefined)?.code === "ERR_HTTP2_STREAM_ERROR" || cause === undefined;
  if (reset && rstCode !== undefined) {
    const error = resetCodeError(rstCode, connectionLost, cause);
    if (error) return error;
  }
  return new RpcError(GrpcStatus.UNAVAILABLE, cause ? errorText(cause) : "Connection dropped", new Metadata(), { cause });
}

/** grpc-js's mapping of a RST_STREAM code (UNAVAILABLE for a code it does not name). */
export function resetCodeError(rstCode: number, connectionLost: boolean, cause?: Error): RpcError {
  const c = http2.constants;
  switch (rstCode) {
    case c.NGHTTP2_NO_ERROR:
    case c.NGHTTP2_INTERNAL_ERROR:
      return new RpcError(GrpcStatus.INTERNAL, `Received RST_STREAM with code ${rstCode}`, new Metadata(), { cause });
    case c.NGHTTP2_REFUSED_STREAM:
      return new RpcError(GrpcStatus.UNAVAILABLE, "Stream refused by server", new Metadata(), { cause });
    case c.NGHTTP2_CANCEL:
      // Node also ends the streams of a dropped connection with CANCEL.
      if (connectionLost) return new RpcError(GrpcStatus.UNAVAILABLE, "Connection dropped");
      return new RpcError(GrpcStatus.CANCELLED, "Call cancelled", new Metadata(), { cause });
    case c.NGHTTP2_ENHANCE_YOUR_CALM:
      return new RpcError(GrpcStatus.RESOURCE_EXHAUSTED, "Bandwidth exhausted or memory limit exceeded", new Metadata(), { cause });
    case c.NGHTTP2_INADEQUATE_SECURITY:
      return new RpcError(GrpcStatus.PERMISSION_DENIED, "Protocol not secure enough", new Metadata(), { cause });
    default:
      return new RpcError(GrpcStatus.UNAVAILABLE, `Received RST_STREAM with code ${rstCode}`, new Metadata(), { cause });
  }
}

export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
