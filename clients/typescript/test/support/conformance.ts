/**
 * Interpreter of the shared conformance scenarios (clients/conformance/README.md). Every op,
 * step field, handler action and expect field is checked against the language the README
 * defines: anything unknown fails the scenario instead of being skipped.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import {
  IdempotencyError,
  IdemdClient,
  InProgressError,
  KeyReuseError,
  noSideEffect,
  OutcomePendingError,
  RpcError,
  v1,
  type ExecuteResult,
  type HandlerResponse,
  type HeaderList,
  type RequestDescription,
} from "../../src";

type Json = Record<string, unknown>;

export interface ScenarioFile {
  version: number;
  credentials: Record<string, string>;
  scenarios: Array<{ name: string; steps: Json[] }>;
}

const STEP_FIELDS: Record<string, readonly string[]> = {
  execute: ["op", "as", "endpoint", "key", "request", "handler", "fingerprint", "max_wait_ms", "parallel", "expect"],
  claim: ["op", "as", "endpoint", "key", "request", "lease_ms", "save_as", "expect"],
  complete: ["op", "as", "endpoint", "key", "lease_from", "response", "expect"],
  lookup: ["op", "as", "endpoint", "key", "expect"],
  sleep: ["op", "as", "ms"],
};

const EXPECT_FIELDS: Record<string, readonly string[]> = {
  execute: [
    "result", "status", "body", "headers", "http_status", "error_code",
    "attempt", "handler_calls", "results", "error",
  ],
  claim: ["outcome", "attempt", "error"],
  complete: ["ok", "error"],
  lookup: ["state", "error"],
  sleep: [],
};

const RESULTS = ["executed", "replayed", "mismatch", "pending", "in_progress", "handler_error"] as const;
type ResultKind = (typeof RESULTS)[number];
const HANDLER_ACTIONS = ["respond", "error_before_side_effect", "error_ambiguous"];
const CLAIM_OUTCOMES = ["claimed", "replayed", "in_progress", "mismatch", "pending"] as const;

/** The outcome of one execute. */
type Outcome =
  | { kind: "executed" | "replayed"; result: ExecuteResult }
  | { kind: "mismatch" | "pending" | "in_progress"; error: IdempotencyError }
  | { kind: "handler_error"; error: unknown }
  | { kind: "rpc_error"; error: RpcError }
  | { kind: "unexpected"; error: unknown };

/** Fails with a message naming the step (the test itself is named after the scenario). */
class StepFailure extends Error {}

export class ScenarioRunner {
  private readonly prefix = randomBytes(6).toString("hex");
  private readonly leases = new Map<string, string>();
  private readonly clients = new Map<string, IdemdClient>();

  constructor(
    private readonly address: string,
    private readonly credentials: Record<string, string>,
  ) {}

  async run(steps: Json[]): Promise<void> {
    try {
      for (const [index, step] of steps.entries()) {
        try {
          await this.runStep(step);
        } catch (err) {
          const op = typeof step.op === "string" ? step.op : "?";
          const message = err instanceof Error ? err.message : String(err);
          throw new StepFailure(`step ${index} (${op}): ${message}`, { cause: err });
        }
      }
    } finally {
      for (const client of this.clients.values()) client.close();
    }
  }

  private async runStep(step: Json): Promise<void> {
    const op = step.op;
    if (typeof op !== "string" || !(op in STEP_FIELDS)) {
      throw new Error(`unknown op ${JSON.stringify(op)}`);
    }
    checkFields(step, STEP_FIELDS[op]!, "step");
    const expect = (step.expect ?? {}) as Json;
    checkFields(expect, EXPECT_FIELDS[op]!, "expect");
    switch (op) {
      case "execute":
        return this.execute(step, expect);
      case "claim":
        return this.claim(step, expect);
      case "complete":
        return this.complete(step, expect);
      case "lookup":
        return this.lookup(step, expect);
      case "sleep":
        await sleep(num(step, "ms"));
        return;
    }
  }

