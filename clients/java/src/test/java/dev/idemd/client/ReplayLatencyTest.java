package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * Replay latency through the executor (clients/conformance/README.md, "Replay latency check"):
 * guards against transport regressions such as issue 12, where a missing TCP_NODELAY on the
 * server's accepted sockets made every reply that left in two TCP segments wait ~44 ms for the
 * client's delayed ACK. Tagged {@code latency}: the pom's {@code default-test} execution excludes
 * it and the {@code replay-latency} execution runs it alone, after the rest of the suite.
 */
@Tag("latency")
@ExtendWith(LiveIdemd.class)
class ReplayLatencyTest {
  private static final String ENDPOINT = "POST /v1/payments";
  private static final int WARMUPS = 5;
  private static final int SAMPLES = 100;
  private static final double MAX_P50_MS = 10.0;

  @Test
  void replayP50OfA1KibBodyIsUnder10Ms(IdemdServer server) {
    byte[] body = new byte[1024];
    for (int i = 0; i < body.length; i++) {
      body[i] = (byte) i; // every byte value, so the comparison covers more than text
    }
    HttpResponseSpec stored =
        HttpResponseSpec.of(
            201, List.of(new HttpHeader("Content-Type", "application/octet-stream")), body);
    AtomicInteger calls = new AtomicInteger();
    Handler handler =
        execution -> {
          calls.incrementAndGet();
          return stored;
        };
    HttpRequestSpec request =
        HttpRequestSpec.json("POST", "/v1/payments", "{\"amount\":4200,\"currency\":\"usd\"}");
    String key = UUID.randomUUID().toString();

    try (IdemdClient idemd =
        IdemdClient.builder(server.address())
            .bearerToken("conformance-token-alice-3f9a")
            .plaintext()
            .build()) {
      ExecuteResult first = idemd.executeOnce(ENDPOINT, key, request, handler);
      assertFalse(first.replayed(), "the first execute must run the handler");
      assertEquals(201, first.response().status());
      assertArrayEquals(body, first.response().body());
      assertEquals(1, calls.get());

      for (int i = 0; i < WARMUPS; i++) {
        replay(idemd, key, request, handler, body);
      }
      double[] millis = new double[SAMPLES];
      for (int i = 0; i < SAMPLES; i++) {
        long start = System.nanoTime();
        ExecuteResult result = idemd.executeOnce(ENDPOINT, key, request, handler);
        millis[i] = (System.nanoTime() - start) / 1e6;
        check(result, body);
      }
      assertEquals(1, calls.get(), "a replay must not call the handler");

      double p50 = percentile(millis, 50);
      double p99 = percentile(millis, 99);
      String line =
          String.format(
              Locale.ROOT,
              "latency: %d replays of a 1 KiB body: p50 %.2f ms, p99 %.2f ms",
              SAMPLES,
              p50,
              p99);
      System.out.println(line);
      assertTrue(
          p50 <= MAX_P50_MS,
          () ->
              String.format(
                  Locale.ROOT,
                  "replay p50 %.2f ms is over %s ms (%s): is TCP_NODELAY set on the server's"
                      + " accepted sockets?",
                  p50,
                  MAX_P50_MS,
                  line));
    }
  }

  private static void replay(
      IdemdClient idemd, String key, HttpRequestSpec request, Handler handler, byte[] body) {
    check(idemd.executeOnce(ENDPOINT, key, request, handler), body);
  }

  private static void check(ExecuteResult result, byte[] body) {
    assertTrue(result.replayed(), "every execute after the first must replay");
    assertEquals(201, result.response().status());
    assertEquals(1024, result.response().body().length);
    assertArrayEquals(body, result.response().body(), "the replay must return the exact 1 KiB");
  }

  /** The nearest-rank percentile {@code p} (0 < p <= 100) of {@code samples}. */
  static double percentile(double[] samples, int p) {
    double[] sorted = samples.clone();
    Arrays.sort(sorted);
    int rank = (p * sorted.length + 99) / 100; // ceil(p/100 * n), 1-based
    return sorted[Math.max(rank, 1) - 1];
  }
}
