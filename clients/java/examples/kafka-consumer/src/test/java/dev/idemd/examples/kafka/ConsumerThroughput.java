package dev.idemd.examples.kafka;

import dev.idemd.client.testing.IdemdServer;
import java.nio.ByteBuffer;
import java.nio.channels.SeekableByteChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;

/**
 * Messages/s of {@link KafkaConsumerExample} (one consumer JVM, default fetch size, handler 0 ms)
 * on N messages in 4 partitions, without the helper ({@code --no-helper}) and with it in each mode
 * of $IDEMD_CONSUMER_BENCH_MODES (default "parallel pipelined sequential", the program's {@code
 * --mode}), $IDEMD_CONSUMER_BENCH_RUNS runs of each (default 2), in turn; $IDEMD_CONSUMER_BENCH_PARALLELISM
 * sets the program's {@code --parallelism}, $IDEMD_CONSUMER_BENCH_JVM_OPTIONS (split on spaces) goes
 * to the consumer's JVM (a profiler agent, {@code -XX:TieredStopAtLevel=1}). Against the idemd of $IDEMD_BIN and the broker of
 * $IDEMD_TEST_KAFKA_BROKERS. Run by bench/consumer.sh.
 *
 * <p><b>Warm and cold.</b> Each consumer gets $IDEMD_CONSUMER_BENCH_WARMUP messages (default N)
 * ahead of the N it is timed on, in the same topic: a consumer runs for hours, and a fresh JVM's
 * first seconds are spent compiling the code it runs (on 2 cores, C2 took 6.2 s of CPU in the
 * first 14 s of a processBatch loop, more than the loop itself), which measures the JIT, not the
 * helper. The line gives the warm figure (the N timed messages: from the side effect that ends
 * the warm-up to the last) and, beside it, the cold one (the warm-up messages, from the first side
 * effect); bare and helper consumers get the same warm-up. 0 turns it off (then only the cold
 * figure is printed). Also, for reference, the time from the process start to the last offset
 * committed, and under each warm line where the machine's cores went during the timed messages
 * ({@link CpuSample}).
 */
public final class ConsumerThroughput {
  private ConsumerThroughput() {}

