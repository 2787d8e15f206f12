package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.idemd.client.MessageProcessor.Kind;
import dev.idemd.client.MessageProcessor.Outcome;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.State;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** Every outcome of {@link MessageProcessor} against a live idemd. */
@ExtendWith(LiveIdemd.class)
class MessageProcessorTest {
  private static final String TOKEN = "conformance-token-alice-3f9a";
  private static final String ENDPOINT = "kafka:orders"; // the default policy: expired lease = pending
  private static final String TAKEOVER_ENDPOINT = "POST /v1/takeover";
  private static final String HEADER = "idempotency-key";

  private IdemdClient client;
  private final List<String> deadLetters = new ArrayList<>();
  private final AtomicInteger runs = new AtomicInteger();
  private final MessageHandler counting = m -> runs.incrementAndGet();

  @BeforeEach
  void connect(IdemdServer server) {
    client = IdemdClient.builder(server.address()).plaintext().bearerToken(TOKEN).build();
  }

  @AfterEach
  void close() {
    client.close();
  }

  private MessageProcessor.Builder processor(String endpoint) {
    return MessageProcessor.builder(client, endpoint)
        .keyFromHeader(HEADER)
        .deadLetter((m, reason) -> {
          synchronized (deadLetters) {
            deadLetters.add(reason);
          }
        });
  }

  private static Message message(String key, String value) {
    return Message.of("orders", 0, 7, value.getBytes(StandardCharsets.UTF_8)).withHeader(HEADER, key);
  }

  private static String key() {
    return UUID.randomUUID().toString();
  }

  @Test
  void executesOnceThenReportsDuplicates() {
    MessageProcessor p = processor(ENDPOINT).build();
    Message m = message(key(), "{\"n\":1}");
    Outcome first = p.process(m, counting);
    Outcome second = p.process(m, counting);
    assertEquals(Kind.EXECUTED, first.kind());
    assertEquals(Kind.DUPLICATE, second.kind());
    assertTrue(first.mayCommit() && second.mayCommit());
    assertEquals(1, runs.get());
    assertEquals(List.of(), deadLetters);
  }

  @Test
  void aThrowingHandlerIsDeadLetteredWithTheStoredReasonAndNeverRunAgain() {
    MessageProcessor p = processor(ENDPOINT).build();
    Message m = message(key(), "{\"n\":4}");
    Outcome first = p.process(m, x -> {
      runs.incrementAndGet();
      throw new IllegalStateException("poison message 4");
    });
    assertEquals(Kind.DEAD_LETTERED, first.kind());
    assertTrue(first.mayCommit());
    assertEquals("IllegalStateException: poison message 4", first.reason());
    Outcome redelivery = p.process(m, counting);
    assertEquals(Kind.DEAD_LETTERED, redelivery.kind());
    assertTrue(redelivery.reason().contains("outcome unknown"), redelivery.reason());
    assertTrue(redelivery.reason().contains("poison message 4"), redelivery.reason());
    assertEquals(1, runs.get(), "the handler ran again");
    assertEquals(List.of(first.reason(), redelivery.reason()), deadLetters);
  }

  @Test
  void noSideEffectReleasesTheKeySoARedeliveryRuns() {
    MessageProcessor p = processor(ENDPOINT).build();
    Message m = message(key(), "{\"n\":5}");
    Outcome refused = p.process(m, x -> {
      throw new NoSideEffectException("downstream refused before charging");
    });
    assertEquals(Kind.DEAD_LETTERED, refused.kind());
    assertEquals("NoSideEffectException: downstream refused before charging", refused.reason());
    assertEquals(Kind.EXECUTED, p.process(m, counting).kind());
    assertEquals(1, runs.get());
  }

  @Test
  void aKeyReusedWithAnotherValueIsDeadLettered() {
    MessageProcessor p = processor(ENDPOINT).build();
    String key = key();
    assertEquals(Kind.EXECUTED, p.process(message(key, "{\"n\":1}"), counting).kind());
    Outcome reuse = p.process(message(key, "{\"n\":2}"), counting);
    assertEquals(Kind.DEAD_LETTERED, reuse.kind());
    assertTrue(reuse.reason().contains("key reuse"), reuse.reason());
    assertEquals(1, runs.get());
  }

  @Test
  void aMissingOrInvalidKeyHeaderIsDeadLetteredNamingTheHeader() {
    MessageProcessor p = processor(ENDPOINT).build();
    Outcome missing = p.process(Message.of("orders", 0, 1, new byte[] {1}), counting);
    assertEquals(Kind.DEAD_LETTERED, missing.kind());
    assertEquals("no idempotency key: the message has no header \"idempotency-key\"", missing.reason());
    Outcome invalid = p.process(message("has space", "{}"), counting);
    assertEquals(Kind.DEAD_LETTERED, invalid.kind());
    assertTrue(invalid.reason().startsWith("invalid idempotency key in header \"idempotency-key\""));
    assertEquals(0, runs.get());
  }

