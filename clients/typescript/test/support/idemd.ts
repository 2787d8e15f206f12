/**
 * Starts a real idemd for the tests, as clients/conformance/README.md says: port 0, a fresh
 * data directory, the conformance policies and tokens, JSON logs on stderr (the bound address
 * is read from the "idemd serving" line); stopped with SIGTERM.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { createInterface } from "node:readline";
import { conformanceDir, repoRoot } from "./paths";

export interface IdemdServer {
  /** `127.0.0.1:PORT` */
  address: string;
  stop(): Promise<void>;
}

const START_TIMEOUT_MS = 20_000;
const STOP_TIMEOUT_MS = 15_000;

export function idemdBinary(): string {
  return process.env.IDEMD_BIN || path.join(repoRoot, "target", "debug", "idemd");
}

export interface StartOptions {
  /**
   * false: no tokens file, so the tenant comes from `x-tenant-id` (a development server).
   * Default true: the conformance tokens.
   */
  auth?: boolean;
  /** `--listen` (default `127.0.0.1:0`): a restart on the address of an earlier server. */
  listen?: string;
  /** More server arguments, appended after the standard ones (e.g. the TLS test's `--tls-*`). */
  extraArgs?: string[];
  /** Another binary than IDEMD_BIN's (e.g. the previous release, IDEMD_PREVIOUS_BIN). */
  bin?: string;
}

export async function startIdemd(options: StartOptions = {}): Promise<IdemdServer> {
  const bin = options.bin ?? idemdBinary();
  if (!existsSync(bin)) {
    throw new Error(`idemd binary not found at ${bin}: build it (cargo build) or set IDEMD_BIN`);
  }
  const dataDir = mkdtempSync(path.join(tmpdir(), "idemd-ts-"));
  const args = [
    "--listen", options.listen ?? "127.0.0.1:0",
    "--data-dir", dataDir,
    "--config", path.join(conformanceDir, "idemd.toml"),
    ...(options.auth === false ? [] : ["--auth-tokens", path.join(conformanceDir, "tokens.txt")]),
    "--log-format", "json",
    ...(options.extraArgs ?? []),
  ];
  const child = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"] });
  const tail: string[] = [];
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  try {
    const address = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`idemd did not report "idemd serving" within ${START_TIMEOUT_MS} ms`)),
        START_TIMEOUT_MS,
      );
      child.once("error", (err) => {
        clearTimeout(timer);
        reject(err);
      });
      child.once("exit", (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`idemd exited (code ${code}, signal ${signal}) before serving:\n${tail.join("\n")}`));
      });
      createInterface({ input: child.stderr! }).on("line", (line) => {
        tail.push(line);
        if (tail.length > 50) tail.shift();
        let entry: { message?: unknown; address?: unknown };
        try {
          entry = JSON.parse(line);
        } catch {
          return;
        }
        if (entry.message === "idemd serving" && typeof entry.address === "string") {
          clearTimeout(timer);
          resolve(entry.address);
        }
      });
    });
    return { address, stop: () => stop(child, exited, dataDir) };
  } catch (err) {
    await stop(child, exited, dataDir);
    throw err;
  }
}

async function stop(child: ChildProcess, exited: Promise<void>, dataDir: string): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS);
    await exited;
    clearTimeout(timer);
  }
  rmSync(dataDir, { recursive: true, force: true });
}
