/**
 * The SDK's own TLS options against an idemd that serves TLS and requires client certificates
 * (clients/conformance/README.md, "TLS and mTLS"): the options production relies on, checked
 * against the real server rather than a proxy.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { GrpcStatus, IdemdClient, RpcError, v1, type TlsOptions } from "../src";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { ENDPOINT, PAYMENT } from "./support/payment";

// Generous for a busy machine, yet short enough that a refused handshake cannot hang the suite.
const DEADLINE_MS = 5_000;

/** The certificates directory; a missing one fails the test (never skipped, per the README). */
function testCerts(): string {
  const dir = process.env.IDEMD_TEST_CERTS;
  if (!dir) {
    throw new Error("IDEMD_TEST_CERTS is not set: run `make test-certs` (make sdk-typescript sets it)");
  }
  const ca = path.join(dir, "ca.pem");
  if (!existsSync(ca)) {
    throw new Error(`IDEMD_TEST_CERTS=${dir} has no ca.pem: run \`make test-certs\``);
  }
  return dir;
}

/** True for a rejection from the transport, i.e. the service itself never answered. */
function isTransportError(err: unknown): boolean {
  return err instanceof RpcError && err.code === GrpcStatus.UNAVAILABLE;
}

describe("TLS and mTLS against a live idemd", () => {
  let certs: string;
  let server: IdemdServer;
  // The server's log names 127.0.0.1; the certificate is checked against the name dialled.
  let address: string;
  const clients: IdemdClient[] = [];

  function client(tls: boolean | TlsOptions): IdemdClient {
    const c = new IdemdClient({ address, tls, deadlineMs: DEADLINE_MS });
    clients.push(c);
    return c;
  }
  function alice(): IdemdClient {
    return client({
      caFile: path.join(certs, "ca.pem"),
      certFile: path.join(certs, "alice.crt"),
      keyFile: path.join(certs, "alice.key"),
    });
  }
  function bob(): IdemdClient {
    // The PEM-given-directly form, so both forms of the options meet the real server.
    return client({
      ca: readFileSync(path.join(certs, "ca.pem")),
      cert: readFileSync(path.join(certs, "bob.crt"), "utf8"),
      key: readFileSync(path.join(certs, "bob.key")),
    });
  }

  before(async () => {
    certs = testCerts();
    // No tokens file: the tenant can only come from the client certificate.
    server = await startIdemd({
      auth: false,
      extraArgs: [
        "--tls-cert", path.join(certs, "server.crt"),
        "--tls-key", path.join(certs, "server.key"),
        "--tls-client-ca", path.join(certs, "ca.pem"),
        "--tls-client-tenants", path.join(certs, "client-tenants.txt"),
      ],
    });
    address = `localhost:${server.address.split(":").pop()}`;
  });
  after(async () => {
    for (const c of clients) c.close();
    await server?.stop();
  });

  test("Alice's certificate runs the handler once, then replays", async () => {
    const key = randomUUID();
    let calls = 0;
    const handler = (): { status: number; body: string } => {
      calls += 1;
      return { status: 201, body: '{"id":"pay_tls"}' };
    };
    const a = alice();
    const first = await a.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler });
    assert.equal(calls, 1, "handler calls");
    assert.deepEqual([first.replayed, first.response.status, first.response.body.toString()], [false, 201, '{"id":"pay_tls"}']);
    const second = await a.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler });
    assert.equal(calls, 1, "handler calls after the replay");
    assert.deepEqual([second.replayed, second.response.status, second.response.body.toString()], [true, 201, '{"id":"pay_tls"}']);
  });

  test("Bob's certificate does not see Alice's key: the tenant comes from the certificate", async () => {
    const key = randomUUID();
    const a = alice();
    await a.executeOnce({ endpoint: ENDPOINT, key, request: PAYMENT, handler: () => ({ status: 201 }) });
    // Alice sees her record, so Bob's NOT_FOUND is the tenant boundary, not a lost write.
    assert.equal((await a.lookup({ endpoint: ENDPOINT, key })).record?.state, v1.State.STATE_COMPLETED);
    await assert.rejects(
      bob().lookup({ endpoint: ENDPOINT, key }),
      (err) => err instanceof RpcError && err.code === GrpcStatus.NOT_FOUND,
    );
  });

  test("the CA without a client certificate gets no answer from the service", async () => {
    const anonymous = client({ caFile: path.join(certs, "ca.pem") });
    // TLS 1.3 completes the client's side of the handshake before the server refuses it, so
    // the refusal surfaces on this first call rather than at connect.
    await assert.rejects(anonymous.lookup({ endpoint: ENDPOINT, key: randomUUID() }), isTransportError);
  });

  test("a plaintext client gets no answer from the service", async () => {
    await assert.rejects(client(false).lookup({ endpoint: ENDPOINT, key: randomUUID() }), isTransportError);
  });
});

describe("TLS client certificate options", () => {
  const dummy = "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";

  test("a certificate without a key is refused when the client is created", () => {
    assert.throws(
      () => new IdemdClient({ address: "127.0.0.1:1", tls: { cert: dummy } }),
      (err) => err instanceof TypeError && /certificate and key go together/.test(err.message),
    );
    assert.throws(
      () => new IdemdClient({ address: "127.0.0.1:1", tls: { certFile: "/dev/null" } }),
      /certificate and key go together/,
    );
  });

  test("a key without a certificate is refused when the client is created", () => {
    assert.throws(
      () => new IdemdClient({ address: "127.0.0.1:1", tls: { key: dummy } }),
      /certificate and key go together/,
    );
    assert.throws(
      () => new IdemdClient({ address: "127.0.0.1:1", tls: { keyFile: "/dev/null" } }),
      /certificate and key go together/,
    );
  });

  test("a missing certificate file is reported when the client is created", () => {
    assert.throws(
      () => new IdemdClient({ address: "127.0.0.1:1", tls: { certFile: "/nonexistent/alice.crt", keyFile: "/nonexistent/alice.key" } }),
      /ENOENT/,
    );
  });
});
