/**
 * The client's default unary gRPC transport: HTTP/2 framed by hand over one socket per client.
 *
 * Why not `node:http2` (transport.ts, kept as `transport: "node-http2"`): every idemd RPC is one
 * small request and one small answer, and node:http2 builds a ClientHttp2Stream (a Duplex, an
 * AsyncResource, header objects in and out, several listeners) for each, which was most of what
 * a Claim + Complete pair cost the process (bench/pair.ts; README, `transport`). The
 * middleware makes that pair on every fresh key. Here a call is one write (HEADERS + DATA) and
 * the frames of its answer parsed from the socket's chunks.
 *
 * What it speaks (RFC 9113, RFC 7541): the preface and SETTINGS (acknowledged both ways), PING
 * acks, flow control in both directions (a 4 MiB receive window like transport.ts; sends wait
 * for the peer's windows and obey its frame size), HEADERS with CONTINUATION and padding, HPACK
 * decoding with Huffman and the dynamic table (the encoder never indexes), MAX_CONCURRENT_STREAMS
 * (calls over it wait), RST_STREAM both ways, GOAWAY (calls the server did not take fail as
 * UNAVAILABLE; later calls go to a new connection) and reconnecting after a lost connection.
 * gRPC on top is transport.ts's: the same headers, status mapping and errors.
 */
import * as net from "node:net";
import * as tls from "node:tls";
import { Metadata, status as GrpcStatus } from "@grpc/grpc-js";
import { RpcError } from "./errors";
import { encodeField, HpackDecoder, HpackError, type HeaderFields } from "./hpack";
import {
  type Http2TransportOptions,
  type ResponseHeaders,
  type UnaryCall,
  dial,
  errorText,
  grpcTimeout,
  httpStatusCode,
  MAX_RECEIVE_BYTES,
  resetCodeError,
  responseMessage,
  statusError,
  watchCall,
  WINDOW_BYTES,
} from "./transport";

const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");
const enum Frame { DATA = 0, HEADERS = 1, PRIORITY = 2, RST_STREAM = 3, SETTINGS = 4, PUSH_PROMISE = 5, PING = 6, GOAWAY = 7, WINDOW_UPDATE = 8, CONTINUATION = 9 }
const enum Flag { END_STREAM = 0x1, ACK = 0x1, END_HEADERS = 0x4, PADDED = 0x8, PRIORITY = 0x20 }
const enum ErrorCode { NO_ERROR = 0, PROTOCOL_ERROR = 1, FLOW_CONTROL_ERROR = 3, FRAME_SIZE_ERROR = 6, CANCEL = 8, COMPRESSION_ERROR = 9 }
const DEFAULT_WINDOW = 65_535;
const DEFAULT_FRAME_SIZE = 16_384;
const MAX_WINDOW = 2 ** 31 - 1;
/** Stream ids are 31 bits; a connection that used them all is replaced. */
const LAST_STREAM_ID = 2 ** 31 - 1;

function frame(type: Frame, flags: number, streamId: number, payload?: Uint8Array): Buffer {
  const length = payload ? payload.length : 0;
  const out = Buffer.allocUnsafe(9 + length);
  out.writeUIntBE(length, 0, 3);
  out[3] = type;
  out[4] = flags;
  out.writeUInt32BE(streamId, 5);
  if (payload) out.set(payload, 9);
  return out;
}

function u32(value: number): Buffer {
  const out = Buffer.allocUnsafe(4);
  out.writeUInt32BE(value, 0);
  return out;
}

/** One call: what was received for it, and what is left to send. */
class Call {
  id = 0;
  sendWindow = 0;
  /** The request's DATA payload not yet sent (undefined: all sent, END_STREAM included). */
  pending: Buffer | undefined;
  headersSeen = false;
  httpStatus = 0;
  statusHeaders: ResponseHeaders | undefined;
  chunks: Buffer[] = [];
  received = 0;
  /** Received DATA octets not yet returned to the server's view of our stream window. */
  unacked = 0;
  done = false;

