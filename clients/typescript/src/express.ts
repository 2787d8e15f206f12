/**
 * Express middleware: `idemd proxy`'s `Idempotency-Key` contract in process.
 *
 *   app.use(idempotency(client, { routes: [{ path: "/v1/payments/{id}" }] }));
 *   app.post("/v1/payments/:id", (req, res) => res.status(201).json(charge(req.body)));
 *   app.use(idempotencyErrors()); // after the routes: a handler's error leaves the key UNKNOWN
 *
 * Mount it before any body parser: for a request it makes idempotent it reads the body once
 * (up to `maxRequestBytes`, else 413) and fills `req.body` as `express.json()`, `express.text()`
 * and `express.urlencoded()` would (and `req.rawBody` with the bytes), so those parsers leave it
 * alone. Mounted after one, it finds the body already read and answers 500 `middleware_order`
 * (logged once) without claiming the key. The handler's answer is buffered, stored and sent;
 * `req.idemd` is its {@link HandlerContext} (for `downstreamKey`). Express has no dependency
 * here: any Connect-style app works.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { IdemdClient } from "./client";
import type { HandlerContext, HeaderList } from "./executor";
import { AppFailed, handle, Middleware, type Answer, type IdempotencyOptions } from "./http";
import { readRequestBody } from "./node-http";

/** Where {@link idempotencyErrors} leaves a handler's error for the middleware. */
const FAILED = Symbol.for("idemd.failed");

type Next = (error?: unknown) => void;
type Req = IncomingMessage & { body?: unknown; rawBody?: Buffer; idemd?: HandlerContext; _body?: boolean; originalUrl?: string; [FAILED]?: unknown };

/** The middleware. */
export function idempotency(client: IdemdClient, options: IdempotencyOptions = {}) {
  const middleware = new Middleware(client, options,
    "mount app.use(idempotency(...)) before any body parser (express.json(), express.raw(), express.text(), express.urlencoded()) and anything else that reads the request");
  return (req: Req, res: ServerResponse, next: Next): void => {
    const target = req.originalUrl ?? req.url ?? "/";
    const path = target.split("?", 1)[0]!;
    handle(
      middleware,
      { method: req.method ?? "GET", path, target, header: (name) => headerOf(req, name) },
      (limit) => readRequestBody(req, req, limit),
      (body, context) => {
        req.rawBody = body;
        req.body = parsed(body, headerOf(req, "content-type"));
        req._body = true; // body-parser's "already parsed" mark
        req.idemd = context;
        const answered = capture(res);
        next();
        return answered.then((answer) => {
          if (req[FAILED] !== undefined) throw new AppFailed(answer, req[FAILED]);
          return answer;
        });
      },
    ).then(
      (outcome) => (outcome.kind === "pass" ? next() : send(res, outcome.answer)),
      (error) => next(error),
    );
  };
}

/**
 * Error middleware, mounted after the routes: records a handler's error so the key is left
 * UNKNOWN (or released, for a NoSideEffectError) while Express still answers its error page.
 */
export function idempotencyErrors() {
  return (error: unknown, req: Req, _res: ServerResponse, next: Next): void => {
    req[FAILED] = error;
    next(error);
  };
}

function headerOf(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** The body as Express's body parsers would give it. */
function parsed(body: Buffer, contentType: string | undefined): unknown {
  const type = (contentType ?? "").split(";", 1)[0]!.trim().toLowerCase();
  if (type === "application/json" || type.endsWith("+json")) {
    if (body.length === 0) return {};
    try {
      return JSON.parse(body.toString("utf8"));
    } catch {
      return undefined; // the handler sees req.rawBody and decides
    }
  }
  if (type.startsWith("text/")) return body.toString("utf8");
  if (type === "application/x-www-form-urlencoded") return Object.fromEntries(new URLSearchParams(body.toString("utf8")));
  return body;
}

/** Buffers what the app writes to `res` until it ends, then restores `res`. */
function capture(res: ServerResponse): Promise<Answer> {
  const chunks: Buffer[] = [];
  const original = { writeHead: res.writeHead, write: res.write, end: res.end };
  const piece = (chunk: unknown, encoding?: unknown): void => {
    if (chunk === undefined || chunk === null || typeof chunk === "function") return;
    chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8"));
  };
  return new Promise((resolve) => {
    res.writeHead = function (this: ServerResponse, status: number, ...rest: unknown[]) {
      res.statusCode = status;
      const headers = rest.find((r) => typeof r === "object" && r !== null) as Record<string, unknown> | unknown[] | undefined;
      if (Array.isArray(headers)) {
        for (let i = 0; i + 1 < headers.length; i += 2) res.appendHeader(String(headers[i]), String(headers[i + 1]));
      } else if (headers) {
        for (const [name, value] of Object.entries(headers)) res.setHeader(name, value as string);
      }
      return res;
    } as typeof res.writeHead;
    res.write = function (chunk: unknown, encoding?: unknown, callback?: unknown) {
      piece(chunk, encoding);
      const done = [encoding, callback].find((f) => typeof f === "function") as (() => void) | undefined;
      done?.();
      return true;
    } as typeof res.write;
    res.end = function (chunk?: unknown, encoding?: unknown, callback?: unknown) {
      piece(chunk, encoding);
      Object.assign(res, original);
      resolve({ status: res.statusCode, headers: headerList(res), body: Buffer.concat(chunks) });
      const done = [chunk, encoding, callback].find((f) => typeof f === "function") as (() => void) | undefined;
      done?.();
      return res;
    } as typeof res.end;
  });
}

function headerList(res: ServerResponse): HeaderList {
  const list: HeaderList = [];
  for (const [name, value] of Object.entries(res.getHeaders())) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) list.push([name, String(v)]);
  }
  return list;
}

/**
 * Sends an answer on `res`. Headers that middleware before this one set (CORS, security headers)
 * stay, unless the answer has a header of the same name, which replaces them.
 */
export function send(res: ServerResponse, answer: Answer): void {
  const grouped = new Map<string, string[]>();
  for (const [name, value] of answer.headers) {
    const lower = name.toLowerCase();
    if (lower === "content-length" || lower === "transfer-encoding" || lower === "connection") continue;
    grouped.set(lower, [...(grouped.get(lower) ?? []), value]);
  }
  for (const [name, values] of grouped) res.setHeader(name, values.length === 1 ? values[0]! : values);
  res.setHeader("content-length", answer.body.length);
  res.statusCode = answer.status;
  res.end(answer.body);
}
