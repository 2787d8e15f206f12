package dev.idemd.examples.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.fail;

import dev.idemd.client.json.JsonNumber;
import dev.idemd.client.json.StrictJson;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.RepoPaths;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import java.util.stream.Stream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.io.TempDir;

/**
 * Plays every scenario of clients/conformance/consumer-scenarios.json as consumer-scenarios.md ("The
 * runner") says, with {@link KafkaConsumerExample} in separate JVMs against the broker of
 * $IDEMD_TEST_KAFKA_BROKERS and a live idemd. Without a broker it skips, unless
 * $IDEMD_KAFKA_REQUIRED is set (test.sh sets it): then it fails, so a broken setup never passes as
 * a skipped suite.
 *
 * <p>Every scenario is played in each of the program's modes ({@code --mode}; $IDEMD_CONSUMER_MODES
 * narrows them, default "sequential pipelined parallel"), the batch modes with {@code --parallelism}
 * {@value #SCENARIO_PARALLELISM}: fewer in flight than a scenario's poll, so that a helper claiming
 * more than its window would show (the crash bound). In the batch modes a kill inside a handler may
 * also park the other messages then in flight: a dead letter beyond the expected ones is allowed only
 * with an "unknown" reason, at most {@value #SCENARIO_PARALLELISM} - 1 of them (the window beside the
 * killed handler), and such a message's side effect may be missing (killed before it). The negative
 * control runs no helper, so only the first mode plays it; beside it the helper may make the scenario
 * at most 1.3x slower, and hold a partition after a kill inside a handler at most
 * {@value #STALL_BOUND_MS} ms longer.
 */
class ConsumerScenariosTest {
  private static final String TOKEN = "conformance-token-alice-3f9a"; // tenant alice
  private static final long SCENARIO_BOUND_MS = 60_000;
  static final int SCENARIO_PARALLELISM = 4;
  // How much longer than without the helper a consumer killed inside its handler may hold its
  // partition with the helper's defaults (issue 52: at most about MessageProcessor.DEFAULT_LEASE).
  static final long STALL_BOUND_MS = 5_000;

  static List<String> modes() {
    String modes = System.getenv("IDEMD_CONSUMER_MODES");
    return List.of((modes == null || modes.isBlank() ? "sequential pipelined parallel" : modes)
        .trim().split("\\s+"));
  }

  private static IdemdServer idemd;
  static Admin admin;

  @TempDir static Path work;

  static String brokers() {
    String brokers = System.getenv("IDEMD_TEST_KAFKA_BROKERS");
    if (brokers == null || brokers.isEmpty()) {
      if (System.getenv("IDEMD_KAFKA_REQUIRED") != null) {
        fail("IDEMD_TEST_KAFKA_BROKERS is not set: run this under scripts/kafka.sh run -- (test.sh does)");
      }
      Assumptions.abort("IDEMD_TEST_KAFKA_BROKERS is not set: no Kafka broker, consumer scenarios skipped");
    }
    return brokers;
  }

