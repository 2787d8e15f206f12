/**
 * README.md's usage example, exactly as written: extracted, type-checked against the built
 * package (imported by its name, "@idemd/client"), compiled and run against a live idemd.
 */
import assert from "node:assert/strict";
import { execFile, execFileSync, spawn } from "node:child_process";
import * as http from "node:http";
import * as net from "node:net";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";
import ts from "typescript";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { repoRoot, sdkRoot } from "./support/paths";
import { freePort } from "./support/ports";

const run = promisify(execFile);

/** The first ```ts block of the README's "## Usage" section. */
function usageExample(): string {
  const readme = readFileSync(path.join(sdkRoot, "README.md"), "utf8");
  const section = readme.split(/^## Usage$/m)[1];
  assert.ok(section, "README.md has a ## Usage section");
  const match = /^```ts\n([\s\S]*?)^```$/m.exec(section);
  assert.ok(match, "the Usage section has a ```ts block");
  return match[1]!;
}

let server: IdemdServer;
let dir: string;

before(async () => {
  server = await startIdemd();
});
after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test("README usage example type-checks and runs as written", async () => {
  const source = usageExample();
  assert.match(source, /from "@idemd\/client"/);
  // A throwaway project that depends on this package the way a user's would.
  dir = mkdtempSync(path.join(tmpdir(), "idemd-readme-"));
  mkdirSync(path.join(dir, "node_modules", "@idemd"), { recursive: true });
  symlinkSync(sdkRoot, path.join(dir, "node_modules", "@idemd", "client"), "dir");
  const file = path.join(dir, "example.mts");
  writeFileSync(file, source);

  const program = ts.createProgram([file], {
    target: ts.ScriptTarget.ES2022,
    lib: ["lib.es2022.d.ts"],
    module: ts.ModuleKind.Node16,
    moduleResolution: ts.ModuleResolutionKind.Node16,
    types: ["node"],
    typeRoots: [path.join(sdkRoot, "node_modules", "@types")],
    strict: true,
    skipLibCheck: true,
    outDir: dir,
  });
  const emitted = program.emit();
  const diagnostics = ts.getPreEmitDiagnostics(program).concat(emitted.diagnostics);
  assert.deepEqual(
    diagnostics.map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n")),
    [],
    "the README example type-checks",
  );

  const { stdout } = await run(process.execPath, [path.join(dir, "example.mjs")], {
    cwd: dir,
    env: { ...process.env, IDEMD_ADDRESS: server.address, IDEMD_TOKEN: "conformance-token-alice-3f9a" },
    timeout: 30_000,
  });
  assert.equal(stdout.trim(), '201 false {"id":"pay_1","status":"succeeded"}');
});

/** The ```ts block of the README's "## HTTP middleware" section. */
function middlewareExample(): string {
  const readme = readFileSync(path.join(sdkRoot, "README.md"), "utf8");
  const section = readme.split(/^## HTTP middleware$/m)[1];
  assert.ok(section, "README.md has a ## HTTP middleware section");
  const match = /^```ts\n([\s\S]*?)^```$/m.exec(section);
  assert.ok(match, "the HTTP middleware section has a ```ts block");
  return match[1]!;
}

test("README middleware example type-checks, serves and replays as written", async () => {
  const source = middlewareExample();
  const project = mkdtempSync(path.join(tmpdir(), "idemd-readme-mw-"));
  try {
    mkdirSync(path.join(project, "node_modules", "@idemd"), { recursive: true });
    symlinkSync(sdkRoot, path.join(project, "node_modules", "@idemd", "client"), "dir");
    // The framework and its types, as `npm install express @types/express` would put them.
    symlinkSync(path.join(sdkRoot, "node_modules", "express"), path.join(project, "node_modules", "express"), "dir");
    symlinkSync(path.join(sdkRoot, "node_modules", "@types"), path.join(project, "node_modules", "@types"), "dir");
    const file = path.join(project, "server.mts");
    writeFileSync(file, source);
    const program = ts.createProgram([file], {
      target: ts.ScriptTarget.ES2022,
      lib: ["lib.es2022.d.ts"],
      module: ts.ModuleKind.Node16,
      moduleResolution: ts.ModuleResolutionKind.Node16,
      types: ["node"],
      typeRoots: [path.join(sdkRoot, "node_modules", "@types")],
      strict: true,
      skipLibCheck: true,
      esModuleInterop: true,
      outDir: project,
    });
    const emitted = program.emit();
    const diagnostics = ts.getPreEmitDiagnostics(program).concat(emitted.diagnostics);
    assert.deepEqual(diagnostics.map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n")), []);

    const port = await freePort();
    const child = spawn(process.execPath, [path.join(project, "server.mjs")], {
      cwd: project,
      env: { ...process.env, IDEMD_ADDRESS: server.address, IDEMD_TOKEN: "conformance-token-alice-3f9a", PORT: String(port) },
      stdio: ["ignore", "pipe", "pipe"],
    });
    // What the served program printed, for the failure message: a program that dies at start or
    // never listens must say why.
    let printed = "";
    child.stdout?.on("data", (chunk: Buffer) => (printed += chunk.toString()));
    child.stderr?.on("data", (chunk: Buffer) => (printed += chunk.toString()));
    try {
      const key = `readme-${Date.now()}`;
      const post = async (): Promise<Response> => {
        // Up to 60 s: a cold start of Node, Express and the SDK on a busy CI machine, not the time
        // a user waits; a child that exited fails at once.
        for (let attempt = 0; ; attempt++) {
          try {
            return await fetch(`http://127.0.0.1:${port}/v1/payments/p1`, {
              method: "POST",
              headers: { "Idempotency-Key": key, "Content-Type": "application/json" },
              body: "{}",
            });
          } catch (error) {
            if (child.exitCode !== null || attempt > 600) {
              throw new Error(
                `the README's middleware server never answered (exit code ${child.exitCode}): ${String(error)}\n${printed}`,
              );
            }
            await new Promise((resolve) => setTimeout(resolve, 100)); // still starting
          }
        }
      };
      const first = await post();
      const firstBody = await first.text();
      const again = await post();
      assert.equal(first.status, 201);
      assert.equal(first.headers.get("idempotent-replayed"), null);
      assert.equal(again.status, 201);
      assert.equal(again.headers.get("idempotent-replayed"), "true");
      assert.equal(await again.text(), firstBody);
    } finally {
      child.kill("SIGTERM");
    }
  } finally {
    rmSync(project, { recursive: true, force: true });
  }
});

/** The ```ts block of the README's "## Through a proxy, with TLS" section. */
function proxyExample(): string {
  const readme = readFileSync(path.join(sdkRoot, "README.md"), "utf8");
  const section = readme.split(/^## Through a proxy, with TLS$/m)[1];
  assert.ok(section, "README.md has a ## Through a proxy, with TLS section");
  const match = /^```ts\n([\s\S]*?)^```$/m.exec(section);
  assert.ok(match, "the proxy section has a ```ts block");
  return match[1]!;
}

test("README proxy + TLS example runs as written through nginx with TLS, directly and through https_proxy", async () => {
  const certs = process.env.IDEMD_TEST_CERTS;
  assert.ok(certs && existsSync(path.join(certs, "ca.pem")), "IDEMD_TEST_CERTS (make test-certs) is required");
  const source = proxyExample();
  assert.match(source, /from "@idemd\/client"/);
  const project = mkdtempSync(path.join(tmpdir(), "idemd-readme-proxy-"));
  const nginxDir = path.join(project, "nginx");
  const nginx = process.env.IDEMD_NGINX_SH || path.join(repoRoot, "scripts", "nginx.sh");
  // An HTTP CONNECT proxy that counts its tunnels, as an egress proxy would carry them.
  let tunnels = 0;
  const sockets: net.Socket[] = [];
  const egress = http.createServer((_req, res) => res.writeHead(405).end());
  egress.on("connect", (req: http.IncomingMessage, client: net.Socket, head: Buffer) => {
    tunnels += 1;
    const [host, port] = (req.url ?? "").split(":");
    const upstream = net.connect({ host, port: Number(port) }, () => {
      client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (head.length > 0) upstream.write(head);
      upstream.pipe(client);
      client.pipe(upstream);
    });
    for (const s of [client, upstream]) {
      sockets.push(s);
      s.on("error", () => {});
    }
  });
  await new Promise<void>((resolve) => egress.listen(0, "127.0.0.1", resolve));
  try {
    mkdirSync(path.join(project, "node_modules", "@idemd"), { recursive: true });
    symlinkSync(sdkRoot, path.join(project, "node_modules", "@idemd", "client"), "dir");
    const file = path.join(project, "ingress.mts");
    writeFileSync(file, source);
    const program = ts.createProgram([file], {
      target: ts.ScriptTarget.ES2022,
      lib: ["lib.es2022.d.ts"],
      module: ts.ModuleKind.Node16,
      moduleResolution: ts.ModuleResolutionKind.Node16,
      types: ["node"],
      typeRoots: [path.join(sdkRoot, "node_modules", "@types")],
      strict: true,
      skipLibCheck: true,
      outDir: project,
    });
    const emitted = program.emit();
    const diagnostics = ts.getPreEmitDiagnostics(program).concat(emitted.diagnostics);
    assert.deepEqual(diagnostics.map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n")), []);

    const address = execFileSync("bash", [nginx, "start", "--dir", nginxDir, "--upstream", server.address, "--profile", "tls", "--certs", certs], { encoding: "utf8" }).trim();
    // The certificate names localhost; nginx listens on 127.0.0.1.
    const ingress = `localhost:${address.split(":").pop()}`;
    const env: NodeJS.ProcessEnv = { ...process.env, IDEMD_INGRESS: ingress, IDEMD_CA_FILE: path.join(certs, "ca.pem"), IDEMD_TOKEN: "conformance-token-alice-3f9a" };
    for (const name of ["grpc_proxy", "https_proxy", "http_proxy", "no_grpc_proxy", "no_proxy"]) delete env[name];
    const direct = await run(process.execPath, [path.join(project, "ingress.mjs")], { cwd: project, env, timeout: 30_000 });
    assert.equal(direct.stdout.trim(), "201 false");
    assert.equal(tunnels, 0);
    const proxied = await run(process.execPath, [path.join(project, "ingress.mjs")], {
      cwd: project, env: { ...env, https_proxy: `http://127.0.0.1:${(egress.address() as net.AddressInfo).port}` }, timeout: 30_000,
    });
    assert.equal(proxied.stdout.trim(), "201 false");
    assert.equal(tunnels, 1, "the call went through the https_proxy tunnel");
  } finally {
    execFileSync("bash", [nginx, "stop", "--dir", nginxDir]);
    sockets.forEach((s) => s.destroy());
    await new Promise<void>((resolve) => egress.close(() => resolve()));
    rmSync(project, { recursive: true, force: true });
  }
});
