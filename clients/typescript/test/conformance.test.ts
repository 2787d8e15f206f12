/** The shared conformance scenarios (clients/conformance/scenarios.json) against a live idemd. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { ScenarioRunner, type ScenarioFile } from "./support/conformance";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { conformanceDir } from "./support/paths";

const file = JSON.parse(readFileSync(path.join(conformanceDir, "scenarios.json"), "utf8")) as ScenarioFile;

describe("conformance scenarios", () => {
  let server: IdemdServer;
  before(async () => {
    server = await startIdemd();
  });
  after(async () => {
    await server?.stop();
  });

  test("scenario file is version 1 and not empty", () => {
    assert.equal(file.version, 1);
    assert.ok(file.scenarios.length > 0);
  });

  for (const scenario of file.scenarios) {
    test(scenario.name, async () => {
      await new ScenarioRunner(server.address, file.credentials).run(scenario.steps);
    });
  }

  // The runner itself: what it does not understand, or a wrong expectation, fails loudly.
  describe("the runner", () => {
    const execute = structuredClone(
      file.scenarios.flatMap((s) => s.steps).find((step) => step.op === "execute" && step.handler !== undefined
        && (step.handler as { action?: string }).action === "respond" && step.as === "alice" && step.parallel === undefined)!,
    );
    const cases: Array<[string, Record<string, unknown>, RegExp]> = [
      ["an unknown op", { op: "teleport", as: "alice" }, /step 0 \(teleport\): unknown op/],
      ["an unknown step field", { ...execute, retries: 3 }, /unknown step field "retries"/],
      ["an unknown expect field", { ...execute, expect: { result: "executed", latency_ms: 5 } }, /unknown expect field "latency_ms"/],
      ["an unknown handler action", { ...execute, handler: { action: "explode" } }, /unknown handler action "explode"/],
      ["an unknown result", { ...execute, expect: { result: "teleported" } }, /unknown result "teleported"/],
      ["a wrong expectation", { ...execute, expect: { result: "replayed" } }, /step 0 \(execute\): execute result/],
    ];
    for (const [name, step, message] of cases) {
      test(`fails on ${name}`, async () => {
        await assert.rejects(new ScenarioRunner(server.address, file.credentials).run([step]), message);
      });
    }
  });
});