  /**
   * Messages 1..count in the consumer scenarios' format ({@link ConsumerScenariosTest#record},
   * header idempotency-key, partition N % partitions), sent
   * side by side: the scenarios' one-by-one sends took about a minute per 10,000. Each
   * partition's first send is awaited alone, so that the producer knows the fresh topic's leaders
   * before the rest go; every send is awaited before the consumer starts, and a failed one fails
   * the bench.
   */
  static void produce(String topic, int partitions, String prefix, long count) throws Exception {
    Properties props = ConsumerScenariosTest.producerProperties();
    props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
      List<Future<RecordMetadata>> sent = new ArrayList<>();
      for (long n = 1; n <= count; n++) {
        ProducerRecord<byte[], byte[]> record =
            ConsumerScenariosTest.record(topic, (int) (n % partitions), "idempotency-key", prefix, n, false);
        Future<RecordMetadata> future = producer.send(record);
        if (n <= partitions) {
          future.get(30, TimeUnit.SECONDS);
        } else {
          sent.add(future);
        }
      }
      producer.flush();
      for (Future<RecordMetadata> future : sent) {
        future.get(30, TimeUnit.SECONDS);
      }
    }
  }

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
      String warmupEnv = System.getenv("IDEMD_CONSUMER_BENCH_WARMUP");
      int warmup = warmupEnv == null || warmupEnv.isBlank() ? messages : Integer.parseInt(warmupEnv.trim());
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
        produce(topic, partitions, prefix, warmup + messages);
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
            "-cp", System.getProperty("java.class.path")));
        String jvmOptions = System.getenv("IDEMD_CONSUMER_BENCH_JVM_OPTIONS");
        if (jvmOptions != null && !jvmOptions.isBlank()) {
          command.addAll(List.of(jvmOptions.trim().split("\\s+")));
        }
        command.addAll(List.of(KafkaConsumerExample.class.getName(),
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
        // The ledger is tailed every 2 ms (its new bytes only): at 20,000 messages/s a 50 ms poll
        // of the whole file was 10% of a run.
        long first = 0;
        long warm = 0;
        long last;
        long lines = 0;
        CpuSample atWarm = null;
        CpuSample atLast;
        try (SeekableByteChannel tail = Files.newByteChannel(ledger, StandardOpenOption.READ)) {
          ByteBuffer buffer = ByteBuffer.allocate(1 << 16);
          while (true) {
            buffer.clear();
            int read = tail.read(buffer);
            for (int k = 0; k < Math.max(0, read); k++) {
              if (buffer.get(k) == '\n') {
                lines++;
              }
            }
            long now = System.nanoTime();
            if (first == 0 && lines > 0) {
              first = now;
            }
            if (warm == 0 && lines >= Math.max(1, warmup)) {
              warm = now;
              atWarm = CpuSample.take(consumer.pid(), idemd.pid());
            }
            if (lines >= warmup + messages) {
              last = now;
              atLast = CpuSample.take(consumer.pid(), idemd.pid());
              break;
            }
            if (read > 0) {
              continue;
            }
            if (!consumer.isAlive() || now - start > TimeUnit.MINUTES.toNanos(10)) {
              throw new IllegalStateException("the consumer stopped at " + lines + " messages; see " + dir);
            }
            Thread.sleep(lines == 0 ? 20 : 2);
          }
        }
        while (!ConsumerScenariosTest.committedToEnd(topic, ends)) {
          Thread.sleep(20);
        }
        long committed = System.nanoTime();
        consumer.destroy();
        consumer.waitFor(30, TimeUnit.SECONDS);
        String cold = String.format(Locale.ROOT, "cold (first %d of a fresh JVM) %.0f messages/s",
            warmup, (warmup - 1) / ((warm - first) / 1e9));
        if (warmup == 0) {
          System.out.printf(Locale.ROOT, "run %d, %-10s %d messages, 4 partitions: %.0f messages/s (first to"
                  + " last side effect %.2f s; process start to last commit %.2f s)%n",
              run, mode, messages, (messages - 1) / ((last - first) / 1e9),
              (last - first) / 1e9, (committed - start) / 1e9);
        } else {
          System.out.printf(Locale.ROOT, "run %d, %-10s %d messages, 4 partitions: %.0f messages/s warm (%.2f s"
                  + " after %d warm-up messages; %s; process start to last commit %.2f s)%n",
              run, mode, messages, messages / ((last - warm) / 1e9), (last - warm) / 1e9, warmup, cold,
              (committed - start) / 1e9);
          System.out.println("      " + atLast.since(atWarm, messages));
        }
      }
    }
  }

  /**
   * CPU time, from /proc (Linux), of the consumer JVM (and, within it, its JIT compiler threads),
   * of idemd, and of the whole machine, at one moment of a run. Two of them, at the start and the
   * end of the timed messages, tell where the machine's cores went while they were consumed: on
   * this project's 2-core machine the consumer, the broker and idemd share them, so a consumer
   * that is slower than its goal is either waiting (the machine has idle time left: latency is the
   * bound) or out of CPU (then only less CPU per message helps, not more overlap). Issue 52's
   * fifth session measured that distinction by hand; the bench now prints it with every warm run.
   */
  record CpuSample(long consumerTicks, long jitTicks, long idemdTicks, long busyTicks, long allTicks) {
    /** Clock ticks per second of /proc's counters (USER_HZ: 100 on every Linux this runs on). */
    private static final double TICKS_PER_SECOND = 100.0;

    static CpuSample take(long consumerPid, long idemdPid) {
      long jit = 0;
      try (var tasks = Files.list(Path.of("/proc", Long.toString(consumerPid), "task"))) {
        for (Path task : (Iterable<Path>) tasks::iterator) {
          try {
            if (Files.readString(task.resolve("comm")).contains("CompilerThre")) {
              jit += ticks(task.resolve("stat"));
            }
          } catch (java.io.IOException gone) {
            // a thread that ended between the listing and the read
          }
        }
      } catch (java.io.IOException e) {
        jit = -1;
      }
      long busy = -1;
      long all = -1;
      try {
        String[] cpu = Files.readAllLines(Path.of("/proc/stat")).get(0).trim().split("\\s+");
        all = 0;
        for (int i = 1; i < Math.min(cpu.length, 9); i++) {
          all += Long.parseLong(cpu[i]);
        }
        busy = all - Long.parseLong(cpu[4]) - Long.parseLong(cpu[5]); // less idle and iowait
      } catch (java.io.IOException | RuntimeException e) {
        // not Linux: the line says so
      }
      return new CpuSample(ticks(Path.of("/proc", Long.toString(consumerPid), "stat")), jit,
          ticks(Path.of("/proc", Long.toString(idemdPid), "stat")), busy, all);
    }

    /** utime + stime of a /proc/.../stat, or -1 when it cannot be read. */
    private static long ticks(Path stat) {
      try {
        String text = Files.readString(stat);
        // The command name (field 2) may hold spaces: the fields after it start after its ')'.
        String[] f = text.substring(text.lastIndexOf(')') + 2).split(" ");
        return Long.parseLong(f[11]) + Long.parseLong(f[12]);
      } catch (java.io.IOException | RuntimeException e) {
        return -1;
      }
    }

    /** What the cores did between {@code from} and this sample, per timed message. */
    String since(CpuSample from, long messages) {
      if (from == null || consumerTicks < 0 || from.consumerTicks < 0 || busyTicks < 0) {
        return "CPU: not measured (no /proc)";
      }
      double perMessage = 1e6 / TICKS_PER_SECOND / messages;
      double seconds = (allTicks - from.allTicks) / TICKS_PER_SECOND;
      long consumer = consumerTicks - from.consumerTicks;
      long idemd = idemdTicks - from.idemdTicks;
      long busy = busyTicks - from.busyTicks;
      return String.format(Locale.ROOT, "CPU per timed message: consumer JVM %.0f µs (its JIT %.0f µs),"
              + " idemd %.0f µs, the rest (broker, this bench, kernel) %.0f µs; the machine's cores %.0f%%"
              + " busy (10 ms ticks)",
          consumer * perMessage, (jitTicks - from.jitTicks) * perMessage, idemd * perMessage,
          (busy - consumer - idemd) * perMessage,
          seconds <= 0 ? 0.0 : 100.0 * busy / (allTicks - from.allTicks));
    }
  }
}
