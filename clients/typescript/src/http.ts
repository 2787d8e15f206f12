/**
 * What the HTTP middleware share (Express, Fastify, Web-standard handlers): routes, the
 * `Idempotency-Key` header, problem details, and one request's run through the executor.
 *
 * The contract is `idemd proxy`'s (docs/proxy.md), checked by the shared scenarios in
 * clients/conformance/http-scenarios.json: a middleware and the sidecar answer the same
 * requests the same way.
 */
import type { IdemdClient } from "./client";
import { InProgressError, KeyReuseError, NoSideEffectError, OutcomePendingError, RpcError } from "./errors";
import { FailWithReason, failureText, type HandlerContext, type HeaderList, type HttpResponse } from "./executor";

/**
 * One route, as in `idemd proxy`'s routes file (snake_case names of the file are accepted
 * too). `path` is a template: `{name}` matches one segment and names the endpoint
 * (`POST /v1/payments/{id}`: every payment shares one endpoint); a final `/*` matches any rest
 * and the endpoint is the request's own path. Fields left out inherit the defaults.
 */
export interface RouteOptions {
  path?: string;
  /** Methods made idempotent (default POST and PATCH); others pass through untouched. */
  methods?: string[];
  /** `"require"` (default; no key: 400) or `"optional"` (no key: passed through). */
  key?: "require" | "optional";
  /** Larger bodies get 413 before any claim (default 1 MiB). */
  maxRequestBytes?: number;
  /** Larger answers are returned but not stored; the key is left UNKNOWN (default 256 KiB). */
  maxResponseBytes?: number;
  /** How long a duplicate waits for the first (ms, or `"5s"`); then 409. Default 0. */
  maxWait?: number | string;
  /** `"release"` (default: a 5xx frees the key) or `"store"` (the 5xx is replayed). */
  on5xx?: "release" | "store";
  /** JSON Pointers left out of the fingerprint (timestamps, nonces). */
  ignoreFields?: string[];
  /** Response headers stored and replayed; `set-cookie` only if listed. */
  storeHeaders?: string[];
  /** `"server"` (default: the body goes to idemd) or `"local"` (only its SHA-256 does). */
  fingerprint?: "server" | "local";
  /** Record TTL and lease (ms, or `"30s"`); default: the endpoint's policy. */
  ttl?: number | string;
  lease?: number | string;
  /**
   * Development only: a 409 `outcome_pending` carries the stored Fail reason (`reason`), which
   * holds the handler's error text. Default false: the caller learns the key's state, never
   * what the handler said (internal names, SQL, secrets). Warned about when the middleware is
   * created.
   */
  exposeFailureReason?: boolean;
}

/** Where the middleware logs: `console` unless given (Fastify's plugin: `fastify.log`). */
export interface Logger {
  error(message: string): void;
  warn(message: string): void;
}

/** Options of every middleware: routes like `idemd proxy`'s routes file. */
export interface IdempotencyOptions {
  /** First match wins; a request no route matches gets `defaults`. */
  routes?: Array<RouteOptions | Record<string, unknown>>;
  defaults?: RouteOptions | Record<string, unknown>;
  /** Route-file fields to drop silently (e.g. the proxy's `upstream_timeout`). */
  ignoreSettings?: string[];
  /** Default `console` (the Fastify plugin: `fastify.log`). */
  logger?: Logger;
}

/** A route's settings with every default filled in. */
export interface Settings {
  methods: Set<string>;
  keyRequired: boolean;
  maxRequestBytes: number;
  maxResponseBytes: number;
  maxWaitMs: number;
  on5xxStore: boolean;
  ignoreFields: string[];
  storeHeaders: Set<string>;
  fingerprint: "server" | "local";
  ttlMs: number | undefined;
  leaseMs: number | undefined;
  exposeFailureReason: boolean;
}

/** What describes a response's body and the resource it created; never cookies. */
export const DEFAULT_STORE_HEADERS = [
  "content-type", "content-encoding", "content-language", "content-location",
  "location", "etag", "last-modified", "link",
];

const SNAKE: Record<string, keyof RouteOptions> = {
  max_request_bytes: "maxRequestBytes",
  max_response_bytes: "maxResponseBytes",
  max_wait: "maxWait",
  on_5xx: "on5xx",
  ignore_fields: "ignoreFields",
  store_headers: "storeHeaders",
  expose_failure_reason: "exposeFailureReason",
};
const KNOWN = new Set<string>([
  "path", "methods", "key", "maxRequestBytes", "maxResponseBytes", "maxWait", "on5xx",
  "ignoreFields", "storeHeaders", "fingerprint", "ttl", "lease", "exposeFailureReason",
]);