  private client(step: Json): IdemdClient {
    const name = str(step, "as");
    const token = this.credentials[name];
    if (token === undefined) throw new Error(`unknown credential ${JSON.stringify(name)}`);
    let client = this.clients.get(name);
    if (!client) {
      client = new IdemdClient({ address: this.address, token, tls: false });
      this.clients.set(name, client);
    }
    return client;
  }

  private key(step: Json): string {
    return str(step, "key").replace(/\{key:(\d+)\}/g, (_, n: string) => `${this.prefix}-${n}`);
  }

  // ---- execute ------------------------------------------------------------------------------

  private async execute(step: Json, expect: Json): Promise<void> {
    const client = this.client(step);
    const request = toRequest(obj(step, "request"));
    const handlerSpec = obj(step, "handler");
    checkFields(handlerSpec, ["action", "status", "headers", "body", "delay_ms"], "handler");
    const action = str(handlerSpec, "action");
    if (!HANDLER_ACTIONS.includes(action)) throw new Error(`unknown handler action ${JSON.stringify(action)}`);
    const fingerprint = step.fingerprint ?? "server";
    if (fingerprint !== "server" && fingerprint !== "local") {
      throw new Error(`unknown fingerprint ${JSON.stringify(fingerprint)}`);
    }
    const parallel = step.parallel === undefined ? 1 : num(step, "parallel");
    const maxWaitMs = step.max_wait_ms === undefined ? undefined : num(step, "max_wait_ms");
    const endpoint = str(step, "endpoint");
    const key = this.key(step);
    // Refuse unknown result names before anything runs.
    if (expect.result !== undefined) resultName(str(expect, "result"));
    if (expect.results !== undefined) Object.keys(obj(expect, "results")).forEach(resultName);

    let handlerCalls = 0;
    const runOne = async (): Promise<Outcome> => {
      const thrown: unknown[] = [];
      const handler = async (): Promise<HandlerResponse> => {
        handlerCalls++;
        if (action === "error_before_side_effect") {
          const err = noSideEffect(new Error("conformance: failed before any side effect"));
          thrown.push(err);
          throw err;
        }
        if (action === "error_ambiguous") {
          const err = new Error("conformance: upstream timed out, outcome unknown");
          thrown.push(err);
          throw err;
        }
        if (handlerSpec.delay_ms !== undefined) await sleep(num(handlerSpec, "delay_ms"));
        return {
          status: num(handlerSpec, "status"),
          headers: headerList(handlerSpec.headers ?? []),
          body: handlerSpec.body === undefined ? "" : str(handlerSpec, "body"),
        };
      };
      try {
        const result = await client.executeOnce({
          endpoint,
          key,
          request,
          handler,
          fingerprint,
          ...(maxWaitMs === undefined ? {} : { maxWaitMs }),
        });
        return { kind: result.replayed ? "replayed" : "executed", result };
      } catch (error) {
        if (thrown.includes(error)) return { kind: "handler_error", error };
        if (error instanceof KeyReuseError) return { kind: "mismatch", error };
        if (error instanceof OutcomePendingError) return { kind: "pending", error };
        if (error instanceof InProgressError) return { kind: "in_progress", error };
        if (error instanceof RpcError) return { kind: "rpc_error", error };
        return { kind: "unexpected", error };
      }
    };
    const outcomes = await Promise.all(Array.from({ length: parallel }, runOne));
    checkExecute(expect, outcomes, handlerCalls);
  }

  // ---- raw steps ----------------------------------------------------------------------------

  private async claim(step: Json, expect: Json): Promise<void> {
    const request = toRequest(obj(step, "request"));
    let response: v1.ClaimResponse;
    try {
      response = await this.client(step).claim({
        endpoint: str(step, "endpoint"),
        key: this.key(step),
        request: {
          method: request.method,
          path: request.path,
          body: Buffer.from(request.body as string, "utf8"),
          contentType: request.contentType ?? "",
        },
        lease: step.lease_ms === undefined ? undefined : msToDuration(num(step, "lease_ms")),
      });
    } catch (err) {
      return expectError(expect, err);
    }
    expectNoError(expect, "claim");
    const outcome = CLAIM_OUTCOMES.find((name) => {
      const field = name === "in_progress" ? "inProgress" : name;
      return response[field as keyof v1.ClaimResponse] !== undefined;
    });
    if (expect.outcome !== undefined) {
      const want = str(expect, "outcome");
      if (!(CLAIM_OUTCOMES as readonly string[]).includes(want)) throw new Error(`unknown outcome ${want}`);
      assert.equal(outcome, want, "claim outcome");
    }
    if (expect.attempt !== undefined) {
      assert.equal(response.claimed?.attempt, num(expect, "attempt"), "claim attempt");
    }
    if (step.save_as !== undefined) {
      if (!response.claimed) throw new Error(`save_as needs a claimed outcome, got ${outcome}`);
      this.leases.set(str(step, "save_as"), response.claimed.leaseToken);
    }
  }

