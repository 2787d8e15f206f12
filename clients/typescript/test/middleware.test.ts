/**
 * The Express middleware, the Fastify plugin and the Web-standard wrapper, each inside a real
 * app of its framework over real HTTP against the live idemd: the shared HTTP scenarios
 * (clients/conformance/http-scenarios.json, which `idemd proxy`'s suite runs too), what the
 * middleware hands the app and what it stores of a handler's error; and each middleware mounted
 * AFTER something that reads the request body (the mistake that used to hang Express forever):
 * a 500 `middleware_order` problem at once, the app never run, the key never claimed, the mistake
 * logged once per middleware instance, and a request without a body not taken for a read one.
 */
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import type { Readable } from "node:stream";
import { after, before, describe, test } from "node:test";
import express from "express";
import Fastify from "fastify";
import {
  downstreamKey,
  IdemdClient,
  idempotency,
  idempotencyErrors,
  idempotencyPlugin,
  RpcError,
  v1,
  withIdempotency,
  type Logger,
} from "../src";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { CRASH_MESSAGE, FRONTS, serveFetch } from "./support/fronts";
import { runScenarios, send } from "./support/http-scenarios";

const ALICE = "conformance-token-alice-3f9a";
const OPTIONS = { routes: [{ path: "/v1/orders/{id}" }] };
const ENDPOINT = "POST /v1/orders/{id}";
/** Well past the 1 s the answer may take: without the detection the request never answers. */
const GIVE_UP_MS = 3_000;

/** A logger that keeps what it is given. */
class Recorder implements Logger {
  readonly errors: string[] = [];
  error(message: string): void {
    this.errors.push(message);
  }
  warn(): void {}
}

type App = { port: number; executions: () => number; close: () => Promise<void> };

/** `app.use(express.json())` mounted before the middleware: the reported mistake. */
async function expressParserFirst(client: IdemdClient, logger: Logger): Promise<App> {
  let executions = 0;
  const app = express();
  app.use(express.json());
  app.use(idempotency(client, { ...OPTIONS, logger }));
  app.post("/v1/orders/:id", (_req, res) => {
    executions++;
    res.status(201).json({ ok: true });
  });
  app.use(idempotencyErrors());
  const server = http.createServer(app);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as AddressInfo).port,
    executions: () => executions,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * A preParsing hook registered before the plugin that consumes the payload (e.g. to check a
 * signature over the raw bytes) and hands the spent stream on. Content-type parsers run after
 * every preParsing hook, so one cannot come before the plugin's; a hook reading the body can.
 */
async function fastifyReaderFirst(client: IdemdClient, logger: Logger): Promise<App> {
  let executions = 0;
  const app = Fastify({ forceCloseConnections: true });
  // Fastify's own JSON parser refuses an empty body (400); an app's may take it as {}.
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser("application/json", { parseAs: "string" }, (_request, body, done) => {
    try {
      done(null, body === "" ? {} : JSON.parse(body as string));
    } catch (error) {
      done(error as Error, undefined);
    }
  });
  app.addHook("preParsing", async (request, _reply, payload: Readable) => {
    const chunks: Buffer[] = [];
    for await (const chunk of payload) chunks.push(chunk as Buffer);
    (request as unknown as { signed: Buffer }).signed = Buffer.concat(chunks);
    return payload;
  });
  await app.register(idempotencyPlugin, { client, ...OPTIONS, logger });
  app.post("/v1/orders/:id", async (_request, reply) => {
    executions++;
    reply.code(201);
    return { ok: true };
  });
  await app.listen({ port: 0, host: "127.0.0.1" });
  return { port: (app.server.address() as AddressInfo).port, executions: () => executions, close: () => app.close() };
}

/** A wrapper that reads the Request's body (to log it) before handing it to withIdempotency. */
async function fetchReaderFirst(client: IdemdClient, logger: Logger): Promise<App> {
  let executions = 0;
  const idempotent = withIdempotency(client, { ...OPTIONS, logger }, async () => {
    executions++;
    return Response.json({ ok: true }, { status: 201 });
  });
  const server = await serveFetch(async (request) => {
    await request.text();
    return idempotent(request);
  });
  return { ...server, executions: () => executions };
}

const WRONG_ORDER = { express: expressParserFirst, fastify: fastifyReaderFirst, fetch: fetchReaderFirst };