function normalize(value: Record<string, unknown>, ignore: Set<string>, where: string): RouteOptions {
  const out: Record<string, unknown> = {};
  for (const [name, v] of Object.entries(value)) {
    if (ignore.has(name)) continue;
    const camel = SNAKE[name] ?? name;
    if (!KNOWN.has(camel)) throw new TypeError(`${where}: unknown setting ${JSON.stringify(name)}`);
    out[camel] = v;
  }
  return out as RouteOptions;
}

/** Milliseconds of a number (ms) or a `"5s"` / `"250ms"` / `"1m"` string. */
function millis(value: number | string | undefined, where: string): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value === "number") return value;
  const match = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$/.exec(value);
  if (!match) throw new TypeError(`${where}: ${JSON.stringify(value)} is not a duration such as 5s or 250ms`);
  return Number(match[1]) * ({ ms: 1, s: 1000, m: 60_000 } as const)[(match[2] ?? "s") as "ms" | "s" | "m"];
}

const BASE: RouteOptions = {
  methods: ["POST", "PATCH"],
  key: "require",
  maxRequestBytes: 1024 * 1024,
  maxResponseBytes: 256 * 1024,
  maxWait: 0,
  on5xx: "release",
  ignoreFields: [],
  storeHeaders: DEFAULT_STORE_HEADERS,
  fingerprint: "server",
  exposeFailureReason: false,
};

function settle(route: RouteOptions, base: RouteOptions, where: string): [RouteOptions, Settings] {
  const merged: RouteOptions = { ...base };
  for (const [name, v] of Object.entries(route)) {
    if (name !== "path" && v !== undefined) (merged as Record<string, unknown>)[name] = v;
  }
  if (merged.key !== "require" && merged.key !== "optional") {
    throw new TypeError(`${where}.key: ${JSON.stringify(merged.key)} must be "require" or "optional"`);
  }
  if (merged.on5xx !== "release" && merged.on5xx !== "store") {
    throw new TypeError(`${where}.on_5xx: ${JSON.stringify(merged.on5xx)} must be "release" or "store"`);
  }
  if (merged.fingerprint !== "server" && merged.fingerprint !== "local") {
    throw new TypeError(`${where}.fingerprint: ${JSON.stringify(merged.fingerprint)} must be "server" or "local"`);
  }
  if (typeof merged.exposeFailureReason !== "boolean") {
    throw new TypeError(`${where}.expose_failure_reason: ${JSON.stringify(merged.exposeFailureReason)} must be true or false`);
  }
  for (const name of ["maxRequestBytes", "maxResponseBytes"] as const) {
    const v = merged[name];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
      throw new TypeError(`${where}.${name}: ${JSON.stringify(v)} must be a whole number of bytes`);
    }
  }
  return [
    merged,
    {
      methods: new Set((merged.methods ?? []).map((m) => m.toUpperCase())),
      keyRequired: merged.key === "require",
      maxRequestBytes: merged.maxRequestBytes!,
      maxResponseBytes: merged.maxResponseBytes!,
      maxWaitMs: millis(merged.maxWait, `${where}.max_wait`) ?? 0,
      on5xxStore: merged.on5xx === "store",
      ignoreFields: [...(merged.ignoreFields ?? [])],
      storeHeaders: new Set((merged.storeHeaders ?? []).map((h) => h.toLowerCase())),
      fingerprint: merged.fingerprint,
      ttlMs: millis(merged.ttl, `${where}.ttl`),
      leaseMs: millis(merged.lease, `${where}.lease`),
      exposeFailureReason: merged.exposeFailureReason,
    },
  ];
}

interface CompiledRoute {
  template: string;
  segments: Array<string | null>;
  rest: boolean;
  settings: Settings;
}

/** The routes: the first whose path matches wins, else the defaults (the proxy's rule). */
export class Routes {
  private readonly routes: CompiledRoute[] = [];
  private readonly defaults: Settings;
  /** Whether any route (or the defaults) sets expose_failure_reason. */
  readonly exposeFailureReason: boolean;

