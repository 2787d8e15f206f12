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
 */
import type { IdemdClient } from "./client";
import type { HandlerContext, HeaderList } from "./executor";
import { BODY_READ_BEFORE, handle, Middleware, type IdempotencyOptions } from "./http";

/** A Web-standard handler; `idemd` is set when the request was claimed (for `downstreamKey`). */
export type FetchHandler = (request: Request, idemd?: HandlerContext) => Response | Promise<Response>;

export function withIdempotency(client: IdemdClient, options: IdempotencyOptions, handler: FetchHandler) {
  const middleware = new Middleware(client, options,
    "pass the Request to withIdempotency's wrapper before anything reads its body (request.json(), text(), arrayBuffer(), formData() or a reader of request.body)");
  return async (request: Request): Promise<Response> => {
    const url = new URL(request.url);
    const outcome = await handle(
      middleware,
      {
        method: request.method,
        path: url.pathname,
        target: url.pathname + url.search,
        header: (name) => request.headers.get(name) ?? undefined,
      },
      async (limit) => {
        // A Request without a body (body null) is never bodyUsed; one with Content-Length 0 lost
        // nothing when it was read (as in node-http.ts's readRequestBody).
        if (request.bodyUsed || request.body?.locked) {
          return request.headers.get("content-length") === "0" ? Buffer.alloc(0) : BODY_READ_BEFORE;
        }
        const declared = Number(request.headers.get("content-length") ?? NaN);
        if (declared > limit) return null;
        const body = Buffer.from(await request.arrayBuffer());
        return body.length > limit ? null : body;
      },
      async (body, context) => {
        const inner = new Request(request.url, {
          method: request.method,
          headers: request.headers,
          body: body.length > 0 || !["GET", "HEAD"].includes(request.method.toUpperCase()) ? body : undefined,
          signal: request.signal,
        });
        const response = await handler(inner, context);
        const headers: HeaderList = [];
        response.headers.forEach((value, name) => {
          if (name !== "set-cookie") headers.push([name, value]);
        });
        for (const cookie of response.headers.getSetCookie()) headers.push(["set-cookie", cookie]);
        return { status: response.status, headers, body: Buffer.from(await response.arrayBuffer()) };
      },
    );
    if (outcome.kind === "pass") return handler(request);
    const headers = new Headers();
    for (const [name, value] of outcome.answer.headers) headers.append(name, value);
    headers.delete("content-length");
    return new Response(outcome.answer.body.length > 0 ? outcome.answer.body : null, {
      status: outcome.answer.status,
      headers,
    });
  };
}
