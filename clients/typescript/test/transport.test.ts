/**
 * The client's own unary transport (src/transport.ts: `node:http2`, the default, `"node-http2"`,
 * also named `"http2"`): what it must do that grpc-js did for it. Protocol edge cases against a
 * scripted `node:http2` server (trailers-only errors with a percent-encoded message and binary
 * details, HTTP errors, resets, a server that never answers, one session for many calls, headers
 * over CONTINUATION frames and from HPACK's dynamic table, messages larger than the flow-control
 * windows both ways, the server's stream limit before and after its SETTINGS, GOAWAY and refused
 * streams moved to a new connection, PING); an HTTP CONNECT proxy from the options and from
 * grpc_proxy / https_proxy / no_proxy; keepalive PINGs closing a connection that went silent;
 * deadlines, cancellation and a restart against the real idemd.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";
import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { Metadata } from "@grpc/grpc-js";
import { GrpcStatus, IdemdClient, RpcError, v1 } from "../src";
import { proxyFor } from "../src/transport";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { ENDPOINT, PAYMENT } from "./support/payment";

/** A google.rpc.Status with one ErrorInfo{reason, domain "idemd"} in its details. */
function statusDetails(reason: string): Buffer {
  const ld = (field: number, bytes: Buffer): Buffer => Buffer.concat([Buffer.from([(field << 3) | 2, bytes.length]), bytes]);
  const info = Buffer.concat([ld(1, Buffer.from(reason)), ld(2, Buffer.from("idemd"))]);
  const any = Buffer.concat([ld(1, Buffer.from("type.googleapis.com/google.rpc.ErrorInfo")), ld(2, info)]);
  return Buffer.concat([Buffer.from([0x08, 9]), ld(3, any)]);
}

type Script = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, body: Buffer) => void;

