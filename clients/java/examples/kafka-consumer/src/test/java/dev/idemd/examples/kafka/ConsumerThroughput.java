package dev.idemd.examples.kafka;

import dev.idemd.client.json.JsonNumber;
import dev.idemd.client.testing.IdemdServer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.common.TopicPartition;

/**
 * Messages/s of {@link KafkaConsumerExample} (one consumer JVM, default fetch size, handler 0 ms)
 * on N messages in 4 partitions, without the helper ({@code --no-helper}) and with it in each mode
 * of $IDEMD_CONSUMER_BENCH_MODES (default "parallel pipelined sequential", the program's {@code
 * --mode}), $IDEMD_CONSUMER_BENCH_RUNS runs of each (default 2), in turn; $IDEMD_CONSUMER_BENCH_PARALLELISM
 * sets the program's {@code --parallelism}. Against the idemd of $IDEMD_BIN and the broker of
 * $IDEMD_TEST_KAFKA_BROKERS. Run by bench/consumer.sh.
 *
 * <p>Timed from the first side effect to the last (the JVM start, the group join and the first
 * fetch are left out), and, for reference, from the process start to the last offset committed.
 */
public final class ConsumerThroughput {
  private ConsumerThroughput() {}

  public static void main(String[] args) throws Exception {
    int messages = args.length > 0 ? Integer.parseInt(args[0]) : 10_000;
    int partitions = 4;
    String brokers = ConsumerScenariosTest.brokers();
    Properties props = new Properties();
    props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    try (IdemdServer idemd = IdemdServer.startConformance(); Admin admin = Admin.create(props)) {
      ConsumerScenariosTest.admin = admin;
      String runsEnv = System.getenv("IDEMD_CONSUMER_BENCH_RUNS");
      int runs = runsEnv == null || runsEnv.isBlank() ? 2 : Integer.parseInt(runsEnv.trim());
      String modesEnv = System.getenv("IDEMD_CONSUMER_BENCH_MODES");
      List<String> modes = new ArrayList<>(List.of("no-helper"));
      modes.addAll(List.of((modesEnv == null || modesEnv.isBlank()
          ? "parallel pipelined sequential" : modesEnv).trim().split("\\s+")));
      String parallelism = System.getenv("IDEMD_CONSUMER_BENCH_PARALLELISM");
      List<String[]> plays = new ArrayList<>();
      for (int run = 1; run <= runs; run++) {
        for (String mode : modes) {
          plays.add(new String[] {Integer.toString(run), mode});
        }
      }
      for (String[] play : plays) {
        int run = Integer.parseInt(play[0]);
        String mode = play[1];
        boolean noHelper = mode.equals("no-helper");
        String prefix = Long.toHexString(System.nanoTime());
        String topic = "throughput-" + prefix;
        admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
        ConsumerScenariosTest.produce(topic, partitions, "idempotency-key", prefix,
            Map.of("messages", JsonNumber.of(Integer.toString(messages))));
        Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
        for (int p = 0; p < partitions; p++) {
          latest.put(new TopicPartition(topic, p), OffsetSpec.latest());
        }
        Map<TopicPartition, Long> ends = new HashMap<>();
        admin.listOffsets(latest).all().get(30, TimeUnit.SECONDS).forEach((tp, i) -> ends.put(tp, i.offset()));

        Path dir = Files.createTempDirectory("idemd-consumer-bench-");
        Path ledger = Files.createFile(dir.resolve("ledger"));
        List<String> command = new ArrayList<>(List.of(
            Path.of(System.getProperty("java.home"), "bin", "java").toString(),
            "-cp", System.getProperty("java.class.path"), KafkaConsumerExample.class.getName(),
            "--brokers", brokers, "--topic", topic, "--group", topic, "--idemd", idemd.address(),
            "--token", "conformance-token-alice-3f9a", "--ledger", ledger.toString(),
            "--dead-letters", dir.resolve("dead-letters").toString()));
        if (noHelper) {
          command.add("--no-helper");
        } else {
          command.addAll(List.of("--mode", mode));
          if (parallelism != null && !parallelism.isBlank()) {
            command.addAll(List.of("--parallelism", parallelism.trim()));
          }
        }
        long start = System.nanoTime();
        Process consumer = new ProcessBuilder(command)
            .redirectOutput(dir.resolve("out").toFile()).redirectError(dir.resolve("err").toFile()).start();
        long first = 0;
        long last;
        while (true) {
          long lines = Files.size(ledger) == 0 ? 0 : Files.readAllLines(ledger).size();
          long now = System.nanoTime();
          if (first == 0 && lines > 0) {
            first = now;
          }
          if (lines >= messages) {
            last = now;
            break;
          }
          if (!consumer.isAlive() || now - start > TimeUnit.MINUTES.toNanos(10)) {
            throw new IllegalStateException("the consumer stopped at " + lines + " messages; see " + dir);
          }
          Thread.sleep(lines == 0 ? 20 : 50);
        }
        while (!ConsumerScenariosTest.committedToEnd(topic, ends)) {
          Thread.sleep(20);
        }
        long committed = System.nanoTime();
        consumer.destroy();
        consumer.waitFor(30, TimeUnit.SECONDS);
        System.out.printf(Locale.ROOT, "run %d, %-10s %d messages, 4 partitions: %.0f messages/s (first to"
                + " last side effect %.2f s; process start to last commit %.2f s)%n",
            run, mode, messages, (messages - 1) / ((last - first) / 1e9),
            (last - first) / 1e9, (committed - start) / 1e9);
      }
    }
  }
}