describe("HTTP middleware", () => {
  let idemd: IdemdServer;
  let client: IdemdClient;

  before(async () => {
    idemd = await startIdemd();
    client = new IdemdClient({ address: idemd.address, token: ALICE, tls: false });
  });

  after(async () => {
    client?.close();
    await idemd?.stop();
  });

  for (const [name, start] of Object.entries(FRONTS)) {
    test(`${name}: the shared HTTP scenarios`, async () => {
      const front = await start(client);
      try {
        await runScenarios(front.port, (path) => front.state.of(path));
      } finally {
        await front.close();
      }
    });

    test(`${name}: the app gets the body byte for byte and its execution`, async () => {
      const front = await start(client);
      try {
        const key = randomBytes(8).toString("hex");
        const body = '{"amount": 4200,  "currency": "usd", "note": "café"}';
        const reply = await send(front.port, {
          method: "POST",
          path: "/v1/payments/b1",
          headers: [["idempotency-key", key], ["content-type", "application/json"]],
          body,
        }, "unused");
        assert.equal(reply?.status, 201);
        assert.equal(reply?.headers["x-body-sha256"], createHash("sha256").update(body).digest("hex"));
        assert.equal(reply?.headers["x-downstream-key"], downstreamKey(key, "charge"));
      } finally {
        await front.close();
      }
    });

    test(`${name}: a handler's error is stored as "<Kind>: <message>", where only operators read it`, async () => {
      const front = await start(client);
      try {
        const key = randomBytes(8).toString("hex");
        const request = { method: "POST", path: "/crash/r1", headers: [["idempotency-key", key]], body: "{}" };
        const first = await send(front.port, request, "unused");
        assert.ok(first === undefined || first.status >= 500, `${first?.status}`);
        const looked = await client.lookup({ endpoint: "POST /crash/r1", key });
        assert.equal(looked.record?.state, v1.State.STATE_UNKNOWN);
        assert.equal(looked.record?.reason, `Error: ${CRASH_MESSAGE}`);
        const retry = await send(front.port, request, "unused");
        assert.equal(retry?.status, 409);
        assert.deepEqual(Object.keys(JSON.parse(retry!.body.toString())), ["type", "title", "status", "detail", "state"]);
      } finally {
        await front.close();
      }
    });
  }

  for (const [name, start] of Object.entries(WRONG_ORDER)) {
    test(`${name} mounted after a body reader: 500 middleware_order at once, app not run, key not claimed, logged once`, async () => {
      const logger = new Recorder();
      const app = await start(client, logger);
      try {
        const key = randomBytes(8).toString("hex");
        const request = {
          method: "POST",
          path: "/v1/orders/o1",
          headers: [["idempotency-key", key], ["content-type", "application/json"]],
          body: '{"amount": 4200}',
        };
        for (const attempt of ["first", "retry"]) {
          const started = performance.now();
          const reply = await send(app.port, request, "unused", GIVE_UP_MS);
          const elapsed = performance.now() - started;
          assert.ok(reply, `${attempt}: no answer within ${GIVE_UP_MS} ms`);
          assert.ok(elapsed < 1_000, `${attempt}: answered after ${elapsed.toFixed(0)} ms`);
          assert.equal(reply.status, 500, `${attempt}: ${reply.body}`);
          assert.equal(reply.headers["content-type"], "application/problem+json");
          const problem = JSON.parse(reply.body.toString());
          assert.equal(problem.type, "https://idemd.dev/problems/middleware_order");
          assert.equal(problem.title, "Internal Server Error");
          assert.equal(problem.status, 500);
          assert.match(problem.detail, /^the request body was read before the idempotency middleware saw it; /);
        }
        assert.equal(app.executions(), 0);
        await assert.rejects(client.lookup({ endpoint: ENDPOINT, key }), (err) => err instanceof RpcError && err.codeName === "NOT_FOUND");
        assert.equal(logger.errors.length, 1, `logged ${JSON.stringify(logger.errors)}`);
        assert.ok(!logger.errors[0]!.includes(key), "the log names the key");
      } finally {
        await app.close();
      }
    });

    // Content-Length 0: the reader before the middleware reads (body-parser parses) an empty body.
    test(`${name} mounted after a body reader: a request without a body is not taken for a read one`, async () => {
      const logger = new Recorder();
      const app = await start(client, logger);
      try {
        const reply = await send(app.port, {
          method: "POST",
          path: "/v1/orders/o2",
          headers: [["idempotency-key", randomBytes(8).toString("hex")], ["content-type", "application/json"]],
        }, "unused", GIVE_UP_MS);
        assert.equal(reply?.status, 201, `${reply?.status} ${reply?.body}`);
        assert.equal(app.executions(), 1);
        assert.deepEqual(logger.errors, []);
      } finally {
        await app.close();
      }
    });
  }
});