/** An h2c server that answers every call with `script`; counts sessions and keeps the requests. */
async function scriptedServer(script: Script, settings: http2.Settings = {}) {
  const requests: Array<{ headers: http2.IncomingHttpHeaders; body: Buffer }> = [];
  const sessions: http2.ServerHttp2Session[] = [];
  const server = http2.createServer({ settings });
  server.on("session", (session) => sessions.push(session));
  server.on("stream", (stream, headers) => {
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => {
      const body = Buffer.concat(chunks);
      requests.push({ headers, body });
      script(stream, headers, body);
    });
    stream.on("error", () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    address: `127.0.0.1:${port}`,
    requests,
    sessions: () => sessions.length,
    session: (i: number) => sessions[i]!,
    close: () => new Promise<void>((resolve) => {
      server.close(() => resolve());
      // Sessions left open by clients would keep close() waiting.
      for (const s of sessions) s.destroy();
    }),
  };
}

function rejectsWith(code: GrpcStatus, check?: (err: RpcError) => void) {
  return (err: unknown): boolean => {
    assert.ok(err instanceof RpcError, `an RpcError, got ${String(err)}`);
    assert.equal(err.codeName, GrpcStatus[code]);
    check?.(err);
    return true;
  };
}

/** A gRPC answer of one message and an OK status. */
function answerWith(stream: http2.ServerHttp2Stream, message: Uint8Array): void {
  stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
  const frame = Buffer.alloc(5 + message.length);
  frame.writeUInt32BE(message.length, 1);
  frame.set(message, 5);
  stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
  stream.end(frame);
}

const NOT_FOUND = { ":status": 200, "content-type": "application/grpc", "grpc-status": "5" };

test("the default transport is node:http2 (also under its old name, http2)", async () => {
  // The module object itself (the compiled imports read through to it), not an import's copy.
  const nodeHttp2 = createRequire(__filename)("node:http2") as { connect: typeof http2.connect };
  const connect = nodeHttp2.connect;
  let connects = 0;
  nodeHttp2.connect = ((...args: Parameters<typeof http2.connect>) => {
    connects += 1;
    return connect(...args);
  }) as typeof http2.connect;
  const server = await scriptedServer((stream) => stream.respond(NOT_FOUND, { endStream: true }));
  const byDefault = new IdemdClient({ address: server.address, tls: false });
  const oldName = new IdemdClient({ address: server.address, tls: false, transport: "http2" });
  try {
    await assert.rejects(byDefault.lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
    assert.equal(connects, 1, "the default transport is node:http2");
    await assert.rejects(oldName.lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
    assert.equal(connects, 2, "transport http2 is node:http2");
  } finally {
    nodeHttp2.connect = connect;
    byDefault.close();
    oldName.close();
    await server.close();
  }
});

for (const transport of ["node-http2"] as const) {
describe(`${transport} transport against a scripted server`, () => {
  const clients: IdemdClient[] = [];
  const client = (address: string, options: Partial<ConstructorParameters<typeof IdemdClient>[0]> = {}): IdemdClient => {
    const c = new IdemdClient({ address, tls: false, token: "t0k", tenantId: "acme", transport, ...options });
    clients.push(c);
    return c;
  };
  after(() => clients.forEach((c) => c.close()));

  test("a trailers-only error: code, percent-decoded message, ErrorInfo from grpc-status-details-bin", async () => {
    const server = await scriptedServer((stream) => {
      stream.respond({
        ":status": 200,
        "content-type": "application/grpc",
        "grpc-status": "9",
        "grpc-message": "lease lost: caf%C3%A9 100%25",
        "grpc-status-details-bin": statusDetails("LEASE_LOST").toString("base64"),
      }, { endStream: true });
    });
    try {
      await assert.rejects(client(server.address).lookup({ endpoint: ENDPOINT, key: "k" }),
        rejectsWith(GrpcStatus.FAILED_PRECONDITION, (err) => {
          assert.equal(err.details, "lease lost: café 100%");
          assert.equal(err.reason, "LEASE_LOST");
          assert.equal(err.domain, "idemd");
          assert.deepEqual(err.metadata.get("grpc-status"), [], "the status is not left in the metadata");
        }));
    } finally {
      await server.close();
    }
  });

  test("the request is gRPC: path, headers, grpc-timeout from the deadline, a length-prefixed message", async () => {
    const response = v1.LookupResponse.encode(v1.LookupResponse.fromPartial({ record: { key: "k", state: v1.State.STATE_COMPLETED } })).finish();
    const server = await scriptedServer((stream) => {
      stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
      const frame = Buffer.alloc(5 + response.length);
      frame.writeUInt32BE(response.length, 1);
      frame.set(response, 5);
      stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.end(frame);
    });
    try {
      const metadata = new Metadata();
      metadata.set("x-extra", "yes");
      const answer = await client(server.address).lookup({ endpoint: ENDPOINT, key: "k" }, { deadlineMs: 1500, metadata });
      assert.equal(answer.record?.state, v1.State.STATE_COMPLETED);
      const { headers, body } = server.requests[0]!;
      assert.equal(headers[":method"], "POST");
      assert.equal(headers[":path"], "/idemd.v1.Idempotency/Lookup");
      assert.equal(headers["content-type"], "application/grpc");
      assert.equal(headers.te, "trailers");
      assert.equal(headers.authorization, "Bearer t0k");
      assert.equal(headers["x-tenant-id"], "acme");
      assert.equal(headers["x-extra"], "yes");
      const timeout = /^(\d+)m$/.exec(String(headers["grpc-timeout"]));
      assert.ok(timeout && Number(timeout[1]) > 1000 && Number(timeout[1]) <= 1500, `grpc-timeout ${headers["grpc-timeout"]}`);
      assert.equal(body[0], 0, "not compressed");
      assert.equal(body.readUInt32BE(1), body.length - 5);
      assert.deepEqual(v1.LookupRequest.decode(body.subarray(5)), v1.LookupRequest.fromPartial({ endpoint: ENDPOINT, key: "k" }));
    } finally {
      await server.close();
    }
  });

  test("HTTP errors and resets map to grpc-js's codes", async () => {
    let answer: (stream: http2.ServerHttp2Stream) => void = () => {};
    const server = await scriptedServer((stream) => answer(stream));
    try {
      const c = client(server.address);
      answer = (s) => s.respond({ ":status": 503 }, { endStream: true });
      await assert.rejects(c.lookup({ key: "k" }), rejectsWith(GrpcStatus.UNAVAILABLE, (e) => assert.match(e.details, /HTTP status code 503/)));
      answer = (s) => s.close(http2.constants.NGHTTP2_REFUSED_STREAM); // every time: after its moves
      await assert.rejects(c.lookup({ key: "k" }), rejectsWith(GrpcStatus.UNAVAILABLE));
      answer = (s) => s.close(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
      await assert.rejects(c.lookup({ key: "k" }), rejectsWith(GrpcStatus.RESOURCE_EXHAUSTED));
      answer = (s) => s.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": "0" }, { endStream: true });
      await assert.rejects(c.lookup({ key: "k" }), rejectsWith(GrpcStatus.UNIMPLEMENTED, (e) => assert.equal(e.details, "No message received")));
    } finally {
      await server.close();
    }
  });

  test("a server that never answers: DEADLINE_EXCEEDED at the deadline, the stream reset", async () => {
    const streams: http2.ServerHttp2Stream[] = [];
    const server = await scriptedServer((stream) => streams.push(stream));
    try {
      const started = Date.now();
      await assert.rejects(client(server.address).lookup({ key: "k" }, { deadlineMs: 300 }), rejectsWith(GrpcStatus.DEADLINE_EXCEEDED));
      const took = Date.now() - started;
      assert.ok(took >= 290 && took < 3000, `rejected after ${took} ms`);
      await new Promise((resolve) => setTimeout(resolve, 100));
      assert.equal(streams[0]?.rstCode, http2.constants.NGHTTP2_CANCEL, "the server saw the call cancelled");
    } finally {
      await server.close();
    }
  });

  test("an aborted call fails with CANCELLED; an already aborted signal rejects with its reason", async () => {
    const server = await scriptedServer(() => {});
    try {
      const c = client(server.address);
      const controller = new AbortController();
      const call = c.lookup({ key: "k" }, { signal: controller.signal });
      setTimeout(() => controller.abort(), 50);
      await assert.rejects(call, rejectsWith(GrpcStatus.CANCELLED));
      const reason = new Error("gone");
      await assert.rejects(c.lookup({ key: "k" }, { signal: AbortSignal.abort(reason) }), (err) => err === reason);
    } finally {
      await server.close();
    }
  });

  test("one session carries every call of a client, concurrent or not", async () => {
    const server = await scriptedServer((stream) => stream.respond({ ":status": 200, "grpc-status": "5" }, { endStream: true }));
    try {
      const c = client(server.address);
      for (let i = 0; i < 5; i++) await assert.rejects(c.lookup({ key: `k${i}` }), rejectsWith(GrpcStatus.NOT_FOUND));
      await Promise.all(Array.from({ length: 20 }, (_, i) =>
        assert.rejects(c.lookup({ key: `c${i}` }), rejectsWith(GrpcStatus.NOT_FOUND))));
      assert.equal(server.requests.length, 25);
      assert.equal(server.sessions(), 1);
    } finally {
      await server.close();
    }
  });

  test("an address it cannot dial is refused, and served by grpc-js by default", () => {
    assert.throws(() => new IdemdClient({ address: "unix:/tmp/idemd.sock", tls: false, transport }), TypeError);
    new IdemdClient({ address: "unix:/tmp/idemd.sock", tls: false }).close();
  });

  test("headers over CONTINUATION frames, and from HPACK's dynamic table on the next call", async () => {
    // nghttp2 indexes what it sends, so the second answer refers to the first's entries.
    const big = "v".repeat(20_000); // over the 16 KiB frame: HEADERS + CONTINUATION
    const server = await scriptedServer((stream) => stream.respond({ ...NOT_FOUND, "grpc-message": "gone: caf%C3%A9", "x-big": big }, { endStream: true }));
    try {
      const c = client(server.address);
      for (let i = 0; i < 3; i++) {
        await assert.rejects(c.lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND, (err) => {
          assert.equal(err.details, "gone: café");
          assert.deepEqual(err.metadata.get("x-big"), [big]);
        }));
      }
      assert.equal(server.sessions(), 1);
    } finally {
      await server.close();
    }
  });

  test("a request larger than the server's flow-control windows is sent as they open", async () => {
    // node:http2's server starts with HTTP/2's default 64 KiB windows.
    const server = await scriptedServer((stream) => stream.respond(NOT_FOUND, { endStream: true }));
    try {
      const key = "k".repeat(1_000_000);
      await assert.rejects(client(server.address).lookup({ key }), rejectsWith(GrpcStatus.NOT_FOUND));
      assert.equal(v1.LookupRequest.decode(server.requests[0]!.body.subarray(5)).key, key);
    } finally {
      await server.close();
    }
  });

  test("answers larger than the client's windows, one after another on one connection", async () => {
    const key = "r".repeat(3_000_000); // two of them overrun the 4 MiB connection window
    const response = v1.LookupResponse.encode(v1.LookupResponse.fromPartial({ record: { key } })).finish();
    const server = await scriptedServer((stream) => answerWith(stream, response));
    try {
      const c = client(server.address);
      for (let i = 0; i < 3; i++) assert.equal((await c.lookup({ key: "k" })).record?.key, key);
      assert.equal(server.sessions(), 1);
    } finally {
      await server.close();
    }
  });

  test("no stream before the server's SETTINGS, never more than its MAX_CONCURRENT_STREAMS: the rest wait", async () => {
    let open = 0;
    let most = 0;
    const server = await scriptedServer((stream) => {
      open += 1;
      most = Math.max(most, open);
      setTimeout(() => {
        open -= 1;
        stream.respond(NOT_FOUND, { endStream: true });
      }, 20);
    }, { maxConcurrentStreams: 2 });
    try {
      const c = client(server.address);
      // The first calls of a new client: they wait for the SETTINGS rather than assume a limit.
      await Promise.all(Array.from({ length: 12 }, (_, i) => assert.rejects(c.lookup({ key: `c${i}` }), rejectsWith(GrpcStatus.NOT_FOUND))));
      assert.equal(server.requests.length, 12);
      assert.ok(most <= 2, `the server saw ${most} streams at once`);
      assert.equal(server.sessions(), 1);
    } finally {
      await server.close();
    }
  });

  test("GOAWAY: the calls the server took complete, those above its last stream move to a new connection", async () => {
    const goneAway = new Set<http2.Http2Session>();
    const answered: string[] = [];
    const server = await scriptedServer((stream, _headers, body) => {
      const session = stream.session!;
      // A server keeps its promise: nothing above the GOAWAY's last stream is processed.
      if (goneAway.has(session)) return;
      goneAway.add(session);
      session.goaway(http2.constants.NGHTTP2_NO_ERROR, stream.id!);
      answered.push(v1.LookupRequest.decode(body.subarray(5)).key);
      stream.respond(NOT_FOUND, { endStream: true });
    });
    try {
      const c = client(server.address);
      await Promise.all(Array.from({ length: 5 }, (_, i) => assert.rejects(c.lookup({ key: `g${i}` }), rejectsWith(GrpcStatus.NOT_FOUND))));
      assert.deepEqual([...answered].sort(), ["g0", "g1", "g2", "g3", "g4"], "each call answered once, none failed");
      assert.ok(server.sessions() >= 2, "the calls moved to a new connection");
    } finally {
      await server.close();
    }
  });

  test("GOAWAY between calls: the next call opens a new connection", async () => {
    const server = await scriptedServer((stream) => {
      if (server.requests.length === 1) stream.session!.goaway(http2.constants.NGHTTP2_NO_ERROR, stream.id);
      stream.respond(NOT_FOUND, { endStream: true });
    });
    try {
      const c = client(server.address);
      await assert.rejects(c.lookup({ key: "a" }), rejectsWith(GrpcStatus.NOT_FOUND));
      await new Promise((resolve) => setTimeout(resolve, 50));
      await assert.rejects(c.lookup({ key: "b" }), rejectsWith(GrpcStatus.NOT_FOUND));
      assert.equal(server.sessions(), 2);
    } finally {
      await server.close();
    }
  });

  test("a refused stream (REFUSED_STREAM) is sent again, not reported", async () => {
    let refusals = 0;
    const server = await scriptedServer((stream) => {
      if (refusals < 2) {
        refusals += 1;
        stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
        return;
      }
      stream.respond(NOT_FOUND, { endStream: true });
    });
    try {
      await assert.rejects(client(server.address).lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
      assert.equal(server.requests.length, 3);
    } finally {
      await server.close();
    }
  });

  test("a PING from the server is acknowledged", async () => {
    const server = await scriptedServer((stream) => stream.respond(NOT_FOUND, { endStream: true }));
    try {
      await assert.rejects(client(server.address).lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
      const rtt = await new Promise<number>((resolve, reject) =>
        server.session(0).ping((err, duration) => (err ? reject(err) : resolve(duration))));
      assert.ok(rtt >= 0);
    } finally {
      await server.close();
    }
  });
});

describe(`${transport} transport against a live idemd`, () => {
  let server: IdemdServer;
  before(async () => {
    server = await startIdemd({ auth: false });
  });
  after(async () => {
    await server?.stop();
  });

  test("idemd stopped and started again on the same address: calls fail fast meanwhile, then the client reconnects", async () => {
    const client = new IdemdClient({ address: server.address, tenantId: "acme", tls: false, deadlineMs: 5_000, transport });
    try {
      const key = randomUUID();
      await assert.rejects(client.lookup({ endpoint: ENDPOINT, key }), rejectsWith(GrpcStatus.NOT_FOUND));
      await server.stop();
      const started = Date.now();
      await assert.rejects(client.lookup({ endpoint: ENDPOINT, key }), rejectsWith(GrpcStatus.UNAVAILABLE));
      assert.ok(Date.now() - started < 2_000, "a call with no server fails at once, not at its deadline");
      server = await startIdemd({ auth: false, listen: server.address });
      // The first call after the restart is answered by the new server: no retry, no error.
      await assert.rejects(client.lookup({ endpoint: ENDPOINT, key }), rejectsWith(GrpcStatus.NOT_FOUND));
      const result = await client.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => ({ status: 201 }) });
      assert.equal(result.replayed, false);
    } finally {
      client.close();
    }
  });

  test("a Claim that waits past its deadline ends by the deadline, not by the server-side wait", async () => {
    const client = new IdemdClient({ address: server.address, tenantId: "acme", tls: false, transport });
    try {
      const key = randomUUID();
      const first = await client.claim({ endpoint: ENDPOINT, key, attemptId: "a1", request: { method: "POST", path: "/p", body: Buffer.from("{}") } });
      assert.ok(first.claimed, "the first claim holds the key");
      const started = Date.now();
      await assert.rejects(
        client.claim(
          { endpoint: ENDPOINT, key, attemptId: "a2", request: { method: "POST", path: "/p", body: Buffer.from("{}") }, wait: { seconds: 10, nanos: 0 } },
          { deadlineMs: 300 },
        ),
        // idemd (tonic) ends a call whose grpc-timeout fired with CANCELLED "Timeout expired"
        // when its timer beats the client's.
        (err) => err instanceof RpcError && (err.code === GrpcStatus.DEADLINE_EXCEEDED || err.code === GrpcStatus.CANCELLED),
      );
      const took = Date.now() - started;
      assert.ok(took >= 250 && took < 3_000, `ended after ${took} ms`);
    } finally {
      client.close();
    }
  });
});
}

/** An HTTP CONNECT proxy: counts its tunnels. */
async function connectProxy() {
  let tunnels = 0;
  const sockets = new Set<net.Socket>();
  const proxy = http.createServer((_req, res) => res.writeHead(405).end());
  proxy.on("connect", (req: http.IncomingMessage, client: net.Socket, head: Buffer) => {
    tunnels += 1;
    const [host, port] = (req.url ?? "").split(":");
    const upstream = net.connect({ host, port: Number(port) }, () => {
      client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (head.length > 0) upstream.write(head);
      upstream.pipe(client);
      client.pipe(upstream);
    });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {});
    }
  });
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
    tunnels: () => tunnels,
    close: () => new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      proxy.close(() => resolve());
    }),
  };
}

