package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.idemd.client.MessageProcessor.Kind;
import dev.idemd.client.MessageProcessor.Outcome;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.LookupRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * {@link MessageProcessor#processBatch} against a live idemd: outcomes as {@link
 * MessageProcessor#process}'s, the orderings, the crash bound's mechanism (only the messages in
 * flight are claimed), heartbeats, and the fallback against a server without ClaimBatch. Mirrors
 * clients/go/consume_batch_test.go.
 */
@ExtendWith(LiveIdemd.class)
class ProcessBatchTest {
  private static final String TOKEN = "conformance-token-alice-3f9a";
  private static final String ENDPOINT = "kafka:orders";
  private static final String HEADER = "idempotency-key";

  private IdemdClient client;
  private final List<String> deadLetters = new ArrayList<>();

  @BeforeEach
  void connect(IdemdServer server) {
    client = IdemdClient.builder(server.address()).plaintext().bearerToken(TOKEN).build();
  }

  @AfterEach
  void close() {
    client.close();
  }

  private MessageProcessor.Builder processor(IdemdClient c) {
    return MessageProcessor.builder(c, ENDPOINT)
        .keyFromHeader(HEADER)
        .deadLetter((m, reason) -> {
          synchronized (deadLetters) {
            deadLetters.add(reason);
          }
        });
  }

  private List<String> deadLetters() {
    synchronized (deadLetters) {
      return List.copyOf(deadLetters);
    }
  }

