/**
 * clients/conformance/consumer-scenarios.json against a real Kafka broker and a live idemd, with
 * the consumer program (examples/kafka-consumer.ts) as separate processes; each scenario with
 * `negative_control` is played again without the helper and must then fail its side effects. Every
 * scenario is played in each of the program's modes (sequential, pipelined, parallel: the latter
 * two through processBatch, with --parallelism 4); IDEMD_CONSUMER_MODES narrows them.
 *
 * The broker comes from IDEMD_TEST_KAFKA_BROKERS (test.sh runs the suite under
 * `scripts/kafka.sh run`, which sets it). test.sh also sets IDEMD_TEST_KAFKA_REQUIRED=1: without a
 * broker the suite then fails, since a skipped suite would hide a broken setup; a developer running
 * the unit tests alone gets it skipped.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { checkExpect, KafkaScenarios, loadScenarios, sideEffectFailures, type Mode } from "./support/kafka-scenarios";

const brokers = process.env.IDEMD_TEST_KAFKA_BROKERS;
const required = process.env.IDEMD_TEST_KAFKA_REQUIRED === "1";
const file = loadScenarios();
const modes = (process.env.IDEMD_CONSUMER_MODES ?? "").split(/\s+/).filter((m) => m !== "") as Mode[];
if (modes.length === 0) modes.push("sequential", "pipelined", "parallel");

describe("consumer scenarios against a real Kafka broker", { skip: !brokers && !required && "IDEMD_TEST_KAFKA_BROKERS is unset" }, () => {
  let server: IdemdServer;
  let scenarios: KafkaScenarios;

  before(async () => {
    assert.ok(brokers, "IDEMD_TEST_KAFKA_BROKERS is unset: run under scripts/kafka.sh run -- (test.sh does)");
    server = await startIdemd();
    scenarios = new KafkaScenarios(brokers, server.address);
    await scenarios.connect();
  });
  after(async () => {
    await scenarios?.close();
    await server?.stop();
  });

  for (const mode of modes) file.scenarios.forEach((scenario, index) => {
    test(`${mode}: ${scenario.name}`, { timeout: 180_000 }, async () => {
      const played = await scenarios.play(file, scenario, index, false, mode);
      assert.deepEqual(checkExpect(scenario, played, mode), []);
      // The negative control runs no helper, so one mode plays it.
      if (scenario.negative_control && mode === modes[0]) {
        const unguarded = await scenarios.play(file, scenario, index, true);
        assert.notDeepEqual(sideEffectFailures(scenario, unguarded), [], "without the helper, some side effect must repeat");
      }
    });
  });
});