  constructor(
    readonly headerBlock: Buffer,
    body: Buffer,
    readonly settle: (error: RpcError | undefined, message?: Uint8Array) => void,
  ) {
    this.pending = body;
  }
}

/** One HTTP/2 connection and the calls on it. */
class Connection {
  readonly socket: net.Socket;
  private readonly decoder = new HpackDecoder();
  private readonly calls = new Map<number, Call>();
  /** Calls waiting for the server's MAX_CONCURRENT_STREAMS to allow them. */
  private readonly waiting: Call[] = [];
  /** Calls with request bytes left, waiting for flow-control credit. */
  private readonly blocked = new Set<Call>();
  private nextId = 1;
  private sendWindow = DEFAULT_WINDOW;
  private peerInitialWindow = DEFAULT_WINDOW;
  private peerFrameSize = DEFAULT_FRAME_SIZE;
  private peerMaxStreams = Infinity;
  private connUnacked = 0;
  private input: Buffer | undefined;
  /** A header block whose CONTINUATION frames are still to come. */
  private partial: { streamId: number; endStream: boolean; parts: Buffer[] } | undefined;
  /** GOAWAY received or sent, or the socket gone: no new calls. */
  closing = false;

  constructor(socket: net.Socket, private readonly onGone: (c: Connection) => void) {
    this.socket = socket;
    const settings = Buffer.alloc(12);
    settings.writeUInt16BE(0x2, 0); // ENABLE_PUSH
    settings.writeUInt32BE(0, 2);
    settings.writeUInt16BE(0x4, 6); // INITIAL_WINDOW_SIZE
    settings.writeUInt32BE(WINDOW_BYTES, 8);
    socket.write(Buffer.concat([
      PREFACE,
      frame(Frame.SETTINGS, 0, 0, settings),
      frame(Frame.WINDOW_UPDATE, 0, 0, u32(WINDOW_BYTES - DEFAULT_WINDOW)),
    ]));
    socket.on("data", (chunk: Buffer) => this.onData(chunk));
    let cause: Error | undefined;
    socket.on("error", (err) => {
      cause = err;
    });
    socket.on("close", () => this.lost(cause ? errorText(cause) : "Connection dropped", cause));
    // An idle client must not keep the process alive; a call in flight does through its timer.
    socket.unref();
  }

  get idle(): boolean {
    return this.calls.size === 0 && this.waiting.length === 0;
  }

  /** Whether this connection can take another call (else the transport opens a new one). */
  get usable(): boolean {
    return !this.closing && this.nextId <= LAST_STREAM_ID;
  }

  start(call: Call): void {
    if (this.calls.size >= this.peerMaxStreams) {
      this.waiting.push(call);
      return;
    }
    this.open(call);
  }

  /** Ends a call locally: the stream is reset so that the server stops too. */
  cancel(call: Call): void {
    call.done = true;
    const i = this.waiting.indexOf(call);
    if (i >= 0) this.waiting.splice(i, 1);
    if (call.id !== 0 && this.calls.delete(call.id)) {
      this.blocked.delete(call);
      if (!this.socket.destroyed) this.socket.write(frame(Frame.RST_STREAM, 0, call.id, u32(ErrorCode.CANCEL)));
      this.next();
    }
  }

  close(): void {
    this.socket.destroy();
  }

  private open(call: Call): void {
    call.id = this.nextId;
    this.nextId += 2;
    call.sendWindow = this.peerInitialWindow;
    this.calls.set(call.id, call);
    const block = call.headerBlock;
    const parts: Buffer[] = [];
    for (let at = 0; at === 0 || at < block.length; at += this.peerFrameSize) {
      const end = Math.min(block.length, at + this.peerFrameSize);
      parts.push(frame(at === 0 ? Frame.HEADERS : Frame.CONTINUATION, end === block.length ? Flag.END_HEADERS : 0, call.id, block.subarray(at, end)));
    }
    this.sendData(call, parts);
    this.socket.write(parts.length === 1 ? parts[0]! : Buffer.concat(parts));
  }

