/**
 * The client's default unary gRPC transport (`"node-http2"`, also named `"http2"`): HTTP/2 from
 * Node's own `node:http2` (nghttp2: framing, HPACK, flow control, SETTINGS), one session per
 * client at a time, one stream per call. What it adds on top is what a proxy in the way needs
 * (issue 51, clients/conformance/proxy-matrix.md):
 *
 * - **The server's SETTINGS first.** No stream is opened before the server's SETTINGS arrived,
 *   and never more at once than its SETTINGS_MAX_CONCURRENT_STREAMS; the calls above it wait in
 *   the client's queue (in order) for a stream to end, under their own deadline.
 * - **A call the server never took moves to a new connection**, without an error and without
 *   spending the executor's retries: a stream refused (RST_STREAM REFUSED_STREAM), one above the
 *   last-stream-id of a GOAWAY, one the session could not open any more (it was going away).
 *   A GOAWAY sends the later calls to a new session; the streams it took end on the old one.
 * - **A proxy**, as grpc-js finds it: `grpc_proxy`, then `https_proxy`, then `http_proxy`
 *   (an `http://` URL, user:password as Proxy-Authorization), unless the host is in
 *   `no_grpc_proxy` / `no_proxy` (suffixes or IPv4 CIDRs); an HTTP CONNECT tunnel, TLS to idemd
 *   inside it. `proxy` in the options overrides the environment.
 * - **Keepalive PINGs** when `keepaliveMs` is set: a connection whose PING is not answered within
 *   `keepaliveTimeoutMs` is closed (its calls fail `UNAVAILABLE`, the next ones reconnect).
 *
 * Why not grpc-js for these calls: every idemd RPC is unary, and grpc-js spends 0.3–0.5 ms of
 * CPU per call in its channel, resolver, load-balancing and filter stack; the same bytes over
 * bare `node:http2` cost about half of that (bench/pair.ts). The middleware makes a Claim +
 * Complete pair on every fresh key. grpc-js stays as `IdemdClient.raw` and as the
 * `transport: "grpc-js"` option (its channel options and name resolvers).
 *
 * What this keeps of gRPC over HTTP/2 (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md):
 * length-prefixed messages, `content-type: application/grpc`, `te: trailers`, `grpc-timeout`
 * from the deadline, the status from the trailers or from a trailers-only response, the
 * percent-encoded `grpc-message`, `-bin` metadata, and the same status codes grpc-js reports for
 * HTTP errors, stream resets and dropped connections.
 */
import * as http from "node:http";
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
  /** HTTP CONNECT proxy to tunnel through (see {@link proxyFor}); undefined: a direct connection. */
  proxy?: ProxyInfo;
  /** Interval of keepalive PINGs on an open connection, in ms; undefined or 0: none. */
  keepaliveMs?: number;
  /** How long a keepalive PING may go unanswered before the connection is closed (default 20 000 ms). */
  keepaliveTimeoutMs?: number;
  /**
   * Test hook: false turns off waiting for the server's SETTINGS and moving calls it never took
   * (how node:http2 alone behaves), so that the proxy matrix can show that it fails without them.
   */
  robust?: boolean;
}

/** An HTTP CONNECT proxy. */
export interface ProxyInfo {
  host: string;
  port: number;
  /** `user:password` for `Proxy-Authorization: Basic`, when the URL carried them. */
  credentials?: string;
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

/**
 * How often one call may move to a new connection before its failure is reported (a server
 * that refuses everything); the call's deadline bounds the moves too.
 */
const MAX_MOVES = 100;
const DEFAULT_KEEPALIVE_TIMEOUT_MS = 20_000;

/** One connection: its session (once dialed), what the server allows and what is open on it. */
class Connection {
  session: http2.ClientHttp2Session | undefined;
  /** The server's SETTINGS arrived: streams may be opened. */
  ready = false;
  /** The server's SETTINGS_MAX_CONCURRENT_STREAMS (unlimited when it sends none). */
  maxStreams = Infinity;
  /** Streams opened and not yet closed. */
  active = 0;
  /** GOAWAY received, closed or failed: no new stream goes here. */
  gone = false;
  /** The last-stream-id of the server's GOAWAY: the streams above it were never processed. */
  lastStreamId: number | undefined;
  error: Error | undefined;
  keepalive: NodeJS.Timeout | undefined;
}

/** A call waiting for a stream, or on one. */
interface Pending {
  /** Order of arrival: a call moved to a new connection keeps its place in the queue. */
  seq: number;
  call: UnaryCall;
  deadline: number;
  resolve: (message: Uint8Array) => void;
  reject: (error: RpcError) => void;
  settled: boolean;
  stream: http2.ClientHttp2Stream | undefined;
  moves: number;
  unwatch: (() => void) | undefined;
}

export class Http2Transport {
  private connection: Connection | undefined;
  private readonly queue: Pending[] = [];
  private seq = 0;
  private closed = false;
  private readonly authority: string;
  private readonly scheme: "http" | "https";
  private readonly robust: boolean;

