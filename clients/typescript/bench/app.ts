/**
 * The middleware load bench's app (bench/README.md): `POST /pay` answers 201
 * `{"ok":true,"execution":N}`, N counting the handler's runs, in Express, Fastify or a Web
 * `Request → Response` handler, with the SDK's middleware in front or not. Everything else
 * (framework, body parsing, one process) is the same both ways, so the difference between the
 * two is what the middleware costs.
 *
 *   node dist/bench/app.js --framework express|fastify|web --middleware on|off --port PORT --idemd HOST:PORT
 *
 * Prints `listening on PORT` once ready; stops on SIGTERM.
 */
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import express from "express";
import Fastify from "fastify";
import { IdemdClient, idempotency, idempotencyErrors, idempotencyPlugin, withIdempotency, type IdempotencyOptions } from "../src";
import { serveFetch } from "../test/support/fronts";

const FRAMEWORKS = ["express", "fastify", "web"] as const;
type Framework = (typeof FRAMEWORKS)[number];

/** One route, defaults otherwise: key required, server fingerprint. */
const OPTIONS: IdempotencyOptions = { routes: [{ path: "/pay" }] };

function parseArgs(argv: string[]): { framework: Framework; middleware: boolean; port: number; idemd: string } {
  const args = new Map<string, string>();
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i]!;
    const value = argv[i + 1];
    if (!name.startsWith("--") || value === undefined) usage(`unexpected argument ${JSON.stringify(name)}`);
    args.set(name.slice(2), value);
  }
  const framework = args.get("framework") as Framework;
  if (!FRAMEWORKS.includes(framework)) usage(`--framework must be one of ${FRAMEWORKS.join(", ")}`);
  const middleware = args.get("middleware");
  if (middleware !== "on" && middleware !== "off") usage("--middleware must be on or off");
  const port = Number(args.get("port") ?? "0");
  if (!Number.isInteger(port) || port < 0 || port > 65535) usage("--port must be a port number (0: any)");
  const idemd = args.get("idemd") ?? "";
  if (middleware === "on" && idemd === "") usage("--idemd HOST:PORT is required with --middleware on");
  return { framework, middleware: middleware === "on", port, idemd };
}

function usage(problem: string): never {
  process.stderr.write(`bench app: ${problem}\nusage: app.js --framework ${FRAMEWORKS.join("|")} --middleware on|off --port PORT --idemd HOST:PORT\n`);
  process.exit(2);
}

let executions = 0;
/** The handler's whole work: count, answer. */
function pay(): string {
  executions += 1;
  return JSON.stringify({ ok: true, execution: executions });
}

async function startExpress(client: IdemdClient | undefined, port: number): Promise<{ port: number; close: () => Promise<void> }> {
  const app = express();
  if (client) app.use(idempotency(client, OPTIONS));
  app.use(express.json());
  app.post("/pay", (_req, res) => {
    // Node's setHeader: Express's res.json() would add "; charset=utf-8".
    res.status(201).setHeader("content-type", "application/json");
    res.end(pay());
  });
  if (client) app.use(idempotencyErrors());
  const server = http.createServer(app);
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

async function startFastify(client: IdemdClient | undefined, port: number): Promise<{ port: number; close: () => Promise<void> }> {
  const app = Fastify({ logger: false });
  if (client) await app.register(idempotencyPlugin, { client, ...OPTIONS });
  app.post("/pay", async (_request, reply) => {
    // A Buffer, not a string: Fastify would add "; charset=utf-8" to a string's content-type.
    reply.code(201).header("content-type", "application/json");
    return Buffer.from(pay());
  });
  await app.listen({ port, host: "127.0.0.1" });
  return { port: (app.server.address() as AddressInfo).port, close: () => app.close() };
}

async function startWeb(client: IdemdClient | undefined, port: number): Promise<{ port: number; close: () => Promise<void> }> {
  const handler = async (request: Request): Promise<Response> => {
    await request.json();
    return new Response(pay(), { status: 201, headers: { "content-type": "application/json" } });
  };
  return serveFetch(client ? withIdempotency(client, OPTIONS, handler) : handler, port);
}

async function main(): Promise<void> {
  const { framework, middleware, port, idemd } = parseArgs(process.argv.slice(2));
  const client = middleware ? new IdemdClient({ address: idemd, tenantId: "bench", tls: false }) : undefined;
  const start = { express: startExpress, fastify: startFastify, web: startWeb }[framework];
  const server = await start(client, port);
  process.once("SIGTERM", () => {
    void server.close().finally(() => {
      client?.close();
      process.exit(0);
    });
  });
  // stdout is a pipe for the bench script: writes to a pipe are synchronous on Linux, so the
  // line is out before anything else happens.
  process.stdout.write(`listening on ${server.port}\n`);
}

main().catch((error: unknown) => {
  process.stderr.write(`bench app: ${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