  constructor(options: IdempotencyOptions = {}) {
    const ignore = new Set(options.ignoreSettings ?? []);
    const [base, defaults] = settle(normalize((options.defaults ?? {}) as Record<string, unknown>, ignore, "defaults"), BASE, "defaults");
    this.defaults = defaults;
    (options.routes ?? []).forEach((raw, index) => {
      const where = `routes[${index}]`;
      const route = normalize(raw as Record<string, unknown>, ignore, where);
      const template = route.path ?? "/*";
      const [segments, rest] = pattern(template, `${where}.path`);
      this.routes.push({ template, segments, rest, settings: settle(route, base, where)[1] });
    });
    this.exposeFailureReason = [defaults, ...this.routes.map((r) => r.settings)].some((s) => s.exposeFailureReason);
  }

  /** The endpoint (`METHOD template`) and settings of a request. */
  find(method: string, path: string): [string, Settings] {
    const parts = path.replace(/^\/+/, "").split("/");
    for (const route of this.routes) {
      if (matches(route, parts)) return [`${method} ${route.rest ? path : route.template}`, route.settings];
    }
    return [`${method} ${path}`, this.defaults];
  }
}

function pattern(path: string, where: string): [Array<string | null>, boolean] {
  if (!path.startsWith("/")) throw new TypeError(`${where}: ${JSON.stringify(path)} must start with /`);
  const parts = path.replace(/^\/+/, "").split("/");
  const segments: Array<string | null> = [];
  let rest = false;
  parts.forEach((part, index) => {
    if (part === "*") {
      if (index + 1 !== parts.length) throw new TypeError(`${where}: ${JSON.stringify(path)}: * may only be the last segment`);
      rest = true;
    } else if (part.startsWith("{") && part.endsWith("}") && part.length > 2) {
      segments.push(null);
    } else if (/[{}*]/.test(part)) {
      throw new TypeError(`${where}: ${JSON.stringify(path)}: segment ${JSON.stringify(part)} is neither literal, {name} nor a final *`);
    } else {
      segments.push(part);
    }
  });
  return [segments, rest];
}

function matches(route: CompiledRoute, parts: string[]): boolean {
  if (parts.length < route.segments.length) return false;
  for (let i = 0; i < route.segments.length; i++) {
    const segment = route.segments[i];
    if (segment !== null && segment !== parts[i]) return false;
  }
  return route.rest || parts.length === route.segments.length;
}

const KEY = /^[A-Za-z0-9_-]{1,255}$/;

/**
 * The key of an `Idempotency-Key` value: a Structured Field string (RFC 8941 §3.3.3, as the
 * draft specifies) or the bare token Stripe-style clients send; then idemd's key rule.
 * Throws a TypeError saying what is wrong.
 */
export function parseKey(value: string): string {
  let text = value.replace(/^ +| +$/g, "");
  if (text.startsWith('"')) {
    let key = "";
    let i = 1;
    for (;;) {
      if (i >= text.length) throw new TypeError("is a Structured Field string without its closing quote");
      const c = text[i++]!;
      if (c === '"') break;
      if (c === "\\") {
        const escaped = text[i++];
        if (escaped !== '"' && escaped !== "\\") {
          throw new TypeError('has an escape other than \\" or \\\\ in its Structured Field string');
        }
        key += escaped;
      } else if (c >= " " && c <= "~") {
        key += c;
      } else {
        throw new TypeError("has a character a Structured Field string cannot hold");
      }
    }
    if (i !== text.length) throw new TypeError("has characters after its Structured Field string");
    text = key;
  }
  if (text === "") throw new TypeError("must not be empty");
  if (!KEY.test(text)) throw new TypeError("must be 1-255 characters of [A-Za-z0-9_-]");
  return text;
}

/** A whole HTTP answer: status, headers in order (repeats kept), body. */
export interface Answer {
  status: number;
  headers: HeaderList;
  body: Buffer;
}

const STATUS_TEXT: Record<number, string> = {
  400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
  413: "Payload Too Large", 422: "Unprocessable Entity", 429: "Too Many Requests", 500: "Internal Server Error",
  501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout",
};