  /** Appends to `out` the DATA frames the windows allow; the call waits for the rest. */
  private sendData(call: Call, out: Buffer[]): void {
    let pending = call.pending;
    while (pending !== undefined) {
      const n = Math.min(pending.length, call.sendWindow, this.sendWindow, this.peerFrameSize);
      if (n <= 0 && pending.length > 0) break;
      const last = n === pending.length;
      out.push(frame(Frame.DATA, last ? Flag.END_STREAM : 0, call.id, pending.subarray(0, n)));
      call.sendWindow -= n;
      this.sendWindow -= n;
      pending = last ? undefined : pending.subarray(n);
    }
    call.pending = pending;
    if (pending === undefined) this.blocked.delete(call);
    else this.blocked.add(call);
  }

  private flushBlocked(): void {
    if (this.blocked.size === 0) return;
    const out: Buffer[] = [];
    for (const call of [...this.blocked]) this.sendData(call, out);
    if (out.length > 0) this.socket.write(Buffer.concat(out));
  }

  /** Starts waiting calls while the server's stream limit allows. */
  private next(): void {
    while (this.waiting.length > 0 && this.calls.size < this.peerMaxStreams && !this.closing) this.open(this.waiting.shift()!);
  }

  private onData(chunk: Buffer): void {
    let buf = this.input ? Buffer.concat([this.input, chunk]) : chunk;
    let pos = 0;
    try {
      while (buf.length - pos >= 9) {
        const length = buf.readUIntBE(pos, 3);
        // We never raise SETTINGS_MAX_FRAME_SIZE, so the server may not send more than the default.
        if (length > DEFAULT_FRAME_SIZE) throw new ProtocolError(ErrorCode.FRAME_SIZE_ERROR, `frame of ${length} octets`);
        if (buf.length - pos < 9 + length) break;
        const type = buf[pos + 3]!;
        const flags = buf[pos + 4]!;
        const streamId = buf.readUInt32BE(pos + 5) & 0x7fffffff;
        const payload = buf.subarray(pos + 9, pos + 9 + length);
        pos += 9 + length;
        this.onFrame(type, flags, streamId, payload);
        if (this.socket.destroyed) return;
      }
    } catch (err) {
      const code = err instanceof ProtocolError ? err.code : err instanceof HpackError ? ErrorCode.COMPRESSION_ERROR : ErrorCode.PROTOCOL_ERROR;
      this.fail(code, errorText(err));
      return;
    }
    this.input = pos === buf.length ? undefined : Buffer.from(buf.subarray(pos));
  }