  private async complete(step: Json, expect: Json): Promise<void> {
    const leaseName = str(step, "lease_from");
    const leaseToken = this.leases.get(leaseName);
    if (leaseToken === undefined) throw new Error(`no saved lease ${JSON.stringify(leaseName)}`);
    const response = obj(step, "response");
    checkFields(response, ["status", "headers", "body"], "response");
    try {
      await this.client(step).complete({
        endpoint: str(step, "endpoint"),
        key: this.key(step),
        leaseToken,
        response: {
          status: num(response, "status"),
          headers: headerList(response.headers ?? []).map(([name, value]) => ({ name, value })),
          body: Buffer.from(response.body === undefined ? "" : str(response, "body"), "utf8"),
        },
      });
    } catch (err) {
      return expectError(expect, err);
    }
    expectNoError(expect, "complete");
    if (expect.ok !== undefined) assert.equal(expect.ok, true, "expect.ok can only be true");
  }

  private async lookup(step: Json, expect: Json): Promise<void> {
    let response: v1.LookupResponse;
    try {
      response = await this.client(step).lookup({ endpoint: str(step, "endpoint"), key: this.key(step) });
    } catch (err) {
      return expectError(expect, err);
    }
    expectNoError(expect, "lookup");
    if (expect.state !== undefined) {
      const state = response.record ? v1.stateToJSON(response.record.state).replace(/^STATE_/, "") : "none";
      assert.equal(state, str(expect, "state"), "lookup state");
    }
  }
}

// ---- checks -----------------------------------------------------------------------------------

function checkExecute(expect: Json, outcomes: Outcome[], handlerCalls: number): void {
  const kinds = outcomes.map((o) => o.kind);
  if (expect.error !== undefined) {
    for (const outcome of outcomes) {
      if (outcome.kind !== "rpc_error") {
        throw new Error(`expected error ${JSON.stringify(expect.error)}, got ${describe(outcome)}`);
      }
      matchRpcError(expect.error, outcome.error);
    }
  } else {
    for (const outcome of outcomes) {
      if (outcome.kind === "rpc_error" || outcome.kind === "unexpected") {
        throw new Error(`execute failed: ${describe(outcome)}`);
      }
    }
  }
  if (expect.result !== undefined) {
    const want = resultName(str(expect, "result"));
    for (const kind of kinds) assert.equal(kind, want, `execute result (${describeAll(outcomes)})`);
  }
  if (expect.results !== undefined) {
    const want = obj(expect, "results");
    const counts: Record<string, number> = {};
    for (const kind of kinds) counts[kind] = (counts[kind] ?? 0) + 1;
    const expected: Record<string, number> = {};
    for (const [name, count] of Object.entries(want)) {
      resultName(name);
      if (typeof count !== "number") throw new Error(`results.${name} must be a number`);
      if (count !== 0) expected[name] = count;
    }
    assert.deepEqual(counts, expected, "execute results");
  }
  if (expect.handler_calls !== undefined) {
    assert.equal(handlerCalls, num(expect, "handler_calls"), "handler_calls");
  }
  const withResponse = outcomes.flatMap((o) => ("result" in o ? [o.result] : []));
  const responseChecks = ["status", "body", "headers", "attempt"].filter((f) => expect[f] !== undefined);
  if (responseChecks.length > 0 && withResponse.length === 0) {
    throw new Error(`expected a response (${responseChecks.join(", ")}) but got ${describeAll(outcomes)}`);
  }
  for (const result of withResponse) {
    if (expect.status !== undefined) assert.equal(result.response.status, num(expect, "status"), "status");
    if (expect.body !== undefined) assert.equal(result.response.body.toString("utf8"), str(expect, "body"), "body");
    if (expect.headers !== undefined) {
      assert.deepEqual(result.response.headers, headerList(expect.headers), "headers");
    }
    if (expect.attempt !== undefined) assert.equal(result.attempt, num(expect, "attempt"), "attempt");
  }
  for (const field of ["http_status", "error_code"] as const) {
    if (expect[field] === undefined) continue;
    const errors = outcomes.flatMap((o) => (o.kind === "mismatch" || o.kind === "pending" || o.kind === "in_progress" ? [o.error] : []));
    if (errors.length !== outcomes.length) {
      throw new Error(`expected ${field} on an SDK error, got ${describeAll(outcomes)}`);
    }
    for (const error of errors) {
      const actual = field === "http_status" ? error.httpStatus : error.errorCode;
      assert.equal(actual, expect[field], field);
    }
  }
}

