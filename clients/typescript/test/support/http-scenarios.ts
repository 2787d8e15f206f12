/**
 * Runner of clients/conformance/http-scenarios.json (the HTTP front-end contract shared with
 * `idemd proxy`) against an app served over real HTTP, and the app itself: it counts
 * executions per path and answers by path as http-scenarios.md says.
 */
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import * as http from "node:http";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { HeaderList } from "../../src";
import { conformanceDir } from "./paths";

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

export const HTTP_SCENARIOS: Json = JSON.parse(readFileSync(path.join(conformanceDir, "http-scenarios.json"), "utf8"));
/** The middleware's route options: the file's routes; the proxy-only fields are ignored. */
export const ROUTE_OPTIONS = {
  routes: HTTP_SCENARIOS.routes.routes as Json[],
  ignoreSettings: HTTP_SCENARIOS.proxy_only_fields as string[],
};
export const SLOW_MS = 600;

/** What the app executed, per path. */
export class AppState {
  readonly executions = new Map<string, number>();
  count(path: string): number {
    const n = (this.executions.get(path) ?? 0) + 1;
    this.executions.set(path, n);
    return n;
  }
  of(path: string): number {
    return this.executions.get(path) ?? 0;
  }
}

/** The app's answer after its delay, unless it fails (the caller handles /crash/ and /norun/). */
export function answerOf(path: string, execution: number, body: Buffer): { status: number; headers: HeaderList; body: Buffer } {
  let status = 201;
  let payload: Buffer;
  if (path.includes("/fail/")) {
    status = 500;
    payload = Buffer.from('{"error":"boom"}');
  } else if (path.startsWith("/big/")) {
    status = 200;
    payload = Buffer.alloc(65536, "x");
  } else {
    payload = Buffer.from(JSON.stringify({ path, execution, request_bytes: body.length }));
  }
  return {
    status,
    headers: [
      ["content-type", "application/json"],
      ["location", path],
      ["set-cookie", `session=secret-${execution}`],
      ["x-execution", String(execution)],
      ["x-body-sha256", createHash("sha256").update(body).digest("hex")],
    ],
    body: payload,
  };
}

export interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/**
 * One request; undefined when the connection closed without an answer, or none came within
 * `timeoutMs` (then the request is abandoned).
 */
export function send(port: number, request: Json, prefix: string, timeoutMs?: number): Promise<Reply | undefined> {
  return new Promise((resolve) => {
    const headers: Record<string, string> = {};
    for (const [name, value] of (request.headers ?? []) as Array<[string, string]>) {
      headers[name] = value.replace(/\{key:(\d+)\}/g, `${prefix}-$1`);
    }
    const body = Buffer.from(request.body ?? "");
    if (body.length > 0 || !["GET", "HEAD"].includes(request.method)) headers["content-length"] = String(body.length);
    const req = http.request({ host: "127.0.0.1", port, method: request.method, path: request.path, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on("error", () => resolve(undefined));
    });
    req.on("error", () => resolve(undefined));
    if (timeoutMs !== undefined) req.setTimeout(timeoutMs, () => req.destroy());
    req.end(body);
  });
}

function header(reply: Reply, name: string): string | undefined {
  const value = reply.headers[name];
  return Array.isArray(value) ? value[value.length - 1] : value;
}

