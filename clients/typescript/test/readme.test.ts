/**
 * README.md's usage example, exactly as written: extracted, type-checked against the built
 * package (imported by its name, "@idemd/client"), compiled and run against a live idemd.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";
import ts from "typescript";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { sdkRoot } from "./support/paths";

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