/** An RFC 9457 problem, shaped like the proxy's (`src/web/problem.rs`). */
export function problem(status: number, name: string, detail: string, extra: Record<string, unknown> = {}, retryAfterMs?: number): Answer {
  const members = {
    type: `https://idemd.dev/problems/${name}`,
    title: STATUS_TEXT[status] ?? "Error",
    status,
    detail,
    ...extra,
  };
  const headers: HeaderList = [["content-type", "application/problem+json"]];
  if (retryAfterMs !== undefined) headers.push(["retry-after", String(Math.max(1, Math.ceil(retryAfterMs / 1000)))]);
  return { status, headers, body: Buffer.from(JSON.stringify(members)) };
}

const HTTP_OF_CODE: Record<string, number> = {
  INVALID_ARGUMENT: 400, FAILED_PRECONDITION: 400, OUT_OF_RANGE: 400, NOT_FOUND: 404, ALREADY_EXISTS: 409,
  ABORTED: 409, PERMISSION_DENIED: 403, UNAUTHENTICATED: 401, RESOURCE_EXHAUSTED: 429, UNIMPLEMENTED: 501,
  UNAVAILABLE: 503, DEADLINE_EXCEEDED: 504,
};

/** The answer to an executor refusal raised before the app ran. */
function refused(error: unknown, settings: Settings): Answer {
  if (error instanceof InProgressError) {
    return problem(409, "request_in_progress",
      "a request with this Idempotency-Key is in progress; retry after Retry-After", {}, error.retryAfterMs);
  }
  if (error instanceof KeyReuseError) {
    return problem(422, "idempotency_key_reuse",
      "this Idempotency-Key was used for a different request (method, path or body); use a new key for a new operation");
  }
  if (error instanceof OutcomePendingError) {
    return problem(409, "outcome_pending",
      "the outcome of the first request with this Idempotency-Key is not known; it is waiting for an operator's decision",
      // The reason holds the handler's error text: for operators (Lookup), not for the caller.
      settings.exposeFailureReason ? { state: `STATE_${error.state}`, reason: error.reason } : { state: `STATE_${error.state}` });
  }
  if (error instanceof RpcError) {
    return problem(HTTP_OF_CODE[error.codeName] ?? 500, error.codeName.toLowerCase(), error.details, { grpc_code: error.codeName });
  }
  throw error;
}

/** A 5xx on a route that releases the key: the executor frees it, the answer goes back as is. */
class Released extends NoSideEffectError {
  constructor(readonly answer: Answer) {
    super(`handler answered ${answer.status}`);
  }
}

/**
 * An answer that is not stored (over max_response_bytes, or the app failed): the key is UNKNOWN
 * with `reason` as the Fail reason (the app's own `<Kind>: <message>`, never this class's name).
 */
class Unstorable extends FailWithReason {
  constructor(readonly answer: Answer, reason: string) {
    super(reason);
  }
}

/** A failure the framework reported after answering its own error page. */
export class AppFailed extends Error {
  constructor(readonly answer: Answer, readonly error: unknown) {
    super(failureText(error));
  }
}

/**
 * What a middleware's `readBody` found when something mounted before it had already read (or
 * started reading) the request's body: the bytes are gone, so the key must not be claimed.
 */
export const BODY_READ_BEFORE = Symbol("idemd.bodyReadBefore");

/** One middleware instance (one `idempotency(...)`, plugin registration or wrapper): its log. */
export class Middleware {
  readonly routes: Routes;
  private orderLogged = false;

  /** `mountHint` says, in the framework's terms, where the middleware belongs. */
  constructor(
    readonly client: IdemdClient,
    options: IdempotencyOptions,
    private readonly mountHint: string,
    private readonly log: Logger = options.logger ?? console,
  ) {
    this.routes = new Routes(options);
    if (this.routes.exposeFailureReason) {
      log.warn("idemd: expose_failure_reason is set: a 409 outcome_pending carries the handler's error text; for development only");
    }
  }

  /**
   * The 500 `middleware_order` answer to a request whose body was read before the middleware
   * saw it: at once, key unclaimed, app not run. A mistake of the app's wiring, not of the
   * request, so it is logged once per instance rather than once per request.
   */
  misordered(endpoint: string): Answer {
    const detail = `the request body was read before the idempotency middleware saw it; ${this.mountHint}`;
    if (!this.orderLogged) {
      this.orderLogged = true;
      this.log.error(`idemd: ${endpoint}: ${detail} (answering 500 middleware_order, key not claimed)`);
    }
    return problem(500, "middleware_order", detail);
  }
}

