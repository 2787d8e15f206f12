/**
 * A fresh project outside the repository installs the SDK exactly as README.md's Install section
 * says and runs a user's first program against a live idemd (clients/conformance/README.md,
 * "Consumer project").
 *
 * The "checkout" the tarball is packed from is a copy of exactly the files git would ship for
 * clients/typescript and proto (tracked, plus untracked and not ignored: what the build
 * needs), so stubs or a dist/ that exist here but are git-ignored cannot hide a packaging defect
 * such as a tarball without its compiled JavaScript. The Install block's commands run as written,
 * with the two placeholder paths replaced, in a shell without this npm run's npm_* variables.
 * Dependencies come from the npm cache when it has them (npm_config_prefer_offline), else from
 * the registry. The program is type-checked with the SDK's own TypeScript compiler (no download)
 * against the types of the installed package, compiled and run with node.
 */
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { chmodSync, copyFileSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { Kafka, logLevel, Partitioners } from "kafkajs";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { repoRoot, sdkRoot } from "./support/paths";
import { freePort } from "./support/ports";

const exec = promisify(execFile);

/** The Install block's placeholders: the checkout, and the user's project. */
const CHECKOUT = "/path/to/idemd";
const PROJECT = "/path/to/your-project";
/**
 * What git ships and the build reads: the SDK and the proto. Not the repository's scripts/: its
 * protoc.sh needs Maven, which a TypeScript user need not have (buf comes from npm).
 */
const SHIPPED = ["clients/typescript", "proto"];

const manifest = JSON.parse(readFileSync(path.join(sdkRoot, "package.json"), "utf8")) as { name: string; version: string };
/** `npm pack`'s file name: "@idemd/client" 0.1.0 → idemd-client-0.1.0.tgz. */
const TARBALL = `${manifest.name.replace(/^@/, "").replace("/", "-")}-${manifest.version}.tgz`;

/** What README.md's Install section must say, line for line (comments aside): the test runs it. */
const INSTALL = [
  `cd ${CHECKOUT}`,
  "npm ci --prefix clients/typescript",
  "npm pack ./clients/typescript",
  `cd ${PROJECT}`,
  `npm install ${CHECKOUT}/${TARBALL}`,
];

/** A user's first program, its handler defined apart from the call as a user would write it. */
const PROGRAM = `import { IdemdClient, KeyReuseError } from "@idemd/client";

const idemd = new IdemdClient({ address: process.env.IDEMD_ADDRESS ?? "127.0.0.1:50051", token: process.env.IDEMD_TOKEN, tls: false });
const key = crypto.randomUUID();
let calls = 0;
const charge = async () => {
  calls++;
  return { status: 201, headers: [["Content-Type", "application/json"]], body: '{"id":"pay_1"}' };
};
for (const body of ['{"amount":4200}', '{"amount":4200}', '{"amount":9900}']) {
  const request = { method: "POST", path: "/v1/payments", contentType: "application/json", body };
  try {
    const { response, replayed } = await idemd.executeOnce({ endpoint: "POST /v1/payments", key, request, handler: charge });
    console.log(response.status, response.body.toString(), "replayed:", replayed, "handler calls:", calls);
  } catch (err) {
    if (!(err instanceof KeyReuseError)) throw err;
    console.log("key reuse:", err.httpStatus, err.errorCode, "handler calls:", calls);
  }
}
idemd.close();
`;

const EXPECTED_OUTPUT = [
  '201 {"id":"pay_1"} replayed: false handler calls: 1',
  '201 {"id":"pay_1"} replayed: true handler calls: 1',
  "key reuse: 422 idempotency_key_reuse handler calls: 1",
].join("\n");

/** The files the tarball must hold for `import "@idemd/client"` to load and type-check. */
const PACKED = [
  "package/package.json",
  "package/dist/src/index.js",
  "package/dist/src/index.d.ts",
  "package/dist/src/executor.js",
  "package/dist/src/gen/idemd/v1/idempotency.js",
  "package/dist/src/gen/idemd/v1/idempotency.d.ts",
];

/** The commands of the sh block of README.md's "## Install" section, comments and blank lines left out. */
function installCommands(): string[] {
  const readme = readFileSync(path.join(sdkRoot, "README.md"), "utf8");
  const section = /^## Install\n([\s\S]*?)(?=^## )/m.exec(readme);
  assert.ok(section, "README.md has a ## Install section");
  const block = /^```sh\n([\s\S]*?)^```$/m.exec(section[1]!);
  assert.ok(block, "the Install section has a ```sh block");
  return block[1]!
    .split("\n")
    .map((line) => line.replace(/#.*/, "").trim())
    .filter((line) => line !== "");
}

/** Copies the files git would ship under `dirs` (tracked, and untracked but not ignored) to `dest`. */
async function copyShippedFiles(dirs: string[], dest: string): Promise<void> {
  const { stdout } = await exec("git", ["-C", repoRoot, "ls-files", "-z", "-co", "--exclude-standard", "--", ...dirs], {
    maxBuffer: 16 << 20,
  });
  const files = stdout.split("\0").filter((file) => file !== "");
  assert.ok(files.includes("clients/typescript/package.json"), `git ls-files lists ${files.length} files`);
  for (const file of files) {
    const source = path.join(repoRoot, file);
    if (!existsSync(source)) continue; // tracked but deleted in the work tree: not shipped by this checkout
    const target = path.join(dest, file);
    mkdirSync(path.dirname(target), { recursive: true });
    copyFileSync(source, target);
    chmodSync(target, statSync(source).mode & 0o777);
  }
}

/** A user's shell: this process's environment without what `npm run` and `node --test` add. */
function userEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (/^npm_/i.test(name) || name === "INIT_CWD" || name === "NODE_TEST_CONTEXT") continue;
    env[name] = value;
  }
  return {
    ...env,
    npm_config_prefer_offline: "true",
    npm_config_audit: "false",
    npm_config_fund: "false",
    npm_config_update_notifier: "false",
    ...extra,
  };
}

/** Runs a command; on failure, the error carries its output. */
async function run(file: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = userEnv()): Promise<string> {
  try {
    const { stdout } = await exec(file, args, { cwd, env, timeout: 10 * 60_000, maxBuffer: 64 << 20 });
    return stdout;
  } catch (err) {
    const { stdout = "", stderr = "" } = err as { stdout?: string; stderr?: string };
    throw new Error(`${[file, ...args].join(" ")} failed in ${cwd}: ${String(err)}\n${stdout.slice(-4000)}\n${stderr.slice(-4000)}`);
  }
}

let server: IdemdServer;
let dir: string | undefined;
/** The fresh project the second test installs everything into; the third reuses it. */
let project: string | undefined;

before(async () => {
  server = await startIdemd();
});
after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test("README's Install section is the commands the consumer test runs", () => {
  assert.deepEqual(installCommands(), INSTALL);
});

test("a fresh project installs the packed SDK as the README says and runs against idemd", { timeout: 20 * 60_000 }, async () => {
  dir = mkdtempSync(path.join(tmpdir(), "idemd-ts-consumer-"));
  assert.ok(path.relative(repoRoot, dir).startsWith(".."), `${dir} is inside the repository: set TMPDIR elsewhere`);
  const checkout = path.join(dir, "idemd");
  project = path.join(dir, "your-project");
  await copyShippedFiles(SHIPPED, checkout);
  mkdirSync(project);
  await run("npm", ["init", "-y"], project);

  // The README's commands, as written, in one shell (the `cd`s carry over).
  const script = installCommands()
    .join("\n")
    .split(CHECKOUT).join(checkout)
    .split(PROJECT).join(project);
  await run("bash", ["-euo", "pipefail", "-c", script], dir);

  const packed = (await run("tar", ["-tzf", path.join(checkout, TARBALL)], dir)).split("\n");
  const missing = PACKED.filter((file) => !packed.includes(file));
  assert.deepEqual(missing, [], `the tarball lacks files; it holds:\n${packed.join("\n")}`);
  const installed = path.join(project, "node_modules", "@idemd", "client");
  assert.ok(lstatSync(installed).isDirectory(), `${installed} is a copy of the package, not a link to a folder`);

  // Type-check with the types of the installed package, including its own .d.ts files.
  writeFileSync(path.join(project, "app.mts"), PROGRAM);
  writeFileSync(
    path.join(project, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022",
        lib: ["ES2022"],
        module: "node16",
        moduleResolution: "node16",
        strict: true,
        skipLibCheck: false,
        types: ["node"],
        typeRoots: [path.join(sdkRoot, "node_modules", "@types")],
        outDir: "out",
      },
      files: ["app.mts"],
    }),
  );
  const tsc = path.join(sdkRoot, "node_modules", "typescript", "bin", "tsc");
  await run(process.execPath, [tsc, "-p", ".", "--noEmit"], project);
  // Then compile (to out/app.mjs), listing the files read: the types came from the tarball.
  const listed = (await run(process.execPath, [tsc, "-p", ".", "--listFiles"], project)).split("\n");
  for (const file of ["dist/src/index.d.ts", "dist/src/executor.d.ts", "dist/src/gen/idemd/v1/idempotency.d.ts"]) {
    assert.ok(listed.includes(path.join(installed, file)), `tsc did not read ${file} of the installed package:\n${listed.join("\n")}`);
  }

  const output = await run(process.execPath, [path.join(project, "out", "app.mjs")], project, userEnv({
    IDEMD_ADDRESS: server.address,
    IDEMD_TOKEN: "conformance-token-alice-3f9a",
  }));
  assert.equal(output.trim(), EXPECTED_OUTPUT);

  // The README's middleware block, as written, in the same project: Express installed next to the
  // SDK as the README says (at the versions this package's tests use), compiled, served, one
  // payment posted twice.
  const dev = (JSON.parse(readFileSync(path.join(sdkRoot, "package.json"), "utf8")) as {
    devDependencies: Record<string, string>;
  }).devDependencies;
  await run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline",
    `express@${dev["express"]}`, `@types/express@${dev["@types/express"]}`], project);
  const readme = readFileSync(path.join(sdkRoot, "README.md"), "utf8");
  const block = /^```ts\n([\s\S]*?)^```$/m.exec(readme.split(/^## HTTP middleware$/m)[1] ?? "");
  assert.ok(block, "README.md has a ```ts block under ## HTTP middleware");
  writeFileSync(path.join(project, "server.mts"), block[1]!);
  writeFileSync(
    path.join(project, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022", lib: ["ES2022"], module: "node16", moduleResolution: "node16", strict: true,
        skipLibCheck: true, esModuleInterop: true, types: ["node"],
        typeRoots: [path.join(project, "node_modules", "@types"), path.join(sdkRoot, "node_modules", "@types")],
        outDir: "out",
      },
      files: ["server.mts"],
    }),
  );
  await run(process.execPath, [tsc, "-p", "."], project);
  const port = await freePort();
  const served = spawn(process.execPath, [path.join(project, "out", "server.mjs")], {
    cwd: project,
    env: userEnv({ IDEMD_ADDRESS: server.address, IDEMD_TOKEN: "conformance-token-alice-3f9a", PORT: String(port) }),
    stdio: ["ignore", "pipe", "pipe"],
  });
  // What the served program printed, for the failure message: a program
  // that dies at start or never listens must say why.
  let printed = "";
  served.stdout?.on("data", (chunk: Buffer) => (printed += chunk.toString()));
  served.stderr?.on("data", (chunk: Buffer) => (printed += chunk.toString()));
  try {
    const key = `consumer-${Date.now()}`;
    const post = async (): Promise<Response> => {
      // Up to 60 s: a cold start of Node, Express and the SDK on a busy CI
      // machine, not the time a user waits.
      for (let attempt = 0; ; attempt++) {
        try {
          return await fetch(`http://127.0.0.1:${port}/v1/payments/p1`, {
            method: "POST", headers: { "Idempotency-Key": key, "Content-Type": "application/json" }, body: "{}",
          });
        } catch (error) {
          if (served.exitCode !== null || attempt > 600) {
            throw new Error(
              `the README's server never answered (exit code ${served.exitCode}): ${String(error)}\n${printed}`,
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
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal(await again.text(), firstBody);
  } finally {
    served.kill("SIGTERM");
  }
});

/**
 * The README's consumer block, as written, in the same project: kafkajs installed next to the SDK
 * as the README says (at this package's version), one message produced twice to a fresh topic of
 * the real broker, the block run until its group committed both: one charge.
 */
test("the README's consumer block charges a message produced twice once, against a real broker", { timeout: 10 * 60_000 }, async (t) => {
  const brokers = process.env.IDEMD_TEST_KAFKA_BROKERS;
  if (!brokers) {
    // test.sh sets IDEMD_TEST_KAFKA_REQUIRED: there a missing broker is a broken setup, not a skip.
    assert.notEqual(process.env.IDEMD_TEST_KAFKA_REQUIRED, "1", "IDEMD_TEST_KAFKA_BROKERS is unset: run under scripts/kafka.sh run --");
    t.skip("IDEMD_TEST_KAFKA_BROKERS is unset");
    return;
  }
  assert.ok(project, "the previous test built the project");
  const dev = (JSON.parse(readFileSync(path.join(sdkRoot, "package.json"), "utf8")) as {
    devDependencies: Record<string, string>;
  }).devDependencies;
  await run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", `kafkajs@${dev["kafkajs"]}`], project);
  const readme = readFileSync(path.join(sdkRoot, "README.md"), "utf8");
  const block = /^```ts\n([\s\S]*?)^```$/m.exec(readme.split(/^## Consumers$/m)[1] ?? "");
  assert.ok(block, "README.md has a ```ts block under ## Consumers");
  writeFileSync(path.join(project, "charger.mts"), block[1]!);
  writeFileSync(
    path.join(project, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022", lib: ["ES2022"], module: "node16", moduleResolution: "node16", strict: true,
        skipLibCheck: true, types: ["node"], typeRoots: [path.join(sdkRoot, "node_modules", "@types")], outDir: "out",
      },
      files: ["charger.mts"],
    }),
  );
  await run(process.execPath, [path.join(sdkRoot, "node_modules", "typescript", "bin", "tsc"), "-p", "."], project);

  const topic = `readme-${Date.now()}`;
  const kafka = new Kafka({ clientId: "idemd-ts-readme", brokers: brokers.split(","), logLevel: logLevel.ERROR });
  const admin = kafka.admin();
  await admin.connect();
  try {
    await admin.createTopics({ topics: [{ topic, numPartitions: 1 }], waitForLeaders: true });
    const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await producer.connect();
    const payment = { headers: { "idempotency-key": `pay-${topic}` }, value: '{"amount":4200}' };
    await producer.send({ topic, messages: [payment, payment] });
    await producer.disconnect();

    const charger = spawn(process.execPath, [path.join(project, "out", "charger.mjs")], {
      cwd: project,
      env: userEnv({ IDEMD_ADDRESS: server.address, IDEMD_TOKEN: "conformance-token-alice-3f9a", KAFKA_BROKERS: brokers, TOPIC: topic }),
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    charger.stdout!.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    charger.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => charger.once("close", (code) => resolve(code)));
    try {
      const deadline = Date.now() + 60_000;
      for (;;) {
        const [committed] = await admin.fetchOffsets({ groupId: `${topic}-charger`, topics: [topic] });
        if (committed?.partitions[0]?.offset === "2") break;
        assert.equal(charger.exitCode, null, `the consumer block exited early:\n${stdout}\n${stderr}`);
        assert.ok(Date.now() < deadline, `the consumer block did not commit both messages within 60 s:\n${stdout}\n${stderr}`);
        await sleep(200);
      }
    } finally {
      charger.kill("SIGTERM");
    }
    assert.equal(await exited, 0, `the consumer block exits 0 on SIGTERM:\n${stderr}`);
    // kafkajs logs on stdout too: the charges are the lines the handler printed.
    const charges = stdout.split("\n").filter((line) => line.startsWith("charged"));
    assert.deepEqual(charges, ['charged {"amount":4200}'], `${stdout}\n${stderr}`);
    assert.doesNotMatch(stderr, /dead letter/);
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
    await admin.disconnect();
  }
});
