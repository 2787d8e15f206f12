/**
 * clients/conformance/consumer-scenarios.json against a real Kafka broker and a live idemd, with
 * the consumer program (examples/kafka-consumer.ts) as separate processes; each scenario with
 * `negative_control` is played again without the helper and must then fail its side effects.
 *
 * The broker comes from IDEMD_TEST_KAFKA_BROKERS (test.sh runs the suite under
 * `scripts/kafka.sh run`, which sets it). test.sh also sets IDEMD_TEST_KAFKA_REQUIRED=1: without a
 * broker the suite then fails, since a skipped suite would hide a broken setup; a developer running
 * the unit tests alone gets it skipped.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { startIdemd, type IdemdServer } from "./support/idemd";
import { checkExpect, KafkaScenarios, loadScenarios, sideEffectFailures } from "./support/kafka-scenarios";

const brokers = process.env.IDEMD_TEST_KAFKA_BROKERS;
const required = process.env.IDEMD_TEST_KAFKA_REQUIRED === "1";
const file = loadScenarios();

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

  file.scenarios.forEach((scenario, index) => {
    test(scenario.name, { timeout: 180_000 }, async () => {
      const played = await scenarios.play(file, scenario, index, false);
      assert.deepEqual(checkExpect(scenario, played), []);
      if (scenario.negative_control) {
        const unguarded = await scenarios.play(file, scenario, index, true);
        assert.notDeepEqual(sideEffectFailures(scenario, unguarded), [], "without the helper, some side effect must repeat");
      }
    });
  });
});