  @BeforeAll
  static void start() throws IOException {
    Properties props = new Properties();
    props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, brokers());
    admin = Admin.create(props);
    idemd = IdemdServer.startConformance();
  }

  @AfterAll
  static void stop() {
    if (admin != null) {
      admin.close();
    }
    if (idemd != null) {
      idemd.close();
    }
  }

  @TestFactory
  Stream<DynamicTest> consumerScenarios() throws Exception {
    Map<String, Object> file = map(StrictJson.parse(Files.readAllBytes(
        RepoPaths.conformance().resolve("consumer-scenarios.json"))));
    Map<String, Object> defaults = map(file.get("defaults"));
    List<Object> scenarios = list(file.get("scenarios"));
    List<String> modes = modes();
    return modes.stream().flatMap(mode -> IntStream.range(0, scenarios.size()).mapToObj(i -> {
      Map<String, Object> s = new LinkedHashMap<>(defaults);
      s.putAll(map(scenarios.get(i)));
      return DynamicTest.dynamicTest(mode + ": " + s.get("name"),
          () -> play(s, i, mode, mode.equals(modes.get(0))));
    }));
  }

  private static void play(Map<String, Object> s, int index, String mode, boolean negativeControl)
      throws Exception {
    long started = System.nanoTime();
    Map<String, Object> expect = map(s.get("expect"));
    Run run = run(s, index, false, mode);
    assertNull(run.failure, run.failure);
    Set<Long> parked = parkedBeside(expect, run, mode);
    if (parked.size() > SCENARIO_PARALLELISM - 1) {
      fail(parked.size() + " messages " + parked + " parked beside the killed handler, more than the "
          + (SCENARIO_PARALLELISM - 1) + " others a window of " + SCENARIO_PARALLELISM + " holds\n" + run.logs());
    }
    if (!parked.isEmpty()) {
      System.out.println("consumer scenario " + index + ", " + mode + " mode: messages " + parked
          + " parked beside the killed handler");
    }
    assertNull(sideEffects(s, run, parked), () -> sideEffects(s, run, parked) + "\n" + run.logs());
    assertNull(deadLetters(expect, run, parked), () -> deadLetters(expect, run, parked) + "\n" + run.logs());
    if (expect.containsKey("duplicates_skipped_at_least")) {
      long atLeast = number(expect.get("duplicates_skipped_at_least"));
      long skipped = run.outcomes("DUPLICATE");
      if (skipped < atLeast) {
        fail("the helper reported " + skipped + " duplicates, expected at least " + atLeast + "\n" + run.logs());
      }
    }
    String line = String.format(Locale.ROOT, "consumer scenario %d (%s), %s mode: pass in %.1f s", index,
        s.get("name"), mode, (System.nanoTime() - started) / 1e9);
    if (negativeControl && Boolean.TRUE.equals(s.get("negative_control"))) {
      double withHelper = (System.nanoTime() - started) / 1e9;
      long controlStarted = System.nanoTime();
      Run control = run(s, index, true, "sequential");
      double without = (System.nanoTime() - controlStarted) / 1e9;
      assertNull(control.failure, control.failure);
      assertNotNull(sideEffects(s, control, Set.of()),
          "the negative control (no helper) passed side_effects: the scenario cannot catch what the helper prevents\n"
              + control.logs());
      line += String.format(Locale.ROOT, "; negative control fails as required (%s) in %.1f s",
          sideEffects(s, control, Set.of()), without);
      // What the helper costs a scenario with a kill: the wait for the dead consumer's lease beside
      // the group's own session timeout. Both figures are printed before either bound fails.
      String prefix = "consumer scenario " + index + ": ";
      List<String> slow = new ArrayList<>();
      System.out.println(prefix + String.format(Locale.ROOT, "played in %.3f s with the helper, %.3f s without: %.2fx",
          withHelper, without, withHelper / without));
      if (withHelper > 1.3 * without) {
        slow.add(String.format(Locale.ROOT, "the helper made the scenario %.2fx slower (bound 1.3x): %.3f s, %.3f s without",
            withHelper / without, withHelper, without));
      }
      // A kill inside a handler: the partition waits for the group to notice (the session timeout,
      // as without the helper), then for the dead consumer's lease: with the defaults (5 s, extended
      // at half) that wait is over by the time the group has noticed.
      if (run.stallMs > 0 || control.stallMs > 0) {
        System.out.println(prefix + String.format(Locale.ROOT, "partition stalled %.3f s after the kill with the helper, "
            + "%.3f s without (the group's session timeout); the helper's share %.3f s",
            run.stallMs / 1e3, control.stallMs / 1e3, (run.stallMs - control.stallMs) / 1e3));
        if (run.stallMs == 0 || control.stallMs == 0) {
          slow.add("the killed message was not decided again in both runs (stall " + run.stallMs
              + " ms with the helper, " + control.stallMs + " ms without)\n" + run.logs() + control.logs());
        } else if (run.stallMs - control.stallMs > STALL_BOUND_MS) {
          slow.add(String.format(Locale.ROOT, "the helper stalled the partition %.3f s beyond the group's own %.3f s (bound %d s)",
              (run.stallMs - control.stallMs) / 1e3, control.stallMs / 1e3, STALL_BOUND_MS / 1000));
        }
      }
      if (!slow.isEmpty()) {
        fail(String.join("; ", slow));
      }
    }
    System.out.println(line);
  }

  /** What one play of a scenario left behind. */
  private static final class Run {
    final List<Long> ledger = new ArrayList<>();
    final Map<Long, List<String>> deadLetters = new TreeMap<>();
    final List<Path> outputs = new ArrayList<>();
    String failure;
    /** The partition's stall after a kill inside a handler (see run); 0: no kill, or never decided again. */
    long stallMs;

    long outcomes(String kind) throws IOException {
      long count = 0;
      for (Path out : outputs) {
        if (out.toString().endsWith(".out")) {
          count += Files.readAllLines(out).stream().filter(l -> l.startsWith("outcome=" + kind + " ")).count();
        }
      }
      return count;
    }

    String logs() {
      StringBuilder text = new StringBuilder("ledger: " + ledger + "\ndead letters: " + deadLetters + "\n");
      for (Path out : outputs) {
        try {
          List<String> lines = Files.readAllLines(out);
          text.append("--- ").append(out.getFileName()).append('\n')
              .append(String.join("\n", lines.subList(Math.max(0, lines.size() - 40), lines.size()))).append('\n');
        } catch (IOException e) {
          text.append("--- ").append(out.getFileName()).append(": ").append(e).append('\n');
        }
      }
      return text.toString();
    }
  }

  private static Run run(Map<String, Object> s, int index, boolean noHelper, String mode) throws Exception {
    String prefix = Long.toHexString(ThreadLocalRandom.current().nextLong() & Long.MAX_VALUE);
    String topic = "consumer-" + prefix + "-" + index;
    String group = topic + "-group";
    int partitions = (int) number(s.get("partitions"));
    String keyHeader = (String) s.get("key_header");
    Map<String, Object> produce = map(s.get("produce"));
    long messages = number(produce.get("messages"));
    Path dir = Files.createDirectories(work.resolve(topic + (noHelper ? "-no-helper" : "-" + mode)));
    Path ledger = Files.createFile(dir.resolve("ledger"));
    Path deadLetters = Files.createFile(dir.resolve("dead-letters"));

    admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
    produce(topic, partitions, keyHeader, prefix, produce);
    Map<TopicPartition, Long> ends = new HashMap<>();
    Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
    for (int p = 0; p < partitions; p++) {
      latest.put(new TopicPartition(topic, p), OffsetSpec.latest());
    }
    admin.listOffsets(latest).all().get(30, TimeUnit.SECONDS).forEach((tp, info) -> ends.put(tp, info.offset()));

    Run run = new Run();
    List<Map<String, Object>> entries = list(s.get("consumers")).stream().map(ConsumerScenariosTest::map).toList();
    Process[] processes = new Process[entries.size()];
    boolean[] stopped = new boolean[entries.size()];
    Map<String, Integer> lastStartOf = new HashMap<>();
    long deadline = System.currentTimeMillis() + SCENARIO_BOUND_MS;
    // The partition's stall after a kill inside a handler: from the moment the killed consumer is
    // seen gone to the moment its message is decided again (dead-lettered with the helper, its side
    // effect repeated without), both seen by this loop's 200 ms polls.
    long killed = 0;
    long killedAt = 0;
    try {
      while (true) {
        long sideEffects = Files.readAllLines(ledger).size();
        for (int i = 0; i < entries.size(); i++) {
          Map<String, Object> e = entries.get(i);
          if (processes[i] != null && killed == 0 && e.containsKey("kill_in_handler_after_side_effect_of")
              && !processes[i].isAlive()) {
            killed = number(e.get("kill_in_handler_after_side_effect_of"));
            killedAt = System.nanoTime();
          }
          if (processes[i] == null && mayStart(e, sideEffects, lastStartOf, processes)) {
            processes[i] = startConsumer(s, e, i, topic, group, dir, ledger, deadLetters, noHelper, mode, run);
            lastStartOf.put((String) e.get("name"), i);
          }
          if (processes[i] != null && !stopped[i] && e.containsKey("stop_after_side_effects")
              && sideEffects >= number(e.get("stop_after_side_effects"))) {
            processes[i].destroy(); // SIGTERM
            stopped[i] = true;
          }
        }
        readResults(ledger, deadLetters, run);
        long again = killed;
        if (killed > 0 && run.stallMs == 0
            && (run.deadLetters.containsKey(killed) || run.ledger.stream().filter(n -> n == again).count() > 1)) {
          run.stallMs = Math.max(1, (System.nanoTime() - killedAt) / 1_000_000);
        }
        Set<Long> accounted = new TreeSet<>(run.ledger);
        accounted.addAll(run.deadLetters.keySet());
        if (accounted.size() >= messages && committedToEnd(group, ends)) {
          break;
        }
        if (System.currentTimeMillis() > deadline) {
          run.failure = "not every message accounted for and committed within 60 s\n" + run.logs();
          break;
        }
        Thread.sleep(200);
      }
    } finally {
      for (int i = 0; i < processes.length; i++) {
        Process p = processes[i];
        if (p != null && p.isAlive()) {
          p.destroy();
          stopped[i] = true;
        }
      }
      for (int i = 0; i < processes.length; i++) {
        Process p = processes[i];
        if (p != null && !p.waitFor(20, TimeUnit.SECONDS)) {
          p.destroyForcibly();
          if (run.failure == null) {
            run.failure = "consumer " + entries.get(i).get("name") + " did not exit within 20 s of SIGTERM\n" + run.logs();
          }
        } else if (p != null && stopped[i] && p.exitValue() != 0 && run.failure == null) {
          run.failure = "consumer " + entries.get(i).get("name") + " exited " + p.exitValue() + " after SIGTERM, not 0\n"
              + run.logs();
        }
      }
    }
    readResults(ledger, deadLetters, run);
    return run;
  }

  private static boolean mayStart(Map<String, Object> e, long sideEffects, Map<String, Integer> lastStartOf,
      Process[] processes) {
    if (e.containsKey("start_after_side_effects")) {
      return sideEffects >= number(e.get("start_after_side_effects"));
    }
    if (e.containsKey("start_after_exit_of")) {
      Integer other = lastStartOf.get((String) e.get("start_after_exit_of"));
      return other != null && !processes[other].isAlive();
    }
    return true;
  }

  private static Process startConsumer(Map<String, Object> s, Map<String, Object> e, int i, String topic,
      String group, Path dir, Path ledger, Path deadLetters, boolean noHelper, String mode, Run run)
      throws IOException {
    List<String> command = new ArrayList<>(List.of(
        Path.of(System.getProperty("java.home"), "bin", "java").toString(),
        // Short-lived JVMs: C1 only and the CDS archive start them in a fraction of the time.
        "-XX:TieredStopAtLevel=1", "-Xshare:auto",
        "-cp", System.getProperty("java.class.path"),
        KafkaConsumerExample.class.getName(),
        "--brokers", brokers(), "--topic", topic, "--group", group,
        "--idemd", idemd.address(), "--token", TOKEN,
        "--endpoint", "kafka:" + topic,
        "--key-header", (String) s.get("key_header"),
        "--handler-ms", Long.toString(number(s.get("handler_ms"))),
        "--ledger", ledger.toString(), "--dead-letters", deadLetters.toString()));
    if (s.get("lease") != null) { // else the processor's default, MessageProcessor.DEFAULT_LEASE
      command.addAll(List.of("--lease", (String) s.get("lease")));
    }
    if (e.containsKey("kill_in_handler_after_side_effect_of")) {
      command.addAll(List.of("--kill-in-handler-after-side-effect-of",
          Long.toString(number(e.get("kill_in_handler_after_side_effect_of")))));
    }
    if (e.containsKey("kill_after_side_effect_of")) {
      command.addAll(List.of("--kill-after-side-effect-of", Long.toString(number(e.get("kill_after_side_effect_of")))));
    }
    if (noHelper) {
      command.add("--no-helper");
    } else if (!mode.equals("sequential")) {
      command.addAll(List.of("--mode", mode, "--parallelism", Integer.toString(SCENARIO_PARALLELISM)));
    }
    String name = e.get("name") + "-" + i;
    Path out = dir.resolve(name + ".out");
    Path err = dir.resolve(name + ".err");
    run.outputs.add(out);
    run.outputs.add(err);
    return new ProcessBuilder(command).redirectOutput(out.toFile()).redirectError(err.toFile()).start();
  }

  static void produce(String topic, int partitions, String keyHeader, String prefix, Map<String, Object> produce)
      throws Exception {
    long messages = number(produce.get("messages"));
    long every = produce.containsKey("duplicate_every") ? number(produce.get("duplicate_every")) : 0;
    boolean otherPartition = Boolean.TRUE.equals(produce.get("duplicate_to_other_partition"));
    Set<Long> poison = produce.containsKey("poison")
        ? list(produce.get("poison")).stream().map(ConsumerScenariosTest::number).collect(Collectors.toSet())
        : Set.of();
    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProperties())) {
      for (long n = 1; n <= messages; n++) {
        int partition = (int) (n % partitions);
        send(producer, record(topic, partition, keyHeader, prefix, n, poison.contains(n)));
        if (every > 0 && n % every == 0) {
          send(producer, record(topic, otherPartition ? (int) ((n + 1) % partitions) : partition, keyHeader,
              prefix, n, poison.contains(n)));
        }
      }
      producer.flush();
    }
  }

  /** A producer of the scenarios' messages: every replica acknowledges, byte arrays in and out. */
  static Properties producerProperties() {
    Properties props = new Properties();
    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers());
    props.put(ProducerConfig.ACKS_CONFIG, "all");
    props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    return props;
  }

  /**
   * Message n of a scenario (the consumer's Order): value {"n": N, "poison": P, "amount": 100},
   * header {@code header} = PREFIX-N.
   */
  static ProducerRecord<byte[], byte[]> record(String topic, int partition, String header, String prefix, long n,
      boolean poison) {
    byte[] value = ("{\"n\": " + n + ", \"poison\": " + poison + ", \"amount\": 100}").getBytes(StandardCharsets.UTF_8);
    ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(topic, partition, null, value);
    record.headers().add(header, (prefix + "-" + n).getBytes(StandardCharsets.UTF_8));
    return record;
  }

  private static void send(KafkaProducer<byte[], byte[]> producer, ProducerRecord<byte[], byte[]> record)
      throws Exception {
    // Awaited one by one: in order (the duplicate right after its original), and a send that fails
    // fails the scenario here. (Pipelined sends once left a fresh 4-partition topic's partition 0
    // unsent for the whole delivery timeout on the loaded test box.)
    producer.send(record).get(30, TimeUnit.SECONDS);
  }

  static boolean committedToEnd(String group, Map<TopicPartition, Long> ends) throws Exception {
    Map<TopicPartition, OffsetAndMetadata> committed =
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
    return ends.entrySet().stream().allMatch(end -> {
      OffsetAndMetadata c = committed.get(end.getKey());
      return end.getValue() == 0 || (c != null && c.offset() >= end.getValue());
    });
  }

  private static void readResults(Path ledger, Path deadLetters, Run run) throws Exception {
    run.ledger.clear();
    for (String line : Files.readAllLines(ledger)) {
      if (!line.isBlank()) {
        run.ledger.add(Long.parseLong(line.strip()));
      }
    }
    run.deadLetters.clear();
    for (String line : Files.readAllLines(deadLetters)) {
      if (line.isBlank()) {
        continue;
      }
      Map<String, Object> entry = map(StrictJson.parse(line));
      run.deadLetters.computeIfAbsent(number(entry.get("message")), k -> new ArrayList<>()).add((String) entry.get("reason"));
    }
  }

  /**
   * The batch modes' messages parked beside a killed handler: dead-lettered although the scenario
   * expects no dead letter for them, every time with an "unknown" reason.
   */
  static Set<Long> parkedBeside(Map<String, Object> expect, Run run, String mode) {
    Set<Long> parked = new TreeSet<>();
    if (mode.equals("sequential")) {
      return parked;
    }
    Set<Long> want = new TreeSet<>();
    for (Object o : list(expect.get("dead_letters"))) {
      want.add(number(map(o).get("message")));
    }
    run.deadLetters.forEach((n, reasons) -> {
      if (!want.contains(n) && reasons.stream().allMatch(r -> r.toLowerCase(Locale.ROOT).contains("unknown"))) {
        parked.add(n);
      }
    });
    return parked;
  }

  /**
   * Null when the ledger is as `side_effects` says, else what is wrong; a message in {@code parked}
   * may also have no side effect (its handler was killed before it).
   */
  static String sideEffects(Map<String, Object> s, Run run, Set<Long> parked) {
    Map<String, Object> produce = map(s.get("produce"));
    long messages = number(produce.get("messages"));
    Set<Long> poison = produce.containsKey("poison")
        ? list(produce.get("poison")).stream().map(ConsumerScenariosTest::number).collect(Collectors.toSet())
        : Set.of();
    String rule = (String) map(s.get("expect")).get("side_effects");
    Map<Long, Long> counts = run.ledger.stream().collect(Collectors.groupingBy(n -> n, TreeMap::new, Collectors.counting()));
    List<String> wrong = new ArrayList<>();
    for (long n = 1; n <= messages; n++) {
      long want = rule.equals("each_once_except_poison") && poison.contains(n) ? 0 : 1;
      long got = counts.getOrDefault(n, 0L);
      if (got != want && !(parked.contains(n) && got == 0)) {
        wrong.add("message " + n + " ran " + got + " times, expected " + want);
      }
    }
    counts.keySet().stream().filter(n -> n < 1 || n > messages).forEach(n -> wrong.add("unknown message " + n));
    return wrong.isEmpty() ? null : String.join("; ", wrong);
  }

  /**
   * Null when the dead letters are as `expect.dead_letters` says (the {@code parked} ones aside),
   * else what is wrong.
   */
  static String deadLetters(Map<String, Object> expect, Run run, Set<Long> parked) {
    Map<Long, String> want = new TreeMap<>();
    for (Object o : list(expect.get("dead_letters"))) {
      Map<String, Object> d = map(o);
      want.put(number(d.get("message")), (String) d.get("reason_includes"));
    }
    Set<Long> got = new TreeSet<>(run.deadLetters.keySet());
    got.removeAll(parked);
    if (!want.keySet().equals(got)) {
      return "dead-lettered messages " + run.deadLetters.keySet() + ", expected " + want.keySet();
    }
    for (Map.Entry<Long, String> w : want.entrySet()) {
      for (String reason : run.deadLetters.get(w.getKey())) {
        if (!reason.toLowerCase(Locale.ROOT).contains(w.getValue().toLowerCase(Locale.ROOT))) {
          return "message " + w.getKey() + "'s reason \"" + reason + "\" does not include \"" + w.getValue() + "\"";
        }
      }
    }
    return null;
  }

  @SuppressWarnings("unchecked")
  private static Map<String, Object> map(Object o) {
    return (Map<String, Object>) o;
  }

  @SuppressWarnings("unchecked")
  private static List<Object> list(Object o) {
    return o == null ? List.of() : (List<Object>) o;
  }

  private static long number(Object o) {
    return ((JsonNumber) o).longValueExact();
  }
}
