/**
 * Example payments API: Express and one middleware (`idempotency`), per docs/sdk.md.
 *
 * The middleware answers what `idemd proxy` answers (docs/proxy.md): 400 for a missing or
 * malformed key, the stored response with `Idempotent-Replayed: true` on a retry, 409
 * `request_in_progress` with `Retry-After`, 409 `outcome_pending`, 422 `idempotency_key_reuse`.
 * The handler only validates and charges; an invalid payment throws a NoSideEffectError, so
 * the key is released and a corrected retry with the same key runs.
 *
 * Run: IDEMD_ADDRESS=127.0.0.1:50051 IDEMD_TOKEN=... PORT=8080 node dist/examples/payments-server.js
 */
import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import express, { type NextFunction, type Request, type Response } from "express";
import { IdemdClient, idempotency, idempotencyErrors, NoSideEffectError, type HandlerContext } from "../src";

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
  const app = express();
  app.use(idempotency(idemd, { routes: [{ path: "/v1/payments", maxWait: options.maxWaitMs ?? 5000 }] }));
  app.post("/v1/payments", async (req: Request & { rawBody?: Buffer; idemd?: HandlerContext }, res: Response) => {
    const payment = parsePayment(req.rawBody ?? Buffer.alloc(0));
    // The provider's key is derived from ours: the same on every retry.
    const charge = await provider.charge(payment, req.idemd!.downstreamKey("charge"));
    res.status(201).json({ id: charge.id, status: "succeeded", amount: payment.amount, currency: payment.currency });
  });
  app.use(idempotencyErrors());
  app.use((err: unknown, _req: Request, res: Response, _next: NextFunction) => {
    // Never log the key or the body; the status says enough.
    if (err instanceof InvalidPayment) res.status(400).json({ error: "invalid_request", message: err.message });
    else res.status(500).json({ error: "internal_error" });
  });
  return createServer(app);
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
