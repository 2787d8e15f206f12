/**
 * A wrapper for Web-standard `Request → Response` handlers (Hono, Next.js route handlers,
 * Bun.serve, Deno.serve): `idemd proxy`'s `Idempotency-Key` contract in process.
 *
 *   export const POST = withIdempotency(client, { routes: [{ path: "/v1/payments" }] },
 *     async (request, idemd) => Response.json(await charge(await request.json(), idemd), { status: 201 }));
 *
 * The body is read once (up to `maxRequestBytes`, else 413) and the handler gets a Request
 * with the same bytes; its Response is buffered, stored and returned. A handler that throws
 * leaves the key UNKNOWN (released for a NoSideEffectError) and the error propagates. A Request
 * whose body was already read (`bodyUsed`, or its stream locked by a reader) is answered 500
 * `middleware_order` (logged once) without claiming the key.
 *
 * Per request this wrapper builds what the Web API leaves no way around (a Request for the
 * handler, which follows the original's abort signal, and the Response it returns) and as
 * little else as it can: each Request, Response and body stream costs tens of microseconds in
 * Node's undici (docs/sdk.md), so bodies are read with a stream reader rather than
 * `arrayBuffer()`, and the handler's Request is made from the original rather than from its URL
 * and copied headers.
 */
import type { IdemdClient } from "./client";
import type { HandlerContext, HeaderList } from "./executor";
import { BODY_READ_BEFORE, handle, Middleware, type Answer, type IdempotencyOptions } from "./http";

/** A Web-standard handler; `idemd` is set when the request was claimed (for `downstreamKey`). */
export type FetchHandler = (request: Request, idemd?: HandlerContext) => Response | Promise<Response>;

export function withIdempotency(client: IdemdClient, options: IdempotencyOptions, handler: FetchHandler) {
  const middleware = new Middleware(client, options,
    "pass the Request to withIdempotency's wrapper before anything reads its body (request.json(), text(), arrayBuffer(), formData() or a reader of request.body)");
  return async (request: Request): Promise<Response> => {
    const url = new URL(request.url);
    const requestHeaders = request.headers;
    const outcome = await handle(
      middleware,
      {
        method: request.method,
        path: url.pathname,
        target: url.pathname + url.search,
        header: (name) => requestHeaders.get(name) ?? undefined,
      },
      async (limit) => {
        // A Request without a body (body null) is never bodyUsed; one with Content-Length 0 lost
        // nothing when it was read (as in node-http.ts's readRequestBody).
        if (request.bodyUsed || request.body?.locked) {
          return requestHeaders.get("content-length") === "0" ? Buffer.alloc(0) : BODY_READ_BEFORE;
        }
        const declared = Number(requestHeaders.get("content-length") ?? NaN);
        if (declared > limit) return null;
        // Neither used nor locked (checked above): read as is.
        const body = request.body === null ? Buffer.alloc(0) : await streamBytes(request.body);
        return body.length > limit ? null : body;
      },
      async (body, context) => {
        const response = await handler(innerRequest(request, body), context);
        const headers: HeaderList = [];
        const responseHeaders = response.headers;
        responseHeaders.forEach((value, name) => {
          if (name !== "set-cookie") headers.push([name, value]);
        });
        for (const cookie of responseHeaders.getSetCookie()) headers.push(["set-cookie", cookie]);
        return { status: response.status, headers, body: await responseBytes(response) };
      },
    );
    if (outcome.kind === "pass") return handler(request);
    return responseOf(outcome.answer);
  };
}

/**
 * The Request the handler gets: the original's method, URL, headers and abort signal, with the
 * body that was read. Made from the original Request itself, which copies its header list as
 * is (no per-header validation) and follows its signal, as the spec's constructor does for a
 * Request input; a Request of another implementation is rebuilt from its URL and headers.
 */
function innerRequest(request: Request, body: Buffer): Request {
  const init: RequestInit = {
    body: body.length > 0 || !["GET", "HEAD"].includes(request.method.toUpperCase()) ? body : undefined,
  };
  if (request instanceof Request) {
    try {
      return new Request(request, init);
    } catch {
      // Not this runtime's own Request after all: rebuilt below.
    }
  }
  return new Request(request.url, { method: request.method, headers: request.headers, body: init.body, signal: request.signal });
}

/**
 * A Response's bytes, as `arrayBuffer()` reads them (a used body throws its TypeError), read with
 * the stream's own reader when it has one.
 */
async function responseBytes(response: Response): Promise<Buffer> {
  const stream = response.body;
  if (stream === null) return Buffer.alloc(0);
  if (response.bodyUsed || stream.locked || typeof stream.getReader !== "function") {
    return Buffer.from(await response.arrayBuffer());
  }
  return streamBytes(stream);
}

/**
 * An unlocked stream's bytes to its end: what `arrayBuffer()` does, without its promise chain
 * per step and, for the usual single chunk, without a copy (the chunk is the stream's own).
 */
async function streamBytes(stream: ReadableStream<Uint8Array>): Promise<Buffer> {
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (!(value instanceof Uint8Array)) throw new TypeError("Received non-Uint8Array chunk");
    chunks.push(value);
    total += value.byteLength;
  }
  if (chunks.length === 1) return Buffer.from(chunks[0]!.buffer, chunks[0]!.byteOffset, chunks[0]!.byteLength);
  return Buffer.concat(chunks, total);
}

/** The Response of an answer (its Content-Length is the runtime's to set). */
function responseOf(answer: Answer): Response {
  const headers: Array<[string, string]> = [];
  for (const pair of answer.headers) {
    if (pair[0].toLowerCase() !== "content-length") headers.push(pair);
  }
  return new Response(answer.body.length > 0 ? answer.body : null, { status: answer.status, headers });
}
