/**
 * The Express middleware, the Fastify plugin and the Web-standard wrapper, each inside a real
 * app of its framework over real HTTP against the live idemd: the shared HTTP scenarios
 * (clients/conformance/http-scenarios.json, which `idemd proxy`'s suite runs too), and what the
 * middleware hands the app.
 */
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { downstreamKey, IdemdClient } from "../src";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { FRONTS } from "./support/fronts";
import { runScenarios, send } from "./support/http-scenarios";

const ALICE = "conformance-token-alice-3f9a";

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
  }
});