  @Test
  void aDuplicateWaitsForTheHolderUpToMaxWaitThenRetries() throws Exception {
    MessageProcessor p = processor(ENDPOINT).build();
    Message m = message(key(), "{\"n\":9}");
    CountDownLatch running = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    CompletableFuture<Outcome> holder = CompletableFuture.supplyAsync(() -> p.process(m, x -> {
      running.countDown();
      release.await();
      runs.incrementAndGet();
    }));
    assertTrue(running.await(10, TimeUnit.SECONDS));
    Outcome busy = processor(ENDPOINT).maxWait(Duration.ofMillis(300)).build().process(m, counting);
    assertEquals(Kind.RETRY, busy.kind());
    assertFalse(busy.mayCommit());
    assertInstanceOf(InProgressException.class, busy.error());

    CompletableFuture<Outcome> waiter = CompletableFuture.supplyAsync(() -> p.process(m, counting));
    Thread.sleep(300);
    release.countDown();
    assertEquals(Kind.EXECUTED, holder.get(10, TimeUnit.SECONDS).kind());
    assertEquals(Kind.DUPLICATE, waiter.get(10, TimeUnit.SECONDS).kind(), "the waiter did not wait");
    assertEquals(1, runs.get());
  }

  @Test
  void aHandlerSlowerThanItsLeaseKeepsTheKey() throws Exception {
    MessageProcessor p = processor(ENDPOINT).lease(Duration.ofMillis(400)).build();
    Message m = message(key(), "{\"n\":3}");
    CountDownLatch running = new CountDownLatch(1);
    CompletableFuture<Outcome> slow = CompletableFuture.supplyAsync(() -> p.process(m, x -> {
      running.countDown();
      Thread.sleep(1500);
      runs.incrementAndGet();
    }));
    assertTrue(running.await(10, TimeUnit.SECONDS));
    Thread.sleep(800); // two leases: without extension the duplicate below finds it expired
    Outcome duplicate = p.process(m, counting);
    assertEquals(Kind.EXECUTED, slow.get(10, TimeUnit.SECONDS).kind());
    assertEquals(Kind.DUPLICATE, duplicate.kind(), duplicate.reason());
    assertEquals(1, runs.get());
  }

  @Test
  void aHolderThatDiedIsDeadLetteredAsUnknownOnceItsLeaseExpires() throws Exception {
    String key = key();
    Message m = message(key, "{\"n\":5}");
    assertEquals(ClaimResponse.OutcomeCase.CLAIMED, abandonedClaim(ENDPOINT, key, m).getOutcomeCase());
    Thread.sleep(700);
    Outcome outcome = processor(ENDPOINT).build().process(m, counting);
    assertEquals(Kind.DEAD_LETTERED, outcome.kind());
    assertTrue(outcome.reason().startsWith("outcome unknown: an earlier attempt's lease expired"),
        outcome.reason());
    assertEquals(0, runs.get());
  }

  @Test
  void aTakeoverIsDeadLetteredAndRecordedUnknownWithoutRunningTheHandler() throws Exception {
    String key = key();
    Message m = message(key, "{\"n\":6}");
    assertEquals(ClaimResponse.OutcomeCase.CLAIMED,
        abandonedClaim(TAKEOVER_ENDPOINT, key, m).getOutcomeCase());
    Thread.sleep(700);
    Outcome outcome = processor(TAKEOVER_ENDPOINT).build().process(m, counting);
    assertEquals(Kind.DEAD_LETTERED, outcome.kind());
    assertTrue(outcome.reason().startsWith("OutcomeUnknown: an earlier attempt's lease expired"),
        outcome.reason());
    assertEquals(0, runs.get(), "a taken-over key ran the handler again");
    State state = client.lookup(LookupRequest.newBuilder().setEndpoint(TAKEOVER_ENDPOINT).setKey(key)
        .build()).getRecord().getState();
    assertEquals(State.STATE_UNKNOWN, state);
  }