  private onFrame(type: number, flags: number, streamId: number, payload: Buffer): void {
    if (this.partial && type !== Frame.CONTINUATION) throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, "expected CONTINUATION");
    switch (type) {
      case Frame.DATA: {
        if (streamId === 0) throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0");
        // Padding counts against flow control too.
        this.connUnacked += payload.length;
        if (this.connUnacked >= WINDOW_BYTES / 2) {
          this.socket.write(frame(Frame.WINDOW_UPDATE, 0, 0, u32(this.connUnacked)));
          this.connUnacked = 0;
        }
        const call = this.calls.get(streamId);
        if (!call) return; // reset by us; its octets are accounted for above
        const data = unpad(flags, payload);
        call.received += data.length;
        if (call.received > MAX_RECEIVE_BYTES + 5) {
          this.finish(call, new RpcError(GrpcStatus.RESOURCE_EXHAUSTED, `Received message larger than max (${call.received - 5} vs. ${MAX_RECEIVE_BYTES})`));
          this.socket.write(frame(Frame.RST_STREAM, 0, streamId, u32(ErrorCode.CANCEL)));
          return;
        }
        if (data.length > 0) call.chunks.push(data);
        if (flags & Flag.END_STREAM) {
          this.complete(call);
          return;
        }
        call.unacked += payload.length;
        if (call.unacked >= WINDOW_BYTES / 2) {
          this.socket.write(frame(Frame.WINDOW_UPDATE, 0, streamId, u32(call.unacked)));
          call.unacked = 0;
        }
        return;
      }
      case Frame.HEADERS: {
        if (streamId === 0) throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0");
        let block = unpad(flags, payload);
        if (flags & Flag.PRIORITY) block = block.subarray(5);
        const endStream = (flags & Flag.END_STREAM) !== 0;
        if (flags & Flag.END_HEADERS) this.onHeaders(streamId, endStream, block);
        else this.partial = { streamId, endStream, parts: [Buffer.from(block)] };
        return;
      }
      case Frame.CONTINUATION: {
        const partial = this.partial;
        if (!partial || partial.streamId !== streamId) throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION");
        partial.parts.push(Buffer.from(payload));
        if (flags & Flag.END_HEADERS) {
          this.partial = undefined;
          this.onHeaders(streamId, partial.endStream, Buffer.concat(partial.parts));
        }
        return;
      }
      case Frame.RST_STREAM: {
        const call = this.calls.get(streamId);
        if (call && payload.length === 4) this.finish(call, resetCodeError(payload.readUInt32BE(0), false));
        return;
      }
      case Frame.SETTINGS: {
        if (flags & Flag.ACK) return;
        if (payload.length % 6 !== 0) throw new ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS length");
        for (let i = 0; i < payload.length; i += 6) this.setting(payload.readUInt16BE(i), payload.readUInt32BE(i + 2));
        this.socket.write(frame(Frame.SETTINGS, Flag.ACK, 0));
        this.flushBlocked();
        this.next();
        return;
      }
      case Frame.PING:
        if (payload.length !== 8) throw new ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "PING length");
        if (!(flags & Flag.ACK)) this.socket.write(frame(Frame.PING, Flag.ACK, 0, payload));
        return;
      case Frame.GOAWAY: {
        const last = payload.readUInt32BE(0) & 0x7fffffff;
        const code = payload.readUInt32BE(4);
        this.closing = true;
        this.onGone(this);
        // The server never saw these: they can go again on a new connection.
        for (const call of [...this.calls.values()]) {
          if (call.id > last) this.finish(call, new RpcError(GrpcStatus.UNAVAILABLE, `Server sent GOAWAY (code ${code}) before taking the call`));
        }
        this.failWaiting(`Server sent GOAWAY (code ${code})`);
        if (this.calls.size === 0) this.socket.end();
        return;
      }
      case Frame.WINDOW_UPDATE: {
        if (payload.length !== 4) throw new ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE length");
        const increment = payload.readUInt32BE(0) & 0x7fffffff;
        if (streamId === 0) {
          this.sendWindow += increment;
          if (this.sendWindow > MAX_WINDOW) throw new ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow");
        } else {
          const call = this.calls.get(streamId);
          if (!call) return;
          call.sendWindow += increment;
        }
        this.flushBlocked();
        return;
      }
      case Frame.PUSH_PROMISE:
        throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE with push disabled");
      default:
        return; // PRIORITY and unknown frame types are ignored (RFC 9113 4.1, 5.5)
    }
  }

  private setting(id: number, value: number): void {
    switch (id) {
      case 0x3: // MAX_CONCURRENT_STREAMS
        this.peerMaxStreams = value;
        return;
      case 0x4: { // INITIAL_WINDOW_SIZE: applies to the open streams by its difference
        if (value > MAX_WINDOW) throw new ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE over 2^31-1");
        const delta = value - this.peerInitialWindow;
        this.peerInitialWindow = value;
        for (const call of this.calls.values()) call.sendWindow += delta;
        return;
      }
      case 0x5: // MAX_FRAME_SIZE
        if (value < DEFAULT_FRAME_SIZE || value > 2 ** 24 - 1) throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range");
        this.peerFrameSize = value;
        return;
      default:
        return; // HEADER_TABLE_SIZE: the encoder never indexes; the rest do not concern a client
    }
  }

  private onHeaders(streamId: number, endStream: boolean, block: Buffer): void {
    // Decoded even for a stream we reset: the dynamic table must see every block.
    const fields = this.decoder.decode(block);
    const call = this.calls.get(streamId);
    if (!call) return;
    const headers = toHeaders(fields);
    if (!call.headersSeen) {
      call.headersSeen = true;
      call.httpStatus = Number(headers[":status"]);
      if (headers["grpc-status"] !== undefined) call.statusHeaders = headers; // trailers-only
    } else {
      call.statusHeaders = headers;
    }
    if (endStream) this.complete(call);
  }

  /** The server ended the stream: the call's outcome from what it sent. */
  private complete(call: Call): void {
    if (call.statusHeaders) {
      const error = statusError(call.statusHeaders);
      if (error) this.finish(call, error);
      else this.finish(call, ...responseMessage(call.chunks, call.received, call.statusHeaders));
    } else if (call.httpStatus !== 0 && call.httpStatus !== 200) {
      this.finish(call, new RpcError(...httpStatusCode(call.httpStatus)));
    } else {
      this.finish(call, new RpcError(GrpcStatus.INTERNAL, "Stream ended without a gRPC status"));
    }
  }

  private finish(call: Call, error: RpcError | undefined, message?: Uint8Array): void {
    this.calls.delete(call.id);
    this.blocked.delete(call);
    call.done = true;
    call.settle(error, message);
    if (this.closing && this.calls.size === 0) this.socket.end();
    else this.next();
  }

  private failWaiting(details: string): void {
    for (const call of this.waiting.splice(0)) {
      call.done = true;
      call.settle(new RpcError(GrpcStatus.UNAVAILABLE, details));
    }
  }

  /** A connection error of ours (RFC 9113 5.4.1): GOAWAY, then the calls fail with the reason. */
  private fail(code: ErrorCode, details: string): void {
    // Last stream id 0: a client processes no server-initiated streams.
    const goaway = Buffer.concat([u32(0), u32(code)]);
    this.socket.end(frame(Frame.GOAWAY, 0, 0, goaway));
    this.lost(`HTTP/2 protocol error: ${details}`, undefined, GrpcStatus.INTERNAL);
    this.socket.destroy();
  }

  /** The connection is gone: every call on it fails. */
  private lost(details: string, cause?: Error, code: GrpcStatus = GrpcStatus.UNAVAILABLE): void {
    this.closing = true;
    this.onGone(this);
    const calls = [...this.calls.values()];
    this.calls.clear();
    this.blocked.clear();
    for (const call of calls) {
      call.done = true;
      call.settle(new RpcError(code, details, new Metadata(), cause ? { cause } : undefined));
    }
    this.failWaiting(details);
  }
}