  constructor(private readonly options: Http2TransportOptions, private readonly baseHeaders: http2.OutgoingHttpHeaders) {
    const { host, port } = options.target;
    this.authority = options.serverNameOverride ?? (net.isIPv6(host) ? `[${host}]:${port}` : `${host}:${port}`);
    this.scheme = options.tls ? "https" : "http";
    this.robust = options.robust ?? true;
  }

  /** Sends one request message and resolves to the response message's bytes. */
  unary(call: UnaryCall): Promise<Uint8Array> {
    return new Promise<Uint8Array>((resolve, reject) => {
      if (this.closed) {
        reject(new RpcError(GrpcStatus.UNAVAILABLE, "the client was closed"));
        return;
      }
      const pending: Pending = {
        seq: this.seq++,
        call, deadline: Date.now() + call.deadlineMs, resolve, reject, settled: false, stream: undefined, moves: 0, unwatch: undefined,
      };
      pending.unwatch = watchCall(pending.deadline, call.signal, (code, details) => {
        if (pending.settled) return;
        const stream = pending.stream;
        if (stream === undefined) this.unqueue(pending);
        settle(pending, new RpcError(code, details));
        // Reset the stream so that the server stops too.
        if (stream !== undefined && !stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
      });
      if (pending.settled) return; // an expired deadline
      this.queue.push(pending);
      this.pump();
    });
  }

  /** Closes the session; calls in flight and waiting end with `UNAVAILABLE`, later calls fail likewise. */
  close(): void {
    this.closed = true;
    const connection = this.connection;
    this.connection = undefined;
    this.failQueue(new RpcError(GrpcStatus.UNAVAILABLE, "the client was closed"));
    if (connection) this.drop(connection, undefined, true);
  }

  /** Opens streams for the waiting calls, as many as the server allows. */
  private pump(): void {
    while (this.queue.length > 0 && !this.closed) {
      const connection = this.current();
      if (this.queue.length === 0) return; // dialing ran the queue already (fix off)
      if (this.robust && (!connection.ready || connection.active >= connection.maxStreams)) return;
      if (!this.robust && connection.session === undefined) return;
      this.start(this.queue.shift()!, connection);
    }
  }

  /** The connection new streams go to, dialing one when there is none or the last one went away. */
  private current(): Connection {
    const existing = this.connection;
    if (existing && !existing.gone) return existing;
    const connection = new Connection();
    this.connection = connection;
    const proxy = this.options.proxy;
    if (proxy === undefined) {
      this.open(connection, dial(this.options));
    } else {
      tunnel(proxy, this.options.target).then(
        (socket) => {
          if (connection.gone) socket.destroy();
          else this.open(connection, this.options.tls ? wrapTls(this.options, socket) : socket);
        },
        (err: Error) => this.drop(connection, err),
      );
    }
    return connection;
  }

  private open(connection: Connection, socket: net.Socket): void {
    const session = http2.connect(`${this.scheme}://${this.authority}`, {
      settings: { enablePush: false, initialWindowSize: WINDOW_BYTES },
      createConnection: () => socket,
    });
    connection.session = session;
    // Failures reach the calls through their streams; without a listener an "error" would throw.
    session.on("error", (err) => {
      connection.error ??= err;
    });
    session.once("connect", () => session.setLocalWindowSize(WINDOW_BYTES));
    session.on("remoteSettings", (settings) => {
      connection.maxStreams = settings.maxConcurrentStreams ?? Infinity;
      connection.ready = true;
      this.pump();
    });
    session.once("goaway", (_code: number, lastStreamId: number) => {
      connection.lastStreamId = lastStreamId;
      this.drop(connection);
    });
    session.once("close", () => this.drop(connection));
    // A socket that fails or closes while no stream is open (e.g. TLS 1.3 refusing a missing
    // client certificate after the handshake) ends the session without its "close" event: the
    // connection is gone all the same.
    socket.once("error", (err) => this.drop(connection, err, true));
    socket.once("close", () => this.drop(connection, undefined, true));
    const every = this.options.keepaliveMs ?? 0;
    if (every > 0) {
      const timeoutMs = this.options.keepaliveTimeoutMs ?? DEFAULT_KEEPALIVE_TIMEOUT_MS;
      connection.keepalive = setInterval(() => {
        if (session.destroyed || session.closed || !connection.ready) return;
        const timer = setTimeout(() => session.destroy(new Error("keepalive PING not answered")), timeoutMs);
        timer.unref();
        try {
          session.ping(() => clearTimeout(timer));
        } catch {
          clearTimeout(timer);
        }
      }, every);
      connection.keepalive.unref();
    }
    // An idle client must not keep the process alive; a call in flight does through its timer.
    session.unref();
    if (!this.robust) this.pump();
  }

  /**
   * `connection` takes no more streams (GOAWAY, closed, failed to connect, or the client was
   * closed: `destroy`). The calls waiting go to a new connection, unless this one never came up:
   * then the server is unreachable and they fail, as a call on a lost connection does.
   */
  private drop(connection: Connection, error?: Error, destroy = false): void {
    const first = !connection.gone;
    connection.gone = true;
    connection.error ??= error;
    if (this.connection === connection) this.connection = undefined;
    if (destroy || connection.session?.destroyed || connection.session?.closed) clearInterval(connection.keepalive);
    if (destroy) connection.session?.destroy();
    else if (first && connection.session && !connection.session.closed && connection.active === 0) connection.session.close();
    if (!first) return;
    if (!connection.ready && this.queue.length > 0) {
      const cause = connection.error;
      this.failQueue(new RpcError(GrpcStatus.UNAVAILABLE, cause ? errorText(cause) : "Connection dropped", new Metadata(), { cause }));
      return;
    }
    this.pump();
  }

  /**
   * Back into the queue, in its place by arrival: the oldest calls get the next connection's
   * first streams, which a server that takes N requests per connection processes.
   */
  private requeue(pending: Pending): void {
    let i = 0;
    while (i < this.queue.length && this.queue[i]!.seq < pending.seq) i++;
    this.queue.splice(i, 0, pending);
  }

  private unqueue(pending: Pending): void {
    const i = this.queue.indexOf(pending);
    if (i >= 0) this.queue.splice(i, 1);
  }

  private failQueue(error: RpcError): void {
    for (const pending of this.queue.splice(0)) settle(pending, error);
  }

  private start(pending: Pending, connection: Connection): void {
    const { call, deadline } = pending;
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
      stream = connection.session!.request(headers, { endStream: false });
    } catch (err) {
      // The session went away (GOAWAY, closed socket) before its event reached us: the request
      // was never sent, so it waits for the next connection.
      this.drop(connection, err as Error);
      if (pending.moves++ < MAX_MOVES || !this.robust) {
        this.requeue(pending);
      } else {
        settle(pending, new RpcError(GrpcStatus.UNAVAILABLE, errorText(err), new Metadata(), { cause: err }));
      }
      return;
    }
    connection.active += 1;
    pending.stream = stream;
    stream.end(frame);

    const chunks: Buffer[] = [];
    let received = 0;
    let httpStatus = 0;
    let statusHeaders: http2.IncomingHttpHeaders | undefined;
    let streamError: Error | undefined;
    const cancel = (code: GrpcStatus, details: string): void => {
      settle(pending, new RpcError(code, details));
      if (!stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
    };
    stream.on("response", (responseHeaders) => {
      httpStatus = Number(responseHeaders[":status"]);
      if (responseHeaders["grpc-status"] !== undefined) statusHeaders = responseHeaders; // trailers-only
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
      connection.active -= 1;
      if (connection.gone && connection.active === 0 && connection.session && !connection.session.closed) connection.session.close();
      if (!pending.settled) {
        if (statusHeaders) {
          const error = statusError(statusHeaders);
          if (error) settle(pending, error);
          else settle(pending, ...responseMessage(chunks, received, statusHeaders));
        } else if (httpStatus !== 0 && httpStatus !== 200) {
          settle(pending, new RpcError(...httpStatusCode(httpStatus)));
        } else if (this.robust && httpStatus === 0 && neverTaken(stream, connection) && pending.moves < MAX_MOVES && !this.closed) {
          // Refused, or above the GOAWAY's last stream: the server never saw it. Again, elsewhere.
          pending.moves += 1;
          pending.stream = undefined;
          this.requeue(pending);
        } else {
          const session = connection.session!;
          settle(pending, resetError(stream.rstCode, streamError, session.destroyed || session.closed));
        }
      }
      this.pump();
    });
  }
}

/** Ends a waiting or running call once. */
function settle(pending: Pending, error: RpcError | undefined, message?: Uint8Array): void {
  if (pending.settled) return;
  pending.settled = true;
  pending.unwatch?.();
  if (error) pending.reject(error);
  else pending.resolve(message!);
}

/**
 * True when the server never processed the stream, so that the call can be sent again without
 * the risk of running twice: it refused it (REFUSED_STREAM), it is above the last-stream-id of
 * the server's GOAWAY, or it never got a stream id.
 */
function neverTaken(stream: http2.ClientHttp2Stream, connection: Connection): boolean {
  if (stream.rstCode === http2.constants.NGHTTP2_REFUSED_STREAM) return true;
  const id = stream.id;
  if (id === undefined || id === 0) return true;
  return connection.lastStreamId !== undefined && id > connection.lastStreamId;
}

/**
 * The proxy a connection to `host` goes through, as grpc-js chooses it: `proxy` when given (a
 * URL; false: none), else `grpc_proxy`, `https_proxy` or `http_proxy` from the environment
 * unless `host` matches `no_grpc_proxy` / `no_proxy` (a suffix of the host, or an IPv4 CIDR).
 * Only `http://` proxies (HTTP CONNECT), as grpc-js.
 */
export function proxyFor(host: string, proxy?: string | false, env: NodeJS.ProcessEnv = process.env): ProxyInfo | undefined {
  if (proxy === false) return undefined;
  let url = proxy;
  if (url === undefined) {
    url = env.grpc_proxy || env.https_proxy || env.http_proxy;
    if (!url) return undefined;
    const noProxy = env.no_grpc_proxy || env.no_proxy || "";
    for (const entry of noProxy.split(",").map((e) => e.trim()).filter((e) => e !== "")) {
      if (entry === "*" || host.endsWith(entry) || (net.isIPv4(host) && inCidr(host, entry))) return undefined;
    }
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new TypeError(`IdemdClient: the proxy ${url} is not a URL`);
  }
  if (parsed.protocol !== "http:") throw new TypeError(`IdemdClient: only http:// proxies (HTTP CONNECT) are supported, not ${parsed.protocol}`);
  const user = decodeURIComponent(parsed.username);
  const password = decodeURIComponent(parsed.password);
  return {
    host: parsed.hostname.replace(/^\[(.*)\]$/, "$1"),
    port: parsed.port === "" ? 80 : Number(parsed.port),
    ...(user !== "" ? { credentials: password !== "" ? `${user}:${password}` : user } : {}),
  };
}

function inCidr(ip: string, cidr: string): boolean {
  const [base, bits] = cidr.split("/");
  const prefix = Number(bits);
  if (base === undefined || !net.isIPv4(base) || !Number.isInteger(prefix) || prefix < 0 || prefix > 32) return false;
  const toInt = (a: string): number => a.split(".").reduce((acc, o) => acc * 256 + Number(o), 0);
  const size = 2 ** (32 - prefix);
  return Math.floor(toInt(ip) / size) === Math.floor(toInt(base) / size);
}

/** A socket to `target` through the proxy's HTTP CONNECT tunnel. */
function tunnel(proxy: ProxyInfo, target: Http2Target): Promise<net.Socket> {
  const authority = net.isIPv6(target.host) ? `[${target.host}]:${target.port}` : `${target.host}:${target.port}`;
  return new Promise((resolve, reject) => {
    const request = http.request({
      host: proxy.host,
      port: proxy.port,
      method: "CONNECT",
      path: authority,
      headers: {
        host: authority,
        ...(proxy.credentials ? { "proxy-authorization": `Basic ${Buffer.from(proxy.credentials).toString("base64")}` } : {}),
      },
    });
    request.once("connect", (response, socket, head) => {
      if (response.statusCode !== 200) {
        socket.destroy();
        reject(new Error(`the proxy ${proxy.host}:${proxy.port} answered CONNECT ${authority} with HTTP ${response.statusCode}`));
        return;
      }
      if (head.length > 0) socket.unshift(head);
      socket.setNoDelay(true);
      resolve(socket);
    });
    request.once("error", (err) => reject(new Error(`the proxy ${proxy.host}:${proxy.port}: ${errorText(err)}`)));
    request.end();
  });
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
  const socket = options.tls ? tls.connect({ ...tlsOptions(options), host, port }) : net.connect({ host, port });
  // A request is a HEADERS and a DATA frame written back to back: without this a second request
  // can wait for the ACK of the first (Nagle + delayed ACK, up to 40 ms on Linux).
  socket.setNoDelay(true);
  return socket;
}

/** TLS to the target inside an established socket (a proxy's tunnel). */
function wrapTls(options: Http2TransportOptions, socket: net.Socket): net.Socket {
  // `host`: the name the certificate is checked against (tls.connect's default is localhost).
  return tls.connect({ ...tlsOptions(options), host: options.target.host, socket });
}

function tlsOptions(options: Http2TransportOptions): tls.ConnectionOptions {
  const override = options.serverNameOverride;
  const name = override ?? options.target.host;
  return {
    ...options.tls,
    ALPNProtocols: ["h2"],
    // SNI carries names only; an IP address is checked against the certificate's IP SANs.
    ...(net.isIP(name) ? {} : { servername: name }),
    ...(override ? { checkServerIdentity: (_: string, cert: tls.PeerCertificate) => tls.checkServerIdentity(override, cert) } : {}),
  };
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