describe("proxies and keepalive", () => {
  test("proxyFor chooses as grpc-js: grpc_proxy, https_proxy, http_proxy; no_grpc_proxy / no_proxy by suffix or CIDR", () => {
    assert.equal(proxyFor("idemd.internal", undefined, {}), undefined);
    assert.deepEqual(proxyFor("idemd.internal", undefined, { https_proxy: "http://p:3128", grpc_proxy: "http://g:8080" }), { host: "g", port: 8080 });
    assert.deepEqual(proxyFor("idemd.internal", undefined, { https_proxy: "http://u:p%40ss@p" }), { host: "p", port: 80, credentials: "u:p@ss" });
    assert.equal(proxyFor("idemd.internal", undefined, { https_proxy: "http://p:3128", no_proxy: "example.com,.internal" }), undefined);
    assert.equal(proxyFor("10.1.2.3", undefined, { https_proxy: "http://p:3128", no_proxy: "10.0.0.0/8" }), undefined);
    assert.deepEqual(proxyFor("11.1.2.3", undefined, { https_proxy: "http://p:3128", no_proxy: "10.0.0.0/8" }), { host: "p", port: 3128 });
    assert.equal(proxyFor("idemd.internal", false, { https_proxy: "http://p:3128" }), undefined);
    assert.deepEqual(proxyFor("idemd.internal", "http://q:1", { no_proxy: "*" }), { host: "q", port: 1 });
    assert.throws(() => proxyFor("idemd.internal", "https://q:1"), TypeError);
  });

  test("calls go through an HTTP CONNECT tunnel: the proxy option, https_proxy, and not for a no_proxy host", async () => {
    const server = await scriptedServer((stream) => stream.respond(NOT_FOUND, { endStream: true }));
    const proxy = await connectProxy();
    const saved = { https_proxy: process.env.https_proxy, no_proxy: process.env.no_proxy };
    const clients: IdemdClient[] = [];
    try {
      clients.push(new IdemdClient({ address: server.address, tls: false, proxy: proxy.url }));
      await assert.rejects(clients[0]!.lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
      assert.equal(proxy.tunnels(), 1);
      process.env.https_proxy = proxy.url;
      delete process.env.no_proxy;
      clients.push(new IdemdClient({ address: server.address, tls: false }));
      await assert.rejects(clients[1]!.lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
      assert.equal(proxy.tunnels(), 2, "https_proxy is honoured");
      process.env.no_proxy = "127.0.0.1";
      clients.push(new IdemdClient({ address: server.address, tls: false }));
      await assert.rejects(clients[2]!.lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
      assert.equal(proxy.tunnels(), 2, "no_proxy is honoured");
      assert.equal(server.requests.length, 3);
    } finally {
      for (const [name, value] of Object.entries(saved)) {
        if (value === undefined) delete process.env[name];
        else process.env[name] = value;
      }
      clients.forEach((c) => c.close());
      await proxy.close();
      await server.close();
    }
  });

  test("a proxy that refuses the tunnel fails the call with UNAVAILABLE, at once", async () => {
    const proxy = http.createServer();
    proxy.on("connect", (_req: http.IncomingMessage, socket: net.Socket) => socket.end("HTTP/1.1 403 Forbidden\r\n\r\n"));
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    const c = new IdemdClient({ address: "127.0.0.1:9", tls: false, proxy: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}` });
    try {
      await assert.rejects(c.lookup({ key: "k" }), rejectsWith(GrpcStatus.UNAVAILABLE, (e) => assert.match(e.details, /403/)));
    } finally {
      c.close();
      await new Promise<void>((resolve) => proxy.close(() => resolve()));
    }
  });

  test("keepalive PINGs: a connection that goes silent fails its call long before the deadline, then the client reconnects", async () => {
    const server = await scriptedServer((stream, _headers, body) => {
      if (v1.LookupRequest.decode(body.subarray(5)).key === "hang") return; // never answered
      stream.respond(NOT_FOUND, { endStream: true });
    });
    // A relay that can stop forwarding, as a dead NAT entry or a vanished peer would.
    let silent = false;
    const sockets: net.Socket[] = [];
    const relay = net.createServer((inbound) => {
      const outbound = net.connect(Number(server.address.split(":")[1]), "127.0.0.1");
      inbound.on("data", (d) => silent || outbound.write(d));
      outbound.on("data", (d) => silent || inbound.write(d));
      for (const s of [inbound, outbound]) {
        sockets.push(s);
        s.on("error", () => {});
        s.on("close", () => [inbound, outbound].forEach((o) => o.destroy()));
      }
    });
    await new Promise<void>((resolve) => relay.listen(0, "127.0.0.1", resolve));
    const c = new IdemdClient({
      address: `127.0.0.1:${(relay.address() as AddressInfo).port}`, tls: false, keepaliveMs: 100, keepaliveTimeoutMs: 200,
    });
    try {
      await assert.rejects(c.lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
      silent = true;
      const started = Date.now();
      await assert.rejects(c.lookup({ key: "hang" }, { deadlineMs: 10_000 }), rejectsWith(GrpcStatus.UNAVAILABLE));
      const took = Date.now() - started;
      assert.ok(took < 3_000, `the silent connection was noticed after ${took} ms`);
      silent = false;
      await assert.rejects(c.lookup({ key: "k" }), rejectsWith(GrpcStatus.NOT_FOUND));
      assert.equal(server.sessions(), 2);
    } finally {
      c.close();
      sockets.forEach((s) => s.destroy());
      await new Promise<void>((resolve) => relay.close(() => resolve()));
      await server.close();
    }
  });
});