  /**
   * A processor asks for {@link MessageProcessor#DEFAULT_LEASE}, not the endpoint policy's lease
   * (10 s in the conformance idemd.toml), in process and processBatch alike: a consumer killed
   * inside its handler holds the redelivered message (its partition) about that long (issue 52).
   */
  @Test
  void asksForTheDefaultConsumerLease() {
    MessageProcessor p = processor(ENDPOINT).build();
    List<Duration> left = new ArrayList<>();
    MessageHandler handler = m -> {
      String key = new String(m.header(HEADER).orElseThrow(), StandardCharsets.UTF_8);
      com.google.protobuf.Timestamp expires = client.lookup(LookupRequest.newBuilder()
          .setEndpoint(ENDPOINT).setKey(key).build()).getRecord().getLeaseExpiresAt();
      synchronized (left) {
        left.add(Duration.between(java.time.Instant.now(),
            java.time.Instant.ofEpochSecond(expires.getSeconds(), expires.getNanos())));
      }
    };
    assertEquals(Kind.EXECUTED, p.process(message(key(), "{\"n\":1}"), handler).kind());
    for (Outcome out : p.processBatch(
        List.of(message(key(), "{\"n\":2}"), message(key(), "{\"n\":3}")), handler)) {
      assertEquals(Kind.EXECUTED, out.kind(), out.reason());
    }
    assertEquals(3, left.size(), "the handler's lookups: " + left);
    for (Duration d : left) {
      // Just claimed: about the whole lease left (the clock is the same one).
      assertTrue(d.compareTo(MessageProcessor.DEFAULT_LEASE.minusSeconds(2)) > 0
          && d.compareTo(MessageProcessor.DEFAULT_LEASE.plusMillis(200)) <= 0,
          "a handler's lease had " + d + " left, want about " + MessageProcessor.DEFAULT_LEASE + ": " + left);
    }
  }

  @Test
  void idemdUnavailableIsRetry() {
    try (IdemdClient down = IdemdClient.builder("127.0.0.1:1").plaintext().bearerToken(TOKEN)
        .deadline(Duration.ofSeconds(1)).build()) {
      Outcome outcome = MessageProcessor.builder(down, ENDPOINT).keyFromHeader(HEADER)
          .deadLetter((m, r) -> deadLetters.add(r)).build()
          .process(message(key(), "{}"), counting);
      assertEquals(Kind.RETRY, outcome.kind());
      assertFalse(outcome.mayCommit());
      assertEquals(0, runs.get());
      assertEquals(List.of(), deadLetters);
    }
  }

  @Test
  void aFailingDeadLetterHookIsRetry() {
    MessageProcessor p = MessageProcessor.builder(client, ENDPOINT).keyFromHeader(HEADER)
        .deadLetter((m, r) -> {
          throw new java.io.IOException("dead-letter topic unavailable");
        }).build();
    Outcome outcome = p.process(message(key(), "{}"), x -> {
      throw new IllegalStateException("boom");
    });
    assertEquals(Kind.RETRY, outcome.kind());
    assertInstanceOf(java.io.IOException.class, outcome.error());
  }

  @Test
  void positionKeysCatchRedeliveriesAndKeepTopicsApart() {
    MessageProcessor p = MessageProcessor.builder(client, ENDPOINT).keyFromPosition()
        .deadLetter((m, r) -> deadLetters.add(r)).build();
    String topic = "orders." + UUID.randomUUID();
    Message m = Message.of(topic, 2, 41, new byte[] {1});
    assertEquals(Kind.EXECUTED, p.process(m, counting).kind());
    assertEquals(Kind.DUPLICATE, p.process(m, counting).kind());
    assertEquals(Kind.EXECUTED, p.process(Message.of(topic, 2, 42, new byte[] {1}), counting).kind());
    assertEquals(2, runs.get());
    assertEquals("a_db__c-1-2", MessageProcessor.positionKey(Message.of("a.b_c", 1, 2, null)));
    String longTopic = "t_".repeat(125); // 375 characters once escaped
    assertTrue(MessageProcessor.positionKey(Message.of(longTopic, 0, 0, null)).matches("h_[0-9a-f]{32}-0-0"));
  }

  @Test
  void aKeySourceAndAHookAreRequired() {
    assertThrows(IllegalStateException.class,
        () -> MessageProcessor.builder(client, ENDPOINT).deadLetter((m, r) -> {}).build());
    assertThrows(NullPointerException.class,
        () -> MessageProcessor.builder(client, ENDPOINT).keyFromPosition().build());
  }

  /** A Claim whose holder then "dies": a 300 ms lease nobody extends, completes or fails. */
  private ClaimResponse abandonedClaim(String endpoint, String key, Message m) {
    byte[] fingerprint = Fingerprint.v1("CONSUME", endpoint, "", m.value(), List.of());
    return client.claim(ClaimRequest.newBuilder().setEndpoint(endpoint).setKey(key)
        .setSha256(ByteString.copyFrom(fingerprint))
        .setLease(ExecuteEngine.toProto(Duration.ofMillis(300))).build());
  }
}
