/**
 * Fastify plugin: `idemd proxy`'s `Idempotency-Key` contract in process.
 *
 *   await app.register(idempotencyPlugin, { client, routes: [{ path: "/v1/payments/{id}" }] });
 *
 * Registered without encapsulation (like fastify-plugin), so it covers every route of the
 * instance. In `preParsing` it reads the body once (up to `maxRequestBytes`, else 413), claims
 * the key and hands Fastify's parser the same bytes; the route's reply is captured in
 * `onSend`, stored and sent. A handler's error (`onError`) leaves the key UNKNOWN (released
 * for a NoSideEffectError) while Fastify answers its error reply. `request.idemd` is the
 * {@link HandlerContext} (for `downstreamKey`). Register it before any hook that reads the body
 * (an `onRequest` hook, or a `preParsing` hook that consumes the payload): if the payload it gets
 * was already read it answers 500 `middleware_order` (logged once, on `fastify.log` unless a
 * `logger` is given) without claiming the key. Fastify itself is not a dependency.
 */
import { Readable } from "node:stream";
import type { IdemdClient } from "./client";
import type { HandlerContext, HeaderList } from "./executor";
import { AppFailed, handle, Middleware, type Answer, type IdempotencyOptions } from "./http";
import { readRequestBody } from "./node-http";

export interface FastifyIdempotencyOptions extends IdempotencyOptions {
  client: IdemdClient;
}

/** Per request: the claimed run waiting for the route's reply. */
interface Pending {
  /** Resolves the app's answer (in onSend), or rejects with the app's failure. */
  settle: (answer: Answer) => void;
  /** The error Fastify reported in onError, if any. */
  error?: unknown;
  /** The whole run: the answer to send. */
  done: Promise<Answer | undefined>;
}

const PENDING = Symbol.for("idemd.pending");

/* eslint-disable @typescript-eslint/no-explicit-any -- Fastify's types are not a dependency. */
export function idempotencyPlugin(fastify: any, options: FastifyIdempotencyOptions, done: (error?: Error) => void): void {
  const middleware = new Middleware(options.client, options,
    "register idempotencyPlugin before any plugin or hook that reads the request body (an onRequest or preParsing hook that consumes the payload)",
    options.logger ?? fastify.log);

  fastify.addHook("preParsing", async (request: any, reply: any, payload: Readable) => {
    const target: string = request.raw.url ?? "/";
    let claimed!: (body: Buffer) => void;
    const whenClaimed = new Promise<Buffer>((resolve) => (claimed = resolve));
    let settle!: (answer: Answer) => void;
    const answered = new Promise<Answer>((resolve) => (settle = resolve));
    const pending: Pending = { settle, done: Promise.resolve(undefined) };
    const run = handle(
      middleware,
      {
        method: request.method,
        path: target.split("?", 1)[0]!,
        target,
        header: (name) => {
          const value = request.headers[name];
          return Array.isArray(value) ? value[0] : value;
        },
      },
      (limit) => readRequestBody(request.raw, payload, limit),
      (body, context: HandlerContext) => {
        request.idemd = context;
        request[PENDING] = pending;
        claimed(body);
        return answered.then((answer) => {
          if (pending.error !== undefined) throw new AppFailed(answer, pending.error);
          return answer;
        });
      },
    );
    pending.done = run.then((outcome) => (outcome.kind === "answer" ? outcome.answer : undefined));
    const first = await Promise.race([whenClaimed, run]);
    if (Buffer.isBuffer(first)) {
      // Claimed: Fastify parses the same bytes and runs the route.
      const replayed = Readable.from([first], { objectMode: false }) as Readable & { receivedEncodedLength?: number };
      replayed.receivedEncodedLength = first.length;
      return replayed;
    }
    if (first.kind === "pass") return payload;
    request[PENDING] = undefined;
    sendAnswer(reply, first.answer);
    return payload;
  });

  fastify.addHook("onError", async (request: any, _reply: any, error: unknown) => {
    const pending: Pending | undefined = request[PENDING];
    if (pending) pending.error = error;
  });

  fastify.addHook("onSend", async (request: any, reply: any, payload: unknown) => {
    const pending: Pending | undefined = request[PENDING];
    if (!pending) return payload;
    request[PENDING] = undefined;
    const body = await bodyOf(payload);
    const headers: HeaderList = [];
    for (const [name, value] of Object.entries(reply.getHeaders() as Record<string, unknown>)) {
      if (value === undefined) continue;
      for (const v of Array.isArray(value) ? value : [value]) headers.push([name, String(v)]);
    }
    pending.settle({ status: reply.statusCode, headers, body });
    const answer = await pending.done;
    if (answer !== undefined && answer.body !== body) {
      return answer.body;
    }
    return body;
  });
  done();
}
(idempotencyPlugin as any)[Symbol.for("skip-override")] = true;
(idempotencyPlugin as any)[Symbol.for("fastify.display-name")] = "idemd-idempotency";

async function bodyOf(payload: unknown): Promise<Buffer> {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(payload)) return payload;
  if (typeof payload === "string") return Buffer.from(payload);
  if (payload instanceof Readable) {
    const chunks: Buffer[] = [];
    for await (const chunk of payload) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
    return Buffer.concat(chunks);
  }
  return Buffer.from(String(payload));
}

function sendAnswer(reply: any, answer: Answer): void {
  const grouped = new Map<string, string[]>();
  for (const [name, value] of answer.headers) {
    const lower = name.toLowerCase();
    if (lower === "content-length" || lower === "transfer-encoding" || lower === "connection") continue;
    grouped.set(lower, [...(grouped.get(lower) ?? []), value]);
  }
  reply.code(answer.status);
  for (const [name, values] of grouped) reply.header(name, values.length === 1 ? values[0] : values);
  reply.send(answer.body);
}
