/**
 * Example HTTP front end (node:http) for `POST /v1/payments`, per docs/sdk.md "HTTP example":
 *
 * - `Idempotency-Key` missing → 400 `idempotency_key_missing`; malformed → 400 `idempotency_key_invalid`
 * - the charge runs through `executeOnce`, at most once per key
 * - a replay answers the stored response with `Idempotent-Replayed: true`
 * - in progress → 409 `request_in_progress` + `Retry-After`; pending → 409 `outcome_pending`;
 *   key reused with another body → 422 `idempotency_key_reuse`
 *
 * Run: IDEMD_ADDRESS=127.0.0.1:50051 IDEMD_TOKEN=... PORT=8080 node dist/examples/payments-server.js
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import {
  IdemdClient,
  IdempotencyError,
  InProgressError,
  NoSideEffectError,
  RpcError,
  GrpcStatus,
  type HandlerResponse,
} from "../src";

const ENDPOINT = "POST /v1/payments";
const KEY_PATTERN = /^[A-Za-z0-9_-]{1,255}$/;
const MAX_BODY_BYTES = 1024 * 1024;

/** The payment provider the handler calls (a real one takes its own idempotency key). */
export interface PaymentProvider {
  charge(input: { amount: number; currency: string; customer?: string }, idempotencyKey: string): Promise<{ id: string }>;
}

/** An in-memory provider that, like a real one, deduplicates on its idempotency key. */
export class FakeProvider implements PaymentProvider {
  readonly charges = new Map<string, { id: string; amount: number; currency: string }>();
  async charge(input: { amount: number; currency: string }, idempotencyKey: string): Promise<{ id: string }> {
    let charge = this.charges.get(idempotencyKey);
    if (!charge) {
      charge = { id: `pay_${randomUUID().replace(/-/g, "").slice(0, 16)}`, amount: input.amount, currency: input.currency };
      this.charges.set(idempotencyKey, charge);
    }
    return { id: charge.id };
  }
}

/** A request the handler refuses before touching the provider: nothing happened, retry may succeed. */
class InvalidPayment extends NoSideEffectError {
  override readonly name = "InvalidPayment";
}

export interface PaymentsServerOptions {
  /** How long a duplicate waits for an in-flight original before answering 409 (default 5 s). */
  maxWaitMs?: number;
}

export function createPaymentsServer(
  idemd: IdemdClient,
  provider: PaymentProvider,
  options: PaymentsServerOptions = {},
): Server {
  return createServer((req, res) => {
    handle(idemd, provider, options, req, res).catch(() => {
      // Never log the key or the body; the status says enough.
      if (!res.headersSent) sendJson(res, 500, { error: "internal_error" });
      else res.destroy();
    });
  });
}

async function handle(
  idemd: IdemdClient,
  provider: PaymentProvider,
  options: PaymentsServerOptions,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const path = (req.url ?? "/").split("?", 1)[0];
  if (path !== "/v1/payments") return sendJson(res, 404, { error: "not_found" });
  if (req.method !== "POST") return sendJson(res, 405, { error: "method_not_allowed" }, [["Allow", "POST"]]);

  const key = req.headers["idempotency-key"]; // node lower-cases header names
  if (key === undefined) return sendJson(res, 400, { error: "idempotency_key_missing" });
  if (Array.isArray(key) || !KEY_PATTERN.test(key)) return sendJson(res, 400, { error: "idempotency_key_invalid" });

  const body = await readBody(req);
  if (body === undefined) return sendJson(res, 413, { error: "request_too_large" });

  try {
    const { response, replayed } = await idemd.executeOnce({
      endpoint: ENDPOINT,
      key,
      request: { method: "POST", path: "/v1/payments", contentType: req.headers["content-type"] ?? "", body },
      ...(options.maxWaitMs === undefined ? {} : { maxWaitMs: options.maxWaitMs }),
      handler: async (ctx): Promise<HandlerResponse> => {
        const payment = parsePayment(body);
        const charge = await provider.charge(payment, ctx.downstreamKey("charge"));
        return {
          status: 201,
          headers: [["Content-Type", "application/json"]],
          body: JSON.stringify({ id: charge.id, status: "succeeded", amount: payment.amount, currency: payment.currency }),
        };
      },
    });
    const headers: string[] = [];
    for (const [name, value] of response.headers) headers.push(name, value);
    if (replayed) headers.push("Idempotent-Replayed", "true");
    res.writeHead(response.status, headers);
    res.end(response.body);
  } catch (err) {
    if (err instanceof InProgressError) {
      return sendJson(res, err.httpStatus, { error: err.errorCode }, [["Retry-After", String(err.retryAfterSeconds)]]);
    }
    if (err instanceof IdempotencyError) return sendJson(res, err.httpStatus, { error: err.errorCode });
    if (err instanceof InvalidPayment) return sendJson(res, 400, { error: "invalid_request", message: err.message });
    if (err instanceof RpcError && err.code === GrpcStatus.INVALID_ARGUMENT) {
      return sendJson(res, 400, { error: "invalid_request" });
    }
    return sendJson(res, 502, { error: "upstream_error" });
  }
}

function parsePayment(body: Buffer): { amount: number; currency: string; customer?: string } {
  let value: unknown;
  try {
    value = JSON.parse(body.toString("utf8"));
  } catch {
    throw new InvalidPayment("the body is not JSON");
  }
  const payment = value as { amount?: unknown; currency?: unknown; customer?: unknown };
  if (typeof payment !== "object" || payment === null || !Number.isSafeInteger(payment.amount) || (payment.amount as number) <= 0) {
    throw new InvalidPayment("amount must be a positive integer (minor units)");
  }
  if (typeof payment.currency !== "string" || !/^[a-z]{3}$/.test(payment.currency)) {
    throw new InvalidPayment("currency must be a 3-letter lowercase ISO code");
  }
  return {
    amount: payment.amount as number,
    currency: payment.currency,
    ...(typeof payment.customer === "string" ? { customer: payment.customer } : {}),
  };
}

async function readBody(req: IncomingMessage): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) return undefined;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

function sendJson(res: ServerResponse, status: number, body: object, headers: Array<[string, string]> = []): void {
  const flat: string[] = ["Content-Type", "application/json"];
  for (const [name, value] of headers) flat.push(name, value);
  res.writeHead(status, flat);
  res.end(JSON.stringify(body));
}

if (require.main === module) {
  const idemd = new IdemdClient({
    address: process.env.IDEMD_ADDRESS ?? "127.0.0.1:50051",
    token: process.env.IDEMD_TOKEN,
    tls: process.env.IDEMD_TLS === "1",
  });
  const server = createPaymentsServer(idemd, new FakeProvider());
  server.listen(Number(process.env.PORT ?? 8080), () => {
    const address = server.address();
    console.log(`payments example listening on ${typeof address === "object" && address ? address.port : address}`);
  });
  process.once("SIGTERM", () => server.close(() => idemd.close()));
}