function check(at: string, expect: Json, reply: Reply | undefined, saved: Map<string, Buffer>): void {
  if (expect.failed) {
    assert.ok(reply === undefined || reply.status >= 500, `${at}: expected a failure, got ${reply?.status} ${reply?.body}`);
    return;
  }
  assert.ok(reply, `${at}: no answer`);
  if ("status" in expect) assert.equal(reply.status, expect.status, `${at}: status; body ${reply.body.toString().slice(0, 300)}`);
  for (const [name, value] of Object.entries((expect.headers ?? {}) as Record<string, string | null>)) {
    assert.equal(header(reply, name) ?? null, value, `${at}: header ${name}; ${JSON.stringify(reply.headers)}`);
  }
  if ("problem" in expect) {
    assert.equal(header(reply, "content-type"), "application/problem+json", at);
    assert.equal(JSON.parse(reply.body.toString()).type, `https://idemd.dev/problems/${expect.problem}`, at);
  }
  if (expect.retry_after) assert.ok(header(reply, "retry-after"), `${at}: Retry-After`);
  if ("body" in expect) assert.equal(reply.body.toString(), expect.body, `${at}: body`);
  if ("body_length" in expect) assert.equal(reply.body.length, expect.body_length, `${at}: body length`);
  for (const text of (expect.body_includes ?? []) as string[]) {
    assert.ok(reply.body.includes(text), `${at}: body lacks ${JSON.stringify(text)}: ${reply.body.toString().slice(0, 300)}`);
  }
  for (const text of (expect.body_excludes ?? []) as string[]) {
    assert.ok(!reply.body.includes(text), `${at}: body has ${JSON.stringify(text)}: ${reply.body.toString().slice(0, 300)}`);
  }
  if ("body_same_as" in expect) assert.ok(reply.body.equals(saved.get(expect.body_same_as)!), `${at}: body differs from ${expect.body_same_as}'s`);
}

function checkParallel(at: string, expect: Json, replies: Array<Reply | undefined>): void {
  assert.ok(replies.every((r) => r !== undefined), `${at}: a request got no answer`);
  const all = replies as Reply[];
  const statuses = all.map((r) => r.status);
  if (expect.statuses) assert.ok(statuses.every((s) => expect.statuses.includes(s)), `${at}: ${statuses}`);
  if (expect.includes_status) assert.ok(statuses.includes(expect.includes_status), `${at}: ${statuses}`);
  if (expect.same_body_for) {
    const bodies = new Set(all.filter((r) => r.status === expect.same_body_for).map((r) => r.body.toString("hex")));
    assert.ok(bodies.size <= 1, `${at}: different bodies`);
  }
  if (expect.on_409) for (const r of all.filter((r) => r.status === 409)) check(at, expect.on_409, r, new Map());
}

/** Runs every scenario meant for a middleware; returns how many ran. */
export async function runScenarios(port: number, executions: (path: string) => number): Promise<number> {
  let ran = 0;
  for (const [number, scenario] of (HTTP_SCENARIOS.scenarios as Json[]).entries()) {
    if ((scenario.only ?? "middleware") !== "middleware") continue;
    const prefix = randomBytes(8).toString("hex");
    const saved = new Map<string, Buffer>();
    const started = new Map<string, [string, Promise<Reply | undefined>]>();
    for (const [index, step] of (scenario.steps as Json[]).entries()) {
      const at = `scenario ${number} (${scenario.name}), step ${index}`;
      const expect: Json = step.expect ?? {};
      let path: string;
      if ("sleep_ms" in step) {
        await sleep(step.sleep_ms);
        continue;
      } else if ("finish" in step) {
        const [p, reply] = started.get(step.finish)!;
        path = p;
        check(at, expect, await reply, saved);
      } else if ("start" in step) {
        started.set(step.start, [step.request.path, send(port, step.request, prefix)]);
        continue;
      } else if ("parallel" in step) {
        path = step.request.path;
        const replies = await Promise.all(Array.from({ length: step.parallel }, () => send(port, step.request, prefix)));
        checkParallel(at, expect, replies);
      } else {
        path = step.request.path;
        const reply = await send(port, step.request, prefix);
        check(at, expect, reply, saved);
        if (step.save_as && reply) saved.set(step.save_as, reply.body);
      }
      if ("executions" in expect) assert.equal(executions(path), expect.executions, `${at}: executions of ${path}`);
    }
    ran++;
  }
  assert.ok(ran > 10, `only ${ran} scenarios ran`);
  return ran;
}
