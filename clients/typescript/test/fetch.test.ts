/**
 * The Web-standard wrapper's own work, without idemd (a stand-in client whose executeOnce runs the
 * handler): what the handler's Request carries (the same bytes, method, URL and headers, and an
 * abort signal that follows the original's), a body read in several chunks, the 413 limit, the
 * answer's headers (set-cookie kept, Content-Length the runtime's), and a Request of another
 * implementation.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { withIdempotency, type IdemdClient } from "../src";
import type { ExecuteOnceOptions, ExecuteResult } from "../src/executor";

/** Runs the handler as a fresh claim would and keeps what executeOnce was asked. */
class StandIn {
  readonly calls: ExecuteOnceOptions[] = [];
  async executeOnce(options: ExecuteOnceOptions): Promise<ExecuteResult> {
    this.calls.push(options);
    const controller = new AbortController();
    const got = await options.handler({
      endpoint: options.endpoint, key: options.key, attempt: 1, signal: controller.signal, downstreamKey: (step) => `d-${step}`,
    });
    const body = got.body === undefined ? Buffer.alloc(0) : Buffer.from(got.body);
    return { replayed: false, attempt: 1, response: { status: got.status, headers: (got.headers ?? []) as Array<[string, string]>, body, bodyRef: "" } };
  }
}

const OPTIONS = { routes: [{ path: "/pay/{id}", maxRequestBytes: 16 }] };

test("the handler's Request: same bytes, method, URL, headers; its signal follows the original's", async () => {
  const standIn = new StandIn();
  const controller = new AbortController();
  let seen: Request | undefined;
  let bytes: Buffer | undefined;
  const wrapped = withIdempotency(standIn as unknown as IdemdClient, OPTIONS, async (request) => {
    seen = request;
    bytes = Buffer.from(await request.arrayBuffer());
    return new Response("ok", { status: 201, headers: [["x-a", "1"], ["set-cookie", "a=1"], ["set-cookie", "b=2"], ["content-length", "2"]] });
  });
  const original = new Request("http://example.test/pay/7?x=1&y=%20", {
    method: "POST",
    headers: { "idempotency-key": "k1", "content-type": "application/json", "x-trace": "t" },
    body: '{"amount":1}',
    signal: controller.signal,
  });
  const response = await wrapped(original);
  assert.equal(response.status, 201);
  assert.equal(await response.text(), "ok");
  assert.deepEqual(response.headers.getSetCookie(), ["a=1", "b=2"]);
  assert.equal(response.headers.get("x-a"), "1");
  assert.equal(response.headers.get("content-length"), null);
  assert.ok(seen && bytes);
  assert.notEqual(seen, original);
  assert.equal(bytes.toString(), '{"amount":1}');
  assert.equal(seen.method, "POST");
  assert.equal(seen.url, original.url);
  assert.deepEqual([...seen.headers], [...original.headers]);
  assert.equal(standIn.calls[0]!.request.path, "/pay/7?x=1&y=%20");
  assert.equal(Buffer.from(standIn.calls[0]!.request.body as Uint8Array).toString(), '{"amount":1}');
  assert.equal(seen.signal.aborted, false);
  controller.abort(new Error("client went away"));
  assert.equal(seen.signal.aborted, true);
  assert.equal((seen.signal.reason as Error).message, "client went away");
});

test("a body in several chunks is read whole; over maxRequestBytes it is 413 and the handler never runs", async () => {
  let runs = 0;
  const wrapped = withIdempotency(new StandIn() as unknown as IdemdClient, OPTIONS, async (request) => {
    runs++;
    return new Response(await request.text(), { status: 201 });
  });
  const streamed = (parts: string[]) => new Request("http://example.test/pay/1", {
    method: "POST",
    headers: { "idempotency-key": "k2" },
    body: new ReadableStream<Uint8Array>({
      start(controller) {
        for (const part of parts) controller.enqueue(new TextEncoder().encode(part));
        controller.close();
      },
    }),
    duplex: "half",
  } as RequestInit);
  const ok = await wrapped(streamed(["abc", "def", "gh"]));
  assert.equal(ok.status, 201);
  assert.equal(await ok.text(), "abcdefgh");
  const tooLarge = await wrapped(streamed(["0123456789", "0123456789"]));
  assert.equal(tooLarge.status, 413);
  assert.equal(runs, 1);
});

test("a Request of another implementation is rebuilt from its URL and headers", async () => {
  let seen: Request | undefined;
  const wrapped = withIdempotency(new StandIn() as unknown as IdemdClient, OPTIONS, async (request) => {
    seen = request;
    return new Response(await request.text(), { status: 201 });
  });
  const real = new Request("http://example.test/pay/2", { method: "POST", headers: { "idempotency-key": "k3" }, body: "xyz" });
  // Quacks like a Request, is none (as a polyfill's or another realm's would be).
  const foreign = {
    url: real.url, method: real.method, headers: real.headers, signal: real.signal,
    get body() { return real.body; }, get bodyUsed() { return real.bodyUsed; }, arrayBuffer: () => real.arrayBuffer(),
  } as unknown as Request;
  const response = await wrapped(foreign);
  assert.equal(response.status, 201);
  assert.equal(await response.text(), "xyz");
  assert.equal(seen?.headers.get("idempotency-key"), "k3");
});