/** One request as the middleware sees it. */
export interface Incoming {
  method: string;
  /** The path without the query: what routes match. */
  path: string;
  /** Path and query, as sent: what is fingerprinted. */
  target: string;
  /** A header's value (first if repeated), or undefined. */
  header(name: string): string | undefined;
}

/** What the middleware does with a request. */
export type Outcome =
  | { kind: "pass" }
  | { kind: "answer"; answer: Answer };

/**
 * Runs one request: `readBody(limit)` (null when over the limit, {@link BODY_READ_BEFORE} when
 * something before the middleware consumed the body) is called at most once, `runApp` runs
 * the app on that body at most once per key and resolves with its buffered answer (or rejects:
 * a NoSideEffectError releases the key, {@link AppFailed} or anything else leaves it UNKNOWN
 * and is rethrown, unless the framework already answered, which is then returned).
 */
export async function handle(
  middleware: Middleware,
  incoming: Incoming,
  readBody: (limit: number) => Promise<Buffer | null | typeof BODY_READ_BEFORE>,
  runApp: (body: Buffer, context: HandlerContext) => Promise<Answer>,
): Promise<Outcome> {
  const method = incoming.method.toUpperCase();
  const [endpoint, settings] = middleware.routes.find(method, incoming.path);
  if (!settings.methods.has(method)) return { kind: "pass" };
  const value = incoming.header("idempotency-key");
  if (value === undefined) {
    if (!settings.keyRequired) return { kind: "pass" };
    return answer(problem(400, "idempotency_key_missing", `${method} ${incoming.path} requires an Idempotency-Key header`));
  }
  let key: string;
  try {
    key = parseKey(value);
  } catch (e) {
    return answer(problem(400, "idempotency_key_malformed", `Idempotency-Key ${(e as Error).message}`, { field: "Idempotency-Key" }));
  }
  const body = await readBody(settings.maxRequestBytes);
  if (body === BODY_READ_BEFORE) return answer(middleware.misordered(endpoint));
  if (body === null) {
    return answer(problem(413, "request_too_large", `request body exceeds ${settings.maxRequestBytes} bytes`));
  }
  let fresh: Answer | undefined;
  try {
    const result = await middleware.client.executeOnce({
      endpoint,
      key,
      request: {
        method,
        path: incoming.target,
        body,
        contentType: incoming.header("content-type") ?? "",
        ignoreFields: settings.ignoreFields,
      },
      fingerprint: settings.fingerprint,
      maxWaitMs: settings.maxWaitMs,
      leaseMs: settings.leaseMs,
      ttlMs: settings.ttlMs,
      handler: async (context) => {
        let got: Answer;
        try {
          got = await runApp(body, context);
        } catch (error) {
          if (error instanceof AppFailed) {
            if (error.error instanceof NoSideEffectError) throw new Released(error.answer);
            throw new Unstorable(error.answer, error.message);
          }
          throw error;
        }
        if (got.status >= 500 && !settings.on5xxStore) throw new Released(got);
        if (got.body.length > settings.maxResponseBytes) {
          throw new Unstorable(got,
            `answer exceeds max_response_bytes (${settings.maxResponseBytes} bytes); returned to the caller, not stored`);
        }
        fresh = got;
        return {
          status: got.status,
          headers: got.headers.filter(([name]) => settings.storeHeaders.has(name.toLowerCase())).map(([n, v]) => [n.toLowerCase(), v] as [string, string]),
          body: got.body,
        };
      },
    });
    if (result.replayed) return answer(replay(result.response));
    return answer(fresh!);
  } catch (error) {
    if (error instanceof Released || error instanceof Unstorable) return answer(error.answer);
    if (fresh !== undefined && (error instanceof RpcError)) {
      // The app ran (its side effect happened) but recording the answer failed: the caller
      // still gets it; the executor left the key to its lease or marked it UNKNOWN.
      return answer(fresh);
    }
    if (error instanceof InProgressError || error instanceof KeyReuseError || error instanceof OutcomePendingError || error instanceof RpcError) {
      return answer(refused(error, settings));
    }
    throw error;
  }
}

function answer(a: Answer): Outcome {
  return { kind: "answer", answer: a };
}

function replay(stored: HttpResponse): Answer {
  const headers: HeaderList = stored.headers.filter(([name]) => name.toLowerCase() !== "idempotent-replayed");
  headers.push(["idempotent-replayed", "true"]);
  return { status: stored.status, headers, body: stored.body };
}