class ProtocolError extends Error {
  constructor(readonly code: ErrorCode, message: string) {
    super(message);
  }
}

function unpad(flags: number, payload: Buffer): Buffer {
  if (!(flags & Flag.PADDED)) return payload;
  const padding = payload[0]!;
  if (padding >= payload.length) throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame");
  return payload.subarray(1, payload.length - padding);
}

/** Fields as node:http2 presents them: one string per name, an array when repeated. */
function toHeaders(fields: HeaderFields): ResponseHeaders {
  const headers: ResponseHeaders = {};
  for (const [name, value] of fields) {
    const seen = headers[name];
    if (seen === undefined) headers[name] = value;
    else if (Array.isArray(seen)) seen.push(value);
    else headers[name] = [seen, value];
  }
  return headers;
}

/** Header names a call's metadata cannot set: the transport's own and HTTP/2's connection headers. */
const RESERVED = new Set(["content-type", "te", "user-agent", "grpc-timeout", "authorization", "x-tenant-id", "connection", "host"]);

export class H2Transport {
  private connection: Connection | undefined;
  private closed = false;
  private readonly authority: string;
  /** `:method`, `:scheme`: the block's constant start. */
  private readonly head: Buffer;
  /** `:authority` and the client's headers, after `:path`. */
  private readonly tail: Buffer;
  private readonly paths = new Map<string, Buffer>();