function resultName(name: string): ResultKind {
  if (!(RESULTS as readonly string[]).includes(name)) throw new Error(`unknown result ${JSON.stringify(name)}`);
  return name as ResultKind;
}

function expectError(expect: Json, err: unknown): void {
  if (expect.error === undefined) throw err;
  if (!(err instanceof RpcError)) throw err;
  matchRpcError(expect.error, err);
}

function expectNoError(expect: Json, what: string): void {
  if (expect.error !== undefined) throw new Error(`expected ${what} to fail with ${JSON.stringify(expect.error)}, it succeeded`);
}

function matchRpcError(want: unknown, err: RpcError): void {
  if (typeof want !== "object" || want === null) throw new Error("expect.error must be an object");
  const spec = want as Json;
  checkFields(spec, ["code", "reason"], "expect.error");
  assert.equal(err.codeName, str(spec, "code"), `gRPC code (${err.message})`);
  if (spec.reason !== undefined) assert.equal(err.reason, str(spec, "reason"), `ErrorInfo reason (${err.message})`);
}

function describe(outcome: Outcome): string {
  if ("result" in outcome) return `${outcome.kind} (status ${outcome.result.response.status})`;
  const error = outcome.error;
  return `${outcome.kind}: ${error instanceof Error ? `${error.name}: ${error.message}` : String(error)}`;
}

function describeAll(outcomes: Outcome[]): string {
  return outcomes.map(describe).join("; ");
}

// ---- JSON helpers -----------------------------------------------------------------------------

function checkFields(value: Json, allowed: readonly string[], what: string): void {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new Error(`${what} must be an object`);
  }
  for (const field of Object.keys(value)) {
    if (!allowed.includes(field)) throw new Error(`unknown ${what} field ${JSON.stringify(field)}`);
  }
}

function str(value: Json, field: string): string {
  const v = value[field];
  if (typeof v !== "string") throw new Error(`field ${field} must be a string`);
  return v;
}

function num(value: Json, field: string): number {
  const v = value[field];
  if (typeof v !== "number") throw new Error(`field ${field} must be a number`);
  return v;
}

function obj(value: Json, field: string): Json {
  const v = value[field];
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw new Error(`field ${field} must be an object`);
  return v as Json;
}

function toRequest(spec: Json): RequestDescription {
  checkFields(spec, ["method", "path", "content_type", "body"], "request");
  return {
    method: str(spec, "method"),
    path: str(spec, "path"),
    contentType: spec.content_type === undefined ? "" : str(spec, "content_type"),
    body: spec.body === undefined ? "" : str(spec, "body"),
  };
}

function headerList(value: unknown): HeaderList {
  if (!Array.isArray(value)) throw new Error("headers must be a list of [name, value]");
  return value.map((pair) => {
    if (!Array.isArray(pair) || pair.length !== 2 || typeof pair[0] !== "string" || typeof pair[1] !== "string") {
      throw new Error("headers must be a list of [name, value]");
    }
    return [pair[0], pair[1]];
  });
}

function msToDuration(ms: number): { seconds: number; nanos: number } {
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 };
}
