package dev.idemd.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * What the filter costs at one request in flight (docs/sdk.md records the numbers): the same
 * servlet in Jetty with and without it, p50 of 200 requests each, against the live idemd. Prints
 * them; fails only when a replay's p50 is over 10 ms.
 */
@NeedsIdemd
class FilterLatencyTest {
  static final int SAMPLES = 200;

  static List<Double> timed(int port, String prefix, String kind, int count) {
    List<Double> samples = new ArrayList<>();
    for (int i = 0; i < count; i++) {
      long started = System.nanoTime();
      HttpScenariosTest.Reply reply = HttpScenariosTest.send(port, Map.of("method", "POST",
          "path", "/v1/payments/p1", "body", "{\"amount\":4200,\"currency\":\"usd\",\"customer\":\"cus_8812\"}",
          "headers", List.of(List.of("idempotency-key", prefix + "-" + kind + "-" + i),
              List.of("content-type", "application/json"))), "");
      samples.add((System.nanoTime() - started) / 1e6);
      assertNotNull(reply);
      assertEquals(201, reply.status());
    }
    return samples;
  }

  static double p50(List<Double> samples) {
    List<Double> sorted = new ArrayList<>(samples);
    Collections.sort(sorted);
    return sorted.get(sorted.size() / 2);
  }

  @Test
  void filterLatencyAtOneRequestInFlight() throws Exception {
    HttpScenariosTest.start();
    try (HttpScenariosTest.Container bare = new HttpScenariosTest.Container(false);
        HttpScenariosTest.Container filtered = new HttpScenariosTest.Container(true)) {
      String prefix = HexFormat.of().formatHex(SecureRandom.getSeed(6));
      timed(bare.port, prefix, "warm", 50);
      timed(filtered.port, prefix, "warm", 50);
      List<Double> without = timed(bare.port, prefix, "bare", SAMPLES);
      List<Double> fresh = timed(filtered.port, prefix, "fresh", SAMPLES);
      List<Double> replay = timed(filtered.port, prefix, "fresh", SAMPLES);
      System.out.printf("latency: servlet filter (Jetty), one in flight, %d requests each: without p50 %.2f ms;"
          + " fresh p50 %.2f ms; replay p50 %.2f ms%n", SAMPLES, p50(without), p50(fresh), p50(replay));
      assertTrue(p50(replay) < 10, "replay p50 " + p50(replay));
    } finally {
      HttpScenariosTest.stop();
    }
  }
}