  /** n messages over partitions 0..parts-1 (offset = index), keys prefix-i, value {"n":i}. */
  private static List<Message> poll(String prefix, int n, int parts) {
    List<Message> msgs = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      msgs.add(Message.of("payments", i % parts, i, value(i)).withHeader(HEADER, prefix + "-" + i));
    }
    return msgs;
  }

  private static byte[] value(int i) {
    return ("{\"n\":" + i + "}").getBytes(StandardCharsets.UTF_8);
  }

  private static String prefix() {
    return UUID.randomUUID().toString();
  }

  /** Counts each message value's handler runs; fails the values in {@code poison}. */
  private static final class Ledger {
    final Map<String, Integer> runs = new HashMap<>();

    MessageHandler handler(Set<String> poison) {
      return m -> {
        synchronized (this) {
          runs.merge(m.valueText(), 1, Integer::sum);
        }
        if (poison.contains(m.valueText())) {
          throw new IllegalStateException("poison " + m.valueText());
        }
      };
    }

    synchronized Map<String, Integer> runs() {
      return Map.copyOf(runs);
    }
  }

  private static Map<Kind, Integer> kinds(List<Outcome> outs) {
    Map<Kind, Integer> n = new EnumMap<>(Kind.class);
    for (Outcome o : outs) {
      n.merge(o.kind(), 1, Integer::sum);
    }
    return n;
  }

  private static void expect(String what, Outcome outcome, Kind want) {
    assertEquals(want, outcome.kind(), what + ": " + outcome);
  }

  private String lookupState(String key) {
    try {
      return client.lookup(LookupRequest.newBuilder().setEndpoint(ENDPOINT).setKey(key).build())
          .getRecord().getState().name().replace("STATE_", "");
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() == Status.Code.NOT_FOUND) {
        return "NOT_FOUND";
      }
      throw e;
    }
  }

  /**
   * A poll of 700 messages (two ClaimBatch calls in one round), 3 of them repeats of an earlier
   * message's key and value, 2 poison: each key's handler runs once, the repeats are duplicates,
   * the poison messages are dead-lettered, and the same poll redelivered runs nothing.
   */
  @Test
  void runsEachKeyOnce() {
    MessageProcessor p = processor(client).build();
    List<Message> msgs = poll(prefix(), 700, 4);
    for (int i : new int[] {10, 20, 30}) { // repeats, as a producer retry makes them
      msgs.add(msgs.get(i));
    }
    Set<String> poison = Set.of("{\"n\":5}", "{\"n\":600}");
    Ledger ledger = new Ledger();
    List<Outcome> outs = p.processBatch(msgs, ledger.handler(poison), BatchOptions.defaults().withParallelism(1000));
    assertEquals(msgs.size(), outs.size());
    for (int i = 0; i < outs.size(); i++) {
      Kind want = Kind.EXECUTED;
      if (i >= 700) {
        want = Kind.DUPLICATE;
      } else if (poison.contains(msgs.get(i).valueText())) {
        want = Kind.DEAD_LETTERED;
      }
      expect("message " + i, outs.get(i), want);
    }
    assertEquals("IllegalStateException: poison {\"n\":5}", outs.get(5).reason());
    Map<String, Integer> runs = ledger.runs();
    assertEquals(700, runs.size());
    runs.forEach((v, n) -> assertEquals(1, n, v + " ran " + n + " times"));
    assertEquals(2, deadLetters().size(), deadLetters().toString());

    List<Outcome> again = p.processBatch(msgs, ledger.handler(Set.of()));
    for (int i = 0; i < again.size(); i++) {
      Kind want = poison.contains(msgs.get(i).valueText()) ? Kind.DEAD_LETTERED : Kind.DUPLICATE;
      expect("redelivered message " + i, again.get(i), want);
    }
    assertEquals(700, ledger.runs().size(), "a redelivery ran a handler");
    ledger.runs().forEach((v, n) -> assertEquals(1, n, v + " ran again"));
    List<String> redelivered = deadLetters().subList(2, deadLetters().size());
    assertEquals(2, redelivered.size());
    for (String reason : redelivered) {
      assertTrue(reason.contains("outcome unknown") && reason.contains("poison"), reason);
    }
  }

  /**
   * PER_PARTITION runs each partition's messages in offset order, at most one per partition at a
   * time; a message held by another consumer past the wait is RETRY, and so is every later message
   * of its partition, untouched.
   */
  @Test
  void perPartitionKeepsOffsetOrder() {
    MessageProcessor p = processor(client).maxWait(Duration.ofMillis(200)).build();
    String prefix = prefix();
    List<Message> msgs = poll(prefix, 60, 3);
    ClaimResponse held = client.claim(ClaimRequest.newBuilder().setEndpoint(ENDPOINT)
        .setKey(prefix + "-30")
        .setSha256(ByteString.copyFrom(Fingerprint.v1("CONSUME", ENDPOINT, "", value(30), List.of())))
        .setLease(ExecuteEngine.toProto(Duration.ofSeconds(30))).build()); // partition 0
    assertEquals(ClaimResponse.OutcomeCase.CLAIMED, held.getOutcomeCase());

    Map<Integer, Long> last = new HashMap<>();
    List<String> disorder = new ArrayList<>();
    AtomicInteger running = new AtomicInteger();
    AtomicInteger most = new AtomicInteger();
    MessageHandler handler = m -> {
      most.accumulateAndGet(running.incrementAndGet(), Math::max);
      try {
        synchronized (last) {
          Long prev = last.put(m.partition(), m.offset());
          if (prev != null && m.offset() <= prev) {
            disorder.add("partition " + m.partition() + ": offset " + m.offset() + " after " + prev);
          }
        }
        Thread.sleep(2);
      } finally {
        running.decrementAndGet();
      }
    };
    List<Outcome> outs = p.processBatch(msgs, handler,
        BatchOptions.defaults().withOrdering(BatchOptions.Ordering.PER_PARTITION));
    for (int i = 0; i < outs.size(); i++) {
      Kind want = i % 3 == 0 && i >= 30 ? Kind.RETRY : Kind.EXECUTED;
      expect("message " + i + " (partition " + i % 3 + ")", outs.get(i), want);
    }
    assertEquals("another consumer holds the key (409 request_in_progress)", outs.get(30).reason());
    assertEquals("an earlier message of its partition must be retried first", outs.get(33).reason());
    assertEquals(List.of(), disorder);
    assertTrue(most.get() <= 3, most.get() + " handlers ran at once over 3 partitions");
    assertEquals(27L, last.get(0), "partition 0 went past its held message");
    assertEquals("NOT_FOUND", lookupState(prefix + "-33"));
  }

  /**
   * The crash bound's mechanism: while the first handlers run, no later message of the poll is
   * claimed, so a process killed now would park only those.
   */
  @Test
  void claimsOnlyTheMessagesInFlight() throws Exception {
    MessageProcessor p = processor(client).build();
    String prefix = prefix();
    List<Message> msgs = poll(prefix, 20, 1);
    CountDownLatch release = new CountDownLatch(1);
    AtomicInteger started = new AtomicInteger();
    MessageHandler handler = m -> {
      if (started.incrementAndGet() <= 4) {
        release.await();
      }
    };
    CompletableFuture<List<Outcome>> done = CompletableFuture.supplyAsync(
        () -> p.processBatch(msgs, handler, BatchOptions.defaults().withParallelism(4)));
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (started.get() < 4 && System.nanoTime() < deadline) {
      Thread.sleep(5);
    }
    Thread.sleep(100); // a later claim, if any, would land now
    try {
      assertEquals(4, started.get(), "handlers started, want the first 4");
      for (int i = 0; i < 20; i++) {
        String want = i < 4 ? "IN_PROGRESS" : "NOT_FOUND";
        assertEquals(want, lookupState(prefix + "-" + i), "message " + i + " while the first 4 run");
      }
    } finally {
      release.countDown();
    }
    List<Outcome> outs = done.get(30, TimeUnit.SECONDS);
    for (int i = 0; i < outs.size(); i++) {
      expect("message " + i, outs.get(i), Kind.EXECUTED);
    }
  }

  /** Handlers slower than their lease keep it: the heartbeats extend it. */
  @Test
  void keepsSlowHandlersLeases() {
    MessageProcessor p = processor(client).lease(Duration.ofSeconds(1)).build();
    List<Message> msgs = poll(prefix(), 8, 2);
    List<Outcome> outs = p.processBatch(msgs, m -> Thread.sleep(2500));
    for (int i = 0; i < outs.size(); i++) {
      expect("message " + i, outs.get(i), Kind.EXECUTED);
    }
    assertEquals(List.of(), deadLetters());
  }

  /**
   * Against the previous release, which has no ClaimBatch (UNIMPLEMENTED), every message goes
   * through process(): the same outcomes.
   */
  @Test
  void fallsBackOnAServerWithoutBatches() throws Exception {
    String previous = System.getenv("IDEMD_PREVIOUS_BIN");
    Assumptions.assumeTrue(previous != null && !previous.isEmpty(),
        "IDEMD_PREVIOUS_BIN is not set (clients/java/test.sh sets it from scripts/previous-release.sh)");
    try (IdemdServer old = IdemdServer.startConformance(Path.of(previous));
        IdemdClient c = IdemdClient.builder(old.address()).plaintext().bearerToken(TOKEN).build()) {
      MessageProcessor p = processor(c).build();
      List<Message> msgs = poll(prefix(), 30, 3);
      msgs.add(msgs.get(4));
      Ledger ledger = new Ledger();
      List<Outcome> outs = p.processBatch(msgs, ledger.handler(Set.of("{\"n\":7}")));
      for (int i = 0; i < outs.size(); i++) {
        Kind want = i == 30 ? Kind.DUPLICATE : i == 7 ? Kind.DEAD_LETTERED : Kind.EXECUTED;
        expect("message " + i, outs.get(i), want);
      }
      assertEquals(30, ledger.runs().size());
      assertEquals(List.of("IllegalStateException: poison {\"n\":7}"), deadLetters());
    }
  }
}