  constructor(private readonly options: Http2TransportOptions, baseHeaders: Record<string, string>) {
    const { host, port } = options.target;
    this.authority = options.serverNameOverride ?? (net.isIPv6(host) ? `[${host}]:${port}` : `${host}:${port}`);
    this.head = Buffer.concat([encodeField(":method", "POST"), encodeField(":scheme", options.tls ? "https" : "http")]);
    this.tail = Buffer.concat([
      encodeField(":authority", this.authority),
      ...Object.entries(baseHeaders).map(([name, value]) => encodeField(name, value)),
    ]);
  }

  /** Sends one request message and resolves to the response message's bytes. */
  unary(call: UnaryCall): Promise<Uint8Array> {
    return new Promise<Uint8Array>((resolve, reject) => {
      const deadline = Date.now() + call.deadlineMs;
      let unwatch: (() => void) | undefined;
      const settle = (error: RpcError | undefined, message?: Uint8Array): void => {
        unwatch?.();
        if (error) reject(error);
        else resolve(message!);
      };
      const body = Buffer.allocUnsafe(5 + call.body.length);
      body[0] = 0; // not compressed
      body.writeUInt32BE(call.body.length, 1);
      body.set(call.body, 5);
      const active = new Call(this.headerBlock(call, deadline), body, settle);
      let connection: Connection;
      try {
        connection = this.connect();
      } catch (err) {
        reject(new RpcError(GrpcStatus.UNAVAILABLE, errorText(err), new Metadata(), { cause: err }));
        return;
      }
      const cancel = (code: GrpcStatus, details: string): void => {
        if (active.done) return;
        connection.cancel(active);
        settle(new RpcError(code, details));
      };
      unwatch = watchCall(deadline, call.signal, cancel);
      // A deadline already past has settled the call: nothing goes out.
      if (!active.done) connection.start(active);
    });
  }

  /** Closes the connection; calls in flight end with `UNAVAILABLE`, later calls fail likewise. */
  close(): void {
    this.closed = true;
    this.connection?.close();
    this.connection = undefined;
  }

  private headerBlock(call: UnaryCall, deadline: number): Buffer {
    let path = this.paths.get(call.path);
    if (path === undefined) {
      path = encodeField(":path", call.path);
      this.paths.set(call.path, path);
    }
    const parts = [this.head, path, this.tail, encodeField("grpc-timeout", grpcTimeout(deadline - Date.now()))];
    if (call.metadata) {
      for (const [name, value] of Object.entries(call.metadata.toHttp2Headers())) {
        if (RESERVED.has(name) || name.startsWith(":")) continue;
        for (const v of Array.isArray(value) ? value : [value]) parts.push(encodeField(name, String(v)));
      }
    }
    return Buffer.concat(parts);
  }

  /** The shared connection, dialling when there is none or the last one went away. */
  private connect(): Connection {
    if (this.closed) throw new Error("the client was closed");
    const current = this.connection;
    if (current && current.usable) return current;
    if (current && current.idle) current.close();
    const socket = dial(this.options);
    if (socket instanceof tls.TLSSocket) {
      socket.once("secureConnect", () => {
        // A server that did not pick h2 would read our preface as garbage.
        if (socket.alpnProtocol !== "h2") socket.destroy(new Error("the server did not negotiate HTTP/2 (ALPN h2)"));
      });
    }
    const connection = new Connection(socket, (gone) => {
      if (this.connection === gone) this.connection = undefined;
    });
    this.connection = connection;
    return connection;
  }
}
