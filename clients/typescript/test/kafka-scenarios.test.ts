/**
 * clients/conformance/consumer-scenarios.json against a real Kafka broker and a live idemd, with
 * the consumer program (examples/kafka-consumer.ts) as separate processes; each scenario with
 * `negative_control` is played again without the helper and must then fail its side effects, and
 * the helper may cost it at most 1.3x the time without it (and, after a kill inside a handler, at
 * most STALL_BOUND_MS more of the partition's stall). Every
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

/**
 * How much longer than without the helper a consumer killed inside its handler may hold its
 * partition with the helper's defaults (issue 52: at most about DEFAULT_CONSUMER_LEASE_MS); the Go
 * runner's stallBound.
 */
const STALL_BOUND_MS = 5_000;
const seconds = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

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
      let started = Date.now();
      const played = await scenarios.play(file, scenario, index, false, mode);
      assert.deepEqual(checkExpect(scenario, played, mode), []);
      // The negative control runs no helper, so one mode plays it.
      if (scenario.negative_control && mode === modes[0]) {
        const withHelper = Date.now() - started;
        started = Date.now();
        const unguarded = await scenarios.play(file, scenario, index, true);
        const without = Date.now() - started;
        const failures: string[] = [];
        // What the helper costs a scenario with a kill: the wait for the dead consumer's lease
        // beside the group's own session timeout, which the run without the helper waits alone.
        const ratio = withHelper / without;
        console.log(`played in ${seconds(withHelper)} with the helper, ${seconds(without)} without: ${ratio.toFixed(2)}x`);
        if (ratio > 1.3) failures.push(`the helper made the scenario ${ratio.toFixed(2)}x slower (bound 1.3x)`);
        // A kill inside a handler: the partition waits for the group to notice (the session
        // timeout, as without the helper), then for the dead consumer's lease: with the defaults
        // (5 s, extended at half) that wait is over by the time the group has noticed.
        if (scenario.consumers.some((c) => c.kill_in_handler_after_side_effect_of !== undefined)) {
          const [stall, bareStall] = [played.stallMs, unguarded.stallMs];
          if (stall === undefined || bareStall === undefined) {
            failures.push(`the killed message was not decided again in both runs (stall ${stall} ms with the helper, ${bareStall} ms without)`);
          } else {
            console.log(`partition stalled ${seconds(stall)} after the kill with the helper, ${seconds(bareStall)} without ` +
              `(the group's session timeout); the helper's share ${seconds(stall - bareStall)}`);
            if (stall - bareStall > STALL_BOUND_MS) {
              failures.push(`the helper stalled the partition ${seconds(stall - bareStall)} beyond the group's own ${seconds(bareStall)} (bound ${seconds(STALL_BOUND_MS)})`);
            }
          }
        }
        if (sideEffectFailures(scenario, unguarded).length === 0) failures.push("without the helper, some side effect must repeat");
        assert.deepEqual(failures, []);
      }
    });
  });
});
