package dev.idemd.examples.payments;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.ExecuteOptions;
import dev.idemd.client.IdemdClient;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** Drives the HTTP example over real HTTP against a live idemd. */
@ExtendWith(LiveIdemd.class)
class PaymentsServerTest {
  private static final String BODY = "{\"amount\":4200,\"currency\":\"usd\",\"customer\":\"cus_8812\"}";

  private IdemdClient idemd;
  private InMemoryPaymentProvider provider;
  private PaymentsServer payments;
  private HttpClient http;
  private URI uri;

  @BeforeEach
  void start(IdemdServer server) throws Exception {
    idemd =
        IdemdClient.builder(server.address())
            .plaintext()
            .bearerToken("conformance-token-alice-3f9a")
            .build();
    provider = new InMemoryPaymentProvider();
    payments = new PaymentsServer(new InetSocketAddress("127.0.0.1", 0), idemd, provider).start();
    uri = URI.create("http://127.0.0.1:" + payments.address().getPort() + "/v1/payments");
    http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(Duration.ofSeconds(5)).build();
  }

  @AfterEach
  void stop() {
    payments.close();
    idemd.close();
  }

  private HttpResponse<String> post(String keyHeader, String key, String body) throws Exception {
    HttpRequest.Builder request =
        HttpRequest.newBuilder(uri)
            .timeout(Duration.ofSeconds(20))
            .header("Content-Type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(body));
    if (keyHeader != null) {
      request.header(keyHeader, key);
    }
    return http.send(request.build(), HttpResponse.BodyHandlers.ofString());
  }

  @Test
  void missingKeyIs400() throws Exception {
    HttpResponse<String> response = post(null, null, BODY);
    assertEquals(400, response.statusCode());
    assertEquals("{\"error\":\"idempotency_key_missing\"}", response.body());
    assertEquals(0, provider.chargeCount());
  }

  @Test
  void malformedKeyIs400() throws Exception {
    HttpResponse<String> response = post("Idempotency-Key", "not a valid key!", BODY);
    assertEquals(400, response.statusCode());
    assertEquals("{\"error\":\"idempotency_key_invalid\"}", response.body());
    HttpResponse<String> tooLong = post("Idempotency-Key", "k".repeat(256), BODY);
    assertEquals(400, tooLong.statusCode());
    assertEquals("{\"error\":\"idempotency_key_invalid\"}", tooLong.body());
    assertEquals(0, provider.chargeCount());
  }

  @Test
  void retriesReplayAndReuseIsRefused() throws Exception {
    String key = UUID.randomUUID().toString();

    HttpResponse<String> first = post("Idempotency-Key", key, BODY);
    assertEquals(201, first.statusCode(), first.body());
    assertTrue(first.body().contains("\"status\":\"succeeded\""), first.body());
    assertEquals("application/json", first.headers().firstValue("Content-Type").orElse(null));
    assertFalse(first.headers().firstValue("Idempotent-Replayed").isPresent());

    // Same key (header name in another case), same request with its members reordered.
    HttpResponse<String> retry =
        post(
            "idempotency-key",
            key,
            "{\"customer\":\"cus_8812\",\"currency\":\"usd\",\"amount\":4200}");
    assertEquals(201, retry.statusCode());
    assertEquals(first.body(), retry.body());
    assertEquals("true", retry.headers().firstValue("Idempotent-Replayed").orElse(null));
    assertEquals(1, provider.chargeCount(), "the card must be charged once");

    HttpResponse<String> reuse =
        post("Idempotency-Key", key, BODY.replace("4200", "42000"));
    assertEquals(422, reuse.statusCode());
    assertEquals("{\"error\":\"idempotency_key_reuse\"}", reuse.body());
    assertEquals(1, provider.chargeCount());
  }

  @Test
  void invalidBodyIsRefusedWithoutClaimingTheKey() throws Exception {
    String key = UUID.randomUUID().toString();
    HttpResponse<String> bad = post("Idempotency-Key", key, "{\"amount\":\"lots\"}");
    assertEquals(400, bad.statusCode());
    assertEquals("{\"error\":\"invalid_request\"}", bad.body());
    // The key is still free for a valid request.
    HttpResponse<String> good = post("Idempotency-Key", key, BODY);
    assertEquals(201, good.statusCode());
    assertEquals(1, provider.chargeCount());
  }

  @Test
  void inFlightDuplicateIs409WithRetryAfterAndAmbiguousFailureIsPending(IdemdServer server)
      throws Exception {
    CountDownLatch charging = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    AtomicInteger calls = new AtomicInteger();
    PaymentProvider slowThenDown =
        (idempotencyKey, amount, currency, customer) -> {
          if (calls.incrementAndGet() == 1) {
            charging.countDown();
            release.await(20, TimeUnit.SECONDS);
            return new PaymentProvider.Charge("pay_slow", amount, currency, customer);
          }
          throw new IOException("payment provider timed out");
        };
    try (PaymentsServer slow =
        new PaymentsServer(
                new InetSocketAddress("127.0.0.1", 0),
                idemd,
                slowThenDown,
                ExecuteOptions.defaults().withMaxWait(Duration.ofMillis(200)))
            .start()) {
      URI slowUri = URI.create("http://127.0.0.1:" + slow.address().getPort() + "/v1/payments");
      String key = UUID.randomUUID().toString();
      CompletableFuture<HttpResponse<String>> original =
          http.sendAsync(request(slowUri, key, BODY), HttpResponse.BodyHandlers.ofString());
      assertTrue(charging.await(20, TimeUnit.SECONDS));

      HttpResponse<String> duplicate =
          http.send(request(slowUri, key, BODY), HttpResponse.BodyHandlers.ofString());
      assertEquals(409, duplicate.statusCode());
      assertEquals("{\"error\":\"request_in_progress\"}", duplicate.body());
      assertTrue(duplicate.headers().firstValue("Retry-After").isPresent());

      release.countDown();
      assertEquals(201, original.get(20, TimeUnit.SECONDS).statusCode());

      // The provider now times out: the outcome is unknown, so the retry is not re-executed.
      String other = UUID.randomUUID().toString();
      HttpResponse<String> failed =
          http.send(request(slowUri, other, BODY), HttpResponse.BodyHandlers.ofString());
      assertEquals(502, failed.statusCode());
      HttpResponse<String> retry =
          http.send(request(slowUri, other, BODY), HttpResponse.BodyHandlers.ofString());
      assertEquals(409, retry.statusCode());
      assertEquals("{\"error\":\"outcome_pending\"}", retry.body());
      assertEquals(2, calls.get(), "an undecided charge is never retried");
    }
  }

  private static HttpRequest request(URI uri, String key, String body) {
    return HttpRequest.newBuilder(uri)
        .timeout(Duration.ofSeconds(20))
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", key)
        .POST(HttpRequest.BodyPublishers.ofString(body))
        .build();
  }
}
