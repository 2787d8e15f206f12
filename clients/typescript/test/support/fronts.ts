/**
 * The scenarios' app (http-scenarios.md) in Express, Fastify and a Web-handler server, each with
 * the SDK's middleware when given a client and without it otherwise.
 */
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import express from "express";
import Fastify from "fastify";
import {
  IdemdClient,
  idempotency,
  idempotencyErrors,
  idempotencyPlugin,
  NoSideEffectError,
  withIdempotency,
  type HandlerContext,
} from "../../src";
import { answerOf, AppState, ROUTE_OPTIONS, SLOW_MS } from "./http-scenarios";

/** What the app throws for /crash/ and /crash-exposed/ (http-scenarios.md). */
export const CRASH_MESSAGE = "boom: secret-4711";

/** The app's behaviour by path (http-scenarios.md): throws for /crash/ and /norun/. */
async function behave(state: AppState, path: string, body: Buffer, idemd: HandlerContext | undefined) {
  const execution = state.count(path);
  if (path.includes("/slow/")) await sleep(SLOW_MS);
  if (path.startsWith("/crash/") || path.startsWith("/crash-exposed/")) throw new Error(CRASH_MESSAGE);
  if (path.startsWith("/norun/")) throw new NoSideEffectError("card rejected before charging");
  const answer = answerOf(path, execution, body);
  if (idemd) answer.headers.push(["x-downstream-key", idemd.downstreamKey("charge")]);
  return answer;
}

export type Front = { port: number; state: AppState; close: () => Promise<void> };

async function listen(server: http.Server, port = 0): Promise<number> {
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  return (server.address() as AddressInfo).port;
}

export async function expressFront(client: IdemdClient | undefined): Promise<Front> {
  const state = new AppState();
  const app = express();
  if (client) app.use(idempotency(client, ROUTE_OPTIONS));
  app.use(express.raw({ type: () => true, limit: "10mb" }));
  app.use(async (req, res) => {
    const request = req as typeof req & { rawBody?: Buffer; idemd?: HandlerContext };
    const body = request.rawBody ?? (Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0));
    const answer = await behave(state, req.path, body, request.idemd);
    res.status(answer.status);
    // Node's setHeader, not Express's set(), which would add a charset to content-type.
    const grouped = new Map<string, string[]>();
    for (const [name, value] of answer.headers) grouped.set(name, [...(grouped.get(name) ?? []), value]);
    for (const [name, values] of grouped) res.setHeader(name, values.length === 1 ? values[0]! : values);
    res.send(answer.body);
  });
  if (client) app.use(idempotencyErrors());
  const server = http.createServer(app);
  const port = await listen(server);
  return { port, state, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

export async function fastifyFront(client: IdemdClient | undefined): Promise<Front> {
  const state = new AppState();
  const app = Fastify();
  if (client) await app.register(idempotencyPlugin, { client, ...ROUTE_OPTIONS });
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "buffer", bodyLimit: 10 * 1024 * 1024 }, (_req, body, done) => done(null, body));
  app.all("/*", async (request, reply) => {
    const body = Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0);
    const answer = await behave(state, request.url.split("?")[0]!, body, (request as unknown as { idemd?: HandlerContext }).idemd);
    reply.code(answer.status);
    const grouped = new Map<string, string[]>();
    for (const [name, value] of answer.headers) grouped.set(name, [...(grouped.get(name) ?? []), value]);
    for (const [name, values] of grouped) reply.header(name, values.length === 1 ? values[0] : values);
    return answer.body;
  });
  await app.listen({ port: 0, host: "127.0.0.1" });
  const port = (app.server.address() as AddressInfo).port;
  return { port, state, close: () => app.close() };
}

export async function fetchFront(client: IdemdClient | undefined): Promise<Front> {
  const state = new AppState();
  const app = async (request: Request, idemd?: HandlerContext): Promise<Response> => {
    const body = Buffer.from(await request.arrayBuffer());
    const answer = await behave(state, new URL(request.url).pathname, body, idemd);
    const headers = new Headers();
    for (const [name, value] of answer.headers) headers.append(name, value);
    return new Response(answer.body, { status: answer.status, headers });
  };
  const handler = client ? withIdempotency(client, ROUTE_OPTIONS, app) : (r: Request) => app(r);
  return { ...(await serveFetch(handler)), state };
}

/**
 * A plain Node server in front of a Web handler: it turns IncomingMessage into a Web Request and
 * back, as Hono's and Next.js's Node adapters do; an exception is a 500.
 */
export async function serveFetch(handler: (request: Request) => Promise<Response>, port = 0): Promise<{ port: number; close: () => Promise<void> }> {
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
      for (const v of Array.isArray(value) ? value : [value ?? ""]) headers.append(name, v);
    }
    const method = req.method ?? "GET";
    const request = new Request(`http://${req.headers.host}${req.url}`, {
      method,
      headers,
      body: ["GET", "HEAD"].includes(method) ? undefined : Buffer.concat(chunks),
    });
    try {
      const response = await handler(request);
      const out: Record<string, string | string[]> = {};
      response.headers.forEach((value, name) => {
        if (name !== "set-cookie") out[name] = value;
      });
      const cookies = response.headers.getSetCookie();
      if (cookies.length > 0) out["set-cookie"] = cookies;
      const body = Buffer.from(await response.arrayBuffer());
      res.writeHead(response.status, { ...out, "content-length": String(body.length) });
      res.end(body);
    } catch {
      res.writeHead(500, { "content-type": "text/plain" });
      res.end("internal error");
    }
  });
  const bound = await listen(server, port);
  return {
    port: bound,
    close: () => {
      server.closeAllConnections(); // a request a broken front never answered must not hold the close
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

export const FRONTS = { express: expressFront, fastify: fastifyFront, fetch: fetchFront };

