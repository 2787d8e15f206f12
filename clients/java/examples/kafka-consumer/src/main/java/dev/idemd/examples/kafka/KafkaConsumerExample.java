package dev.idemd.examples.kafka;

import dev.idemd.client.BatchOptions;
import dev.idemd.client.IdemdClient;
import dev.idemd.client.Message;
import dev.idemd.client.MessageHandler;
import dev.idemd.client.MessageProcessor;
import dev.idemd.client.MessageProcessor.Kind;
import dev.idemd.client.MessageProcessor.Outcome;
import dev.idemd.client.json.JsonNumber;
import dev.idemd.client.json.StrictJson;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Kafka consumer of clients/conformance/consumer-scenarios.md ("The consumer program"): each
 * message's side effect (appending its number to a ledger file) runs through {@link
 * MessageProcessor}, offsets are committed by hand once the processor allows it, a {@code RETRY}
 * seeks back. SIGTERM finishes the message in hand, commits, leaves the group and exits 0.
 *
 * <p>Flags (all {@code --name value}; the last two are bare):
 *
 * <pre>
 * --brokers H:P  --topic T  --group G  --idemd H:P  --token TOKEN   where to consume, which idemd
 * --endpoint E          idemd endpoint (default kafka:T)
 * --key-header NAME     the header holding the key (default idempotency-key)
 * --lease D             the lease asked per claim: 500ms, 2s (default: MessageProcessor.DEFAULT_LEASE, 5s)
 * --handler-ms N        the handler sleeps N ms before its side effect
 * --ledger FILE         the side effect: "N\n" appended with one write
 * --dead-letters FILE   the dead-letter hook: {"message":N,"reason":"..."} appended
 * --kill-in-handler-after-side-effect-of N   SIGKILL itself inside the handler, after N's side effect
 * --kill-after-side-effect-of N              SIGKILL itself once the processor returned for N, before the commit
 * --no-helper           run the handler on every delivery, no idemd (the negative control)
 * --mode M              sequential (default: process(), one message in hand), pipelined
 *                       (processBatch PER_PARTITION: each partition in offset order, partitions side
 *                       by side) or parallel (processBatch PER_KEY: keys side by side)
 * --parallelism N       messages in flight in the pipelined and parallel modes (default 256)
 * </pre>
 *
 * <p>In the batch modes a whole poll goes to {@link MessageProcessor#processBatch}; the messages it
 * answers {@code RETRY} are processed again in place, after a pause, until decided (or SIGTERM);
 * then each partition is committed up to its first undecided message.
 *
 * <p>Prints one line per delivery, {@code outcome=KIND message=N partition=P offset=O}, and on exit
 * {@code summary executed=.. duplicate=.. dead_lettered=.. retry=..}.
 */
public final class KafkaConsumerExample {
  private static volatile boolean stopping;
  private static volatile int exitStatus = 1;

  private KafkaConsumerExample() {}

  public static void main(String[] args) {
    Map<String, String> flags = parseFlags(args);
    CountDownLatch finished = new CountDownLatch(1);
    // SIGTERM: let the loop finish the message in hand, commit and leave the group, then exit with
    // the loop's status (a JVM ended by a signal would otherwise exit 143).
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      stopping = true;
      try {
        finished.await(30, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      Runtime.getRuntime().halt(exitStatus);
    }, "sigterm"));
    try {
      run(flags);
      exitStatus = 0;
    } catch (Exception e) {
      e.printStackTrace();
    } finally {
      finished.countDown();
    }
    System.exit(exitStatus);
  }

  private static void run(Map<String, String> flags) throws Exception {
    String topic = required(flags, "topic");
    Path ledger = Path.of(required(flags, "ledger"));
    Path deadLetters = Path.of(required(flags, "dead-letters"));
    long handlerMs = Long.parseLong(flags.getOrDefault("handler-ms", "0"));
    long killInHandler = Long.parseLong(flags.getOrDefault("kill-in-handler-after-side-effect-of", "-1"));
    long killAfter = Long.parseLong(flags.getOrDefault("kill-after-side-effect-of", "-1"));
    boolean noHelper = flags.containsKey("no-helper");
    String mode = flags.getOrDefault("mode", "sequential");
    BatchOptions batchOptions = BatchOptions.defaults();
    switch (mode) {
      case "sequential" -> { }
      case "pipelined" -> batchOptions = batchOptions.withOrdering(BatchOptions.Ordering.PER_PARTITION);
      case "parallel" -> batchOptions = batchOptions.withOrdering(BatchOptions.Ordering.PER_KEY);
      default -> throw new IllegalArgumentException("--mode is sequential, pipelined or parallel");
    }
    if (flags.containsKey("parallelism")) {
      batchOptions = batchOptions.withParallelism(Integer.parseInt(flags.get("parallelism")));
    }
    boolean batch = !noHelper && !mode.equals("sequential");

    MessageHandler handler = message -> {
      Order order = Order.parse(message.value());
      if (order.poison()) {
        throw new RuntimeException("poison message " + order.n());
      }
      if (handlerMs > 0) {
        // Not Thread.sleep(0): that is a sched_yield, which on a busy machine gives the core away
        // for a time slice (0.3-0.7 ms per message measured in the batch bench).
        Thread.sleep(handlerMs);
      }
      append(ledger, order.n() + "\n");
      if (order.n() == killInHandler) {
        killSelf();
      }
    };

    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, required(flags, "brokers"));
    props.put(ConsumerConfig.GROUP_ID_CONFIG, required(flags, "group"));
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    // A consumer that dies without leaving the group holds its partitions until its session times
    // out: 6 s instead of 45 s, so that the next consumer takes over quickly.
    props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "6000");
    props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

    Map<Kind, Integer> counts = new EnumMap<>(Kind.class);
    try (IdemdClient idemd = IdemdClient.builder(required(flags, "idemd"))
            .bearerToken(required(flags, "token")).plaintext().build();
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
      MessageProcessor.Builder builder = MessageProcessor.builder(idemd, flags.getOrDefault("endpoint", "kafka:" + topic))
          .keyFromHeader(flags.getOrDefault("key-header", "idempotency-key"))
          .deadLetter((message, reason) -> deadLetter(deadLetters, message, reason));
      if (flags.containsKey("lease")) {
        builder.lease(parseDuration(flags.get("lease")));
      }
      MessageProcessor processor = builder.build();

      consumer.subscribe(List.of(topic));
      while (!stopping) {
        ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
        Map<TopicPartition, OffsetAndMetadata> done = new HashMap<>();
        if (batch) {
          commit(consumer, processPoll(consumer, processor, handler, batchOptions, records, counts, killAfter));
          continue;
        }
        deliveries:
        for (TopicPartition partition : records.partitions()) {
          for (ConsumerRecord<byte[], byte[]> record : records.records(partition)) {
            if (stopping) {
              break deliveries; // SIGTERM: the message in hand is finished, take no other
            }
            Message message = toMessage(record);
            long n = Order.parse(record.value()).n();
            Outcome outcome = noHelper ? withoutHelper(message, handler, deadLetters) : processor.process(message, handler);
            counts.merge(outcome.kind(), 1, Integer::sum);
            System.out.println("outcome=" + outcome.kind() + " message=" + n
                + " partition=" + record.partition() + " offset=" + record.offset());
            if (!outcome.mayCommit()) {
              // Not committed, and nothing after it in this partition is taken before it.
              consumer.seek(partition, record.offset());
              break;
            }
            if (n == killAfter) {
              killSelf();
            }
            done.put(partition, new OffsetAndMetadata(record.offset() + 1));
          }
        }
        commit(consumer, done);
      }
    } finally {
      System.out.println("summary executed=" + counts.getOrDefault(Kind.EXECUTED, 0)
          + " duplicate=" + counts.getOrDefault(Kind.DUPLICATE, 0)
          + " dead_lettered=" + counts.getOrDefault(Kind.DEAD_LETTERED, 0)
          + " retry=" + counts.getOrDefault(Kind.RETRY, 0));
      System.out.flush();
    }
  }

  /**
   * The batch modes: hands the whole poll to processBatch, then the messages it answers RETRY
   * again (after a pause) until each is decided or SIGTERM comes; returns the offsets to commit:
   * per partition, up to its first undecided message. Kills itself for --kill-after-side-effect-of
   * N once N is reported done, before the commit.
   */
  private static Map<TopicPartition, OffsetAndMetadata> processPoll(
      KafkaConsumer<byte[], byte[]> consumer, MessageProcessor processor,
      MessageHandler handler, BatchOptions options, ConsumerRecords<byte[], byte[]> records,
      Map<Kind, Integer> counts, long killAfter) throws Exception {
    List<ConsumerRecord<byte[], byte[]>> all = new ArrayList<>();
    for (TopicPartition partition : records.partitions()) {
      all.addAll(records.records(partition)); // partition by partition, in offset order
    }
    boolean[] decided = new boolean[all.size()];
    List<Integer> undecided = new ArrayList<>();
    for (int i = 0; i < all.size(); i++) {
      undecided.add(i);
    }
    long pause = 100;
    while (!undecided.isEmpty()) {
      List<Message> messages = new ArrayList<>();
      for (int i : undecided) {
        messages.add(toMessage(all.get(i)));
      }
      // A poll begun is finished on SIGTERM (its retries aside).
      List<Outcome> outcomes = processor.processBatch(messages, handler, options);
      List<Integer> again = new ArrayList<>();
      String reason = "";
      for (int k = 0; k < undecided.size(); k++) {
        int i = undecided.get(k);
        ConsumerRecord<byte[], byte[]> record = all.get(i);
        Outcome outcome = outcomes.get(k);
        long n = Order.parse(record.value()).n();
        counts.merge(outcome.kind(), 1, Integer::sum);
        System.out.println("outcome=" + outcome.kind() + " message=" + n
            + " partition=" + record.partition() + " offset=" + record.offset());
        if (!outcome.mayCommit()) {
          if (reason.isEmpty()) {
            reason = outcome.reason();
          }
          again.add(i);
          continue;
        }
        decided[i] = true;
        if (n == killAfter) {
          killSelf();
        }
      }
      undecided = again;
      if (undecided.isEmpty() || stopping) {
        break;
      }
      System.err.println("kafka-consumer: retrying " + undecided.size() + " messages: " + reason);
      Thread.sleep(pause);
      pause = Math.min(2 * pause, 2000);
    }
    Map<TopicPartition, OffsetAndMetadata> done = new HashMap<>();
    java.util.Set<TopicPartition> blocked = new java.util.HashSet<>();
    for (int i = 0; i < all.size(); i++) {
      ConsumerRecord<byte[], byte[]> record = all.get(i);
      TopicPartition partition = new TopicPartition(record.topic(), record.partition());
      if (!decided[i] && blocked.add(partition)) {
        // Not committed, and nothing after it in this partition is taken before it.
        consumer.seek(partition, record.offset());
      }
      if (!blocked.contains(partition)) {
        done.put(partition, new OffsetAndMetadata(record.offset() + 1));
      }
    }
    return done;
  }

  /** A Kafka record as the processor sees it. */
  static Message toMessage(ConsumerRecord<byte[], byte[]> record) {
    Message message = Message.of(record.topic(), record.partition(), record.offset(), record.value());
    for (Header header : record.headers()) {
      message = message.withHeader(header.key(), header.value());
    }
    return message;
  }

  private static void commit(KafkaConsumer<byte[], byte[]> consumer, Map<TopicPartition, OffsetAndMetadata> done) {
    if (done.isEmpty()) {
      return;
    }
    try {
      consumer.commitSync(done);
    } catch (CommitFailedException | RebalanceInProgressException e) {
      // The partitions moved to another consumer: it gets these messages again, and the processor
      // answers DUPLICATE for those already done.
      System.err.println("commit refused by a rebalance: " + e.getClass().getSimpleName());
    }
  }

  /** The negative control: what a consumer without idempotency does. */
  private static Outcome withoutHelper(Message message, MessageHandler handler, Path deadLetters) throws IOException {
    try {
      handler.handle(message);
      return new Outcome(Kind.EXECUTED, "", null);
    } catch (Exception e) {
      String reason = e.getClass().getSimpleName() + ": " + e.getMessage();
      deadLetter(deadLetters, message, reason);
      return new Outcome(Kind.DEAD_LETTERED, reason, null);
    }
  }

  private static void deadLetter(Path file, Message message, String reason) throws IOException {
    long n = Order.parse(message.value()).n();
    append(file, StrictJson.canonicalString(Map.of("message", JsonNumber.of(Long.toString(n)), "reason", reason)) + "\n");
  }

  /** One write(2) with O_APPEND: lines of concurrent consumers never interleave. */
  private static void append(Path file, String line) throws IOException {
    try (FileChannel channel = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.WRITE,
        StandardOpenOption.APPEND)) {
      ByteBuffer bytes = ByteBuffer.wrap(line.getBytes(StandardCharsets.UTF_8));
      while (bytes.hasRemaining()) {
        channel.write(bytes);
      }
    }
  }

  private static void killSelf() throws IOException, InterruptedException {
    System.out.flush();
    new ProcessBuilder("kill", "-KILL", Long.toString(ProcessHandle.current().pid())).start().waitFor();
    Thread.sleep(Long.MAX_VALUE);
  }

  /** The scenarios' message: {"n": N, "poison": bool, "amount": 100}. */
  record Order(long n, boolean poison) {
    static Order parse(byte[] value) {
      try {
        Map<?, ?> json = (Map<?, ?>) StrictJson.parse(value);
        return new Order(((JsonNumber) json.get("n")).longValueExact(), Boolean.TRUE.equals(json.get("poison")));
      } catch (Exception e) {
        throw new IllegalArgumentException("not a scenario message", e);
      }
    }
  }

  static Duration parseDuration(String text) {
    if (text.endsWith("ms")) {
      return Duration.ofMillis(Long.parseLong(text.substring(0, text.length() - 2)));
    }
    if (text.endsWith("s")) {
      return Duration.ofMillis(Math.round(Double.parseDouble(text.substring(0, text.length() - 1)) * 1000));
    }
    throw new IllegalArgumentException("a duration like 500ms or 2s expected: " + text);
  }

  private static Map<String, String> parseFlags(String[] args) {
    Map<String, String> flags = new HashMap<>();
    for (int i = 0; i < args.length; i++) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument " + args[i]);
      }
      String name = args[i].substring(2);
      if (name.equals("no-helper")) {
        flags.put(name, "true");
      } else if (i + 1 < args.length) {
        flags.put(name, args[++i]);
      } else {
        throw new IllegalArgumentException("--" + name + " needs a value");
      }
    }
    return flags;
  }

  private static String required(Map<String, String> flags, String name) {
    String value = flags.get(name);
    if (value == null) {
      throw new IllegalArgumentException("--" + name + " is required");
    }
    return value;
  }
}
