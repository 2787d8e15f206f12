"""clients/conformance/consumer-scenarios.json played against a real Kafka broker
($IDEMD_TEST_KAFKA_BROKERS, started by test.sh through scripts/kafka.sh) and the
live idemd, with examples/kafka_consumer.py as separate processes (kills are
real SIGKILLs), as consumer-scenarios.md's "The runner" says, in each of the
program's --mode values (sequential; pipelined and parallel with --parallelism 4). Without a broker
the runner fails when test.sh runs it (IDEMD_TEST_KAFKA_REQUIRED) and skips for
a developer running pytest alone. Topics, producing and committed offsets go
through the ``kafka`` fixture's child process: no librdkafka client runs in
pytest's process (tests/kafka_clients.py says why)."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import CONFORMANCE, CREDENTIALS, SDK_ROOT, Server
from kafka_clients import KafkaClients, Record

if importlib.util.find_spec("confluent_kafka") is None:  # the consumers' (and the child's) client
    pytest.skip("could not import 'confluent_kafka'", allow_module_level=True)

CONTRACT = json.loads((CONFORMANCE / "consumer-scenarios.json").read_text(encoding="utf-8"))
DEFAULTS = CONTRACT["defaults"]
SCENARIOS = CONTRACT["scenarios"]
PROGRAM = SDK_ROOT / "examples" / "kafka_consumer.py"
BOUND = 60.0  # seconds from the first consumer's start until every message is accounted for and committed
RUN_PREFIX = secrets.token_hex(4)


def slug(scenario: dict) -> str:
    return re.sub(r"[^a-z0-9]+", "-", scenario["name"].lower()).strip("-")[:60]


def seconds(text: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)(ms|s)", text).groups()
    return float(number) / (1000 if unit == "ms" else 1)


@dataclass
class Played:
    ledger: List[int]
    dead: List[dict]
    duplicates: int
    expected: List[int]
    poison: List[int]
    log: List[str] = field(default_factory=list)
    stall: Optional[float] = None  # seconds; see play()


@dataclass
class Process:
    entry: dict
    popen: subprocess.Popen
    stdout: Path
    stderr: Path
    terminated: bool = False


def produce(kafka: KafkaClients, topic: str, prefix: str, scenario: dict, partitions: int,
            key_header: str) -> Dict[int, int]:
    """Every message as consumer-scenarios.md step 2 says; returns the end offset of each partition."""
    spec = scenario["produce"]
    poison = set(spec.get("poison", []))
    every = spec.get("duplicate_every")
    records: List[Record] = []
    ends = collections.Counter()
    for n in range(1, spec["messages"] + 1):
        value = json.dumps({"n": n, "poison": n in poison, "amount": 100}).encode()
        headers = [(key_header, f"{prefix}-{n}".encode())]
        targets = [n % partitions]
        if every and n % every == 0:
            targets.append((n + 1) % partitions if spec.get("duplicate_to_other_partition") else n % partitions)
        for partition in targets:
            records.append(Record(value, headers, partition))
            ends[partition] += 1
    config = {"enable.idempotence": True, "linger.ms": 5}
    assert kafka.produce(topic, records, config) == 0, "messages not delivered to the broker within 30 s"
    return {p: ends[p] for p in range(partitions)}


def lines(path: Path) -> List[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


#: The program's --mode values every scenario is played in; $IDEMD_CONSUMER_MODES narrows them.
MODES = os.environ.get("IDEMD_CONSUMER_MODES", "sequential pipelined parallel").split()
#: The program's --parallelism in the batch modes: fewer in flight than a scenario's poll, so that
#: a helper claiming more than its window would show (the crash bound).
BATCH_PARALLELISM = 4


def play(scenario: dict, index: int, kafka: KafkaClients, server: Server, tmp: Path, no_helper: bool,
         mode: str = "sequential") -> Played:
    partitions = scenario.get("partitions", DEFAULTS["partitions"])
    key_header = scenario.get("key_header", DEFAULTS["key_header"])
    # Without a lease the program passes none: the processor's default, idemd.DEFAULT_LEASE.
    lease = scenario.get("lease", DEFAULTS.get("lease"))
    handler_ms = scenario.get("handler_ms", DEFAULTS["handler_ms"])
    run = f"{RUN_PREFIX}{'n' if no_helper else mode[:3]}"
    topic, group, prefix = f"consumer-{run}-{index}", f"group-{run}-{index}", secrets.token_hex(6)
    brokers = kafka.brokers
    kafka.create_topic(topic, partitions)
    ends = produce(kafka, topic, prefix, scenario, partitions, key_header)
    expected = list(range(1, scenario["produce"]["messages"] + 1))
    ledger, dead_file = tmp / "ledger.txt", tmp / "dead-letters.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(SDK_ROOT / "src"), IDEMD_TOKEN=CREDENTIALS["alice"], PYTHONUNBUFFERED="1")

    def start(entry: dict, number: int) -> Process:
        args = [sys.executable, str(PROGRAM), "--brokers", brokers, "--topic", topic, "--group", group,
                "--idemd", server.address, "--key-header", key_header,
                "--handler-ms", str(handler_ms), "--ledger", str(ledger), "--dead-letters", str(dead_file)]
        if lease is not None:
            args += ["--lease", str(seconds(lease))]
        for flag in ("kill_in_handler_after_side_effect_of", "kill_after_side_effect_of"):
            if flag in entry:
                args += ["--" + flag.replace("_", "-"), str(entry[flag])]
        if no_helper:
            args.append("--no-helper")
        elif mode != "sequential":
            args += ["--mode", mode, "--parallelism", str(BATCH_PARALLELISM)]
        out, err = tmp / f"{number}-{entry['name']}.out", tmp / f"{number}-{entry['name']}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            popen = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
        return Process(entry, popen, out, err)

    pending = list(scenario["consumers"])
    started: List[Process] = []
    latest: Dict[str, Process] = {}
    offsets: Dict[int, int] = {}
    checked_offsets_at = 0.0
    began = time.monotonic()
    # The partition's stall after a kill inside a handler: from the moment the killed consumer is
    # seen gone to the moment its message is decided again (dead-lettered with the helper, its side
    # effect repeated without), both seen by this loop's polls. None: never decided again.
    killed, killed_at, stall = 0, 0.0, None

    def state() -> str:
        return (f"{len(lines(ledger))} side effects, {len(lines(dead_file))} dead letters, committed {offsets} "
                f"of {ends}, consumers " + ", ".join(f"{p.entry['name']}:{p.popen.poll()}" for p in started)
                + (f", not started: {[e['name'] for e in pending]}" if pending else ""))

    try:
        while True:
            effects = len(lines(ledger))
            if killed and stall is None and (lines(ledger).count(str(killed)) > 1 or any(
                    json.loads(d)["message"] == killed for d in lines(dead_file))):
                stall = time.monotonic() - killed_at
            for entry in list(pending):
                after_exit = entry.get("start_after_exit_of")
                if after_exit is not None and (after_exit not in latest or latest[after_exit].popen.poll() is None):
                    continue
                if effects < entry.get("start_after_side_effects", 0):
                    continue
                pending.remove(entry)
                process = start(entry, len(started))
                started.append(process)
                latest[entry["name"]] = process
            for process in started:
                kills = process.entry.get("kill_in_handler_after_side_effect_of")
                if kills and not killed and process.popen.poll() is not None:
                    killed, killed_at = kills, time.monotonic()
                limit = process.entry.get("stop_after_side_effects")
                if limit is not None and effects >= limit and not process.terminated and process.popen.poll() is None:
                    process.popen.send_signal(signal.SIGTERM)
                    process.terminated = True
            accounted = set(map(int, lines(ledger))) | {json.loads(d)["message"] for d in lines(dead_file)}
            if not pending and accounted >= set(expected) and time.monotonic() - checked_offsets_at > 0.5:
                checked_offsets_at = time.monotonic()
                offsets = kafka.committed(group, topic, partitions)
                if all(offsets.get(p, -1) >= end for p, end in ends.items()):
                    break
            if time.monotonic() - began > BOUND:
                pytest.fail(f"not done within {BOUND:.0f} s: {state()}", pytrace=False)
            time.sleep(0.05)
    finally:
        for process in started:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
                process.terminated = True
        for process in started:
            try:
                process.popen.wait(20)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        kafka.delete_topic(topic)

    for process in started:
        if process.terminated:
            assert process.popen.returncode == 0, (
                f"consumer {process.entry['name']} exited {process.popen.returncode} on SIGTERM:\n"
                + process.stderr.read_text(encoding="utf-8")[-3000:])
    reports = [json.loads(line) for p in started for line in lines(p.stdout)]
    return Played(
        ledger=[int(line) for line in lines(ledger)],
        dead=[json.loads(line) for line in lines(dead_file)],
        duplicates=sum(1 for r in reports if r.get("outcome") == "duplicate"),
        expected=expected,
        poison=list(scenario["produce"].get("poison", [])),
        log=[state()],
        stall=stall,
    )


def side_effect_errors(played: Played, rule: str) -> List[str]:
    want = [n for n in played.expected if rule == "each_once" or n not in played.poison]
    counts = collections.Counter(played.ledger)
    errors = [f"message {n}: side effect {counts[n]} times" for n in want if counts[n] != 1]
    errors += [f"message {n}: side effect {c} times, expected none" for n, c in counts.items() if n not in want]
    return errors


def check(scenario: dict, played: Played, mode: str = "sequential") -> None:
    expect = scenario["expect"]
    want_dead = {d["message"]: d.get("reason_includes", "") for d in expect.get("dead_letters", [])}
    # In the batch modes a kill inside a handler may also park the other messages then in flight
    # (claimed beside it): a dead letter beyond the expected ones is allowed only with an
    # "unknown" reason, for at most BATCH_PARALLELISM - 1 messages, which then need no side effect.
    parked = set()
    if mode != "sequential":
        parked = {d["message"] for d in played.dead
                  if d["message"] not in want_dead and "unknown" in d["reason"].lower()}
    errors = [e for e in side_effect_errors(played, expect["side_effects"])
              if not any(e == f"message {n}: side effect 0 times" for n in parked)]
    if len(parked) > BATCH_PARALLELISM - 1:
        errors.append(f"{len(parked)} messages parked beside the killed handler ({sorted(parked)}), more than the "
                      f"{BATCH_PARALLELISM - 1} others a window of {BATCH_PARALLELISM} holds")
    got_dead = {d["message"] for d in played.dead} - parked
    if got_dead != set(want_dead):
        errors.append(f"dead letters for {sorted(got_dead)}, expected {sorted(want_dead)}")
    for letter in played.dead:
        if letter["message"] in parked:
            continue
        needle = want_dead.get(letter["message"], "")
        if needle.lower() not in letter["reason"].lower():
            errors.append(f"dead letter of message {letter['message']}: {letter['reason']!r} lacks {needle!r}")
    if played.duplicates < expect.get("duplicates_skipped_at_least", 0):
        errors.append(f"{played.duplicates} duplicates skipped, expected at least {expect['duplicates_skipped_at_least']}")
    assert not errors, "; ".join(errors) + f" ({played.log[-1]})"


#: How much longer than without the helper a consumer killed inside its handler may hold its
#: partition with the helper's defaults (issue 52: at most about idemd.DEFAULT_LEASE).
STALL_BOUND = 5.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index", range(len(SCENARIOS)), ids=[slug(s) for s in SCENARIOS])
def test_consumer_scenario(index: int, mode: str, kafka: KafkaClients, server: Server, tmp_path: Path) -> None:
    scenario = SCENARIOS[index]
    negative = scenario.get("negative_control") and mode == MODES[0]
    if negative:
        # The first group on a fresh broker waits seconds for __consumer_offsets: not the helper's
        # cost, so paid here when a negative control comes first (pytest -k).
        kafka.committed(f"group-{RUN_PREFIX}-warm-up", f"consumer-{RUN_PREFIX}-warm-up", 1)
    began = time.monotonic()
    played = play(scenario, index, kafka, server, tmp_path, no_helper=False, mode=mode)
    check(scenario, played, mode)
    # The negative control runs no helper, so one mode plays it, right after the helper's run so
    # that one assertion bounds what the helper costs beside it.
    if negative:
        negative_control(scenario, index, kafka, server, tmp_path, played, time.monotonic() - began)


def negative_control(scenario: dict, index: int, kafka: KafkaClients, server: Server, tmp: Path,
                     played: Played, with_helper: float) -> None:
    began = time.monotonic()
    (tmp / "no-helper").mkdir()
    bare = play(scenario, index, kafka, server, tmp / "no-helper", no_helper=True)
    # What the helper costs a scenario with a kill: the wait for the dead consumer's lease beside
    # the group's own session timeout.
    without = time.monotonic() - began
    ratio = with_helper / without
    figures = [f"played in {with_helper:.3f} s with the helper, {without:.3f} s without: {ratio:.2f}x"]
    errors = []
    killed_in_handler = any("kill_in_handler_after_side_effect_of" in c for c in scenario["consumers"])
    # The bound is issue 52's, on the kill inside a handler (the wait for the dead consumer's
    # lease). The kill between side effect and commit is only reported: with the helper its second
    # consumer here took one partition, then the other about a second later (without it, both at
    # once), 1.2x on an idle machine; no lease is waited for there, and the bound would flake.
    if killed_in_handler and with_helper > 1.3 * without:
        errors.append(f"the helper made the scenario {ratio:.2f}x slower (bound 1.3x)")
    # A kill inside a handler: the partition waits for the group to notice (the session timeout, as
    # without the helper), then for the dead consumer's lease: with the defaults (5 s, extended at
    # half) that wait is over by the time the group has noticed.
    if killed_in_handler:
        if played.stall is None or bare.stall is None:
            errors.append(f"the killed message was not decided again in both runs "
                          f"(stall {played.stall} s with the helper, {bare.stall} s without)")
        else:
            share = played.stall - bare.stall
            figures.append(f"partition stalled {played.stall:.3f} s after the kill with the helper, {bare.stall:.3f} s "
                           f"without (the group's session timeout); the helper's share {share:.3f} s")
            if share > STALL_BOUND:
                errors.append(f"the helper stalled the partition {share:.3f} s beyond the group's "
                              f"own {bare.stall:.3f} s (bound {STALL_BOUND:.0f} s)")
    print("\n".join(figures))
    if not side_effect_errors(bare, scenario["expect"]["side_effects"]):
        errors.append(f"without the helper every side effect still ran once: the scenario cannot catch a repeat "
                      f"({bare.log[-1]})")
    assert not errors, "; ".join(errors) + " (" + "; ".join(figures) + ")"
