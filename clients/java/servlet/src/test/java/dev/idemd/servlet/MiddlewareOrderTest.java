package dev.idemd.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.json.StrictJson;
import dev.idemd.v1.LookupRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServletRequest;
import java.io.ByteArrayInputStream;
import java.net.URI;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.HashMap;
import java.util.Locale;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The filter mounted after something that reads the request body (the wrong order): it answers at
 * once with 500 {@code middleware_order}, runs no servlet and claims no key; a request without a
 * body passes as usual.
 */
@NeedsIdemd
class MiddlewareOrderTest {
  @BeforeAll
  static void start() throws Exception {
    HttpScenariosTest.start();
  }

  @AfterAll
  static void stop() throws Exception {
    HttpScenariosTest.stop();
  }

  /**
   * Posts {@code body} through the filter with {@code before} in front of it (chunked: without a
   * Content-Length) and checks the refusal.
   */
  static void assertRefused(Filter before, String contentType, String body, boolean chunked)
      throws Exception {
    try (HttpScenariosTest.Container container = new HttpScenariosTest.Container(true, before)) {
      String key = HexFormat.of().formatHex(SecureRandom.getSeed(8));
      long started = System.nanoTime();
      HttpScenariosTest.Reply reply = chunked
          ? post(container.port, "/v1/payments/o1", key, body.getBytes(StandardCharsets.UTF_8))
          : HttpScenariosTest.send(container.port, Map.of(
              "method", "POST", "path", "/v1/payments/o1", "body", body,
              "headers", List.of(List.of("idempotency-key", key), List.of("content-type", contentType))), "");
      double seconds = (System.nanoTime() - started) / 1e9;
      assertNotNull(reply, "no answer");
      assertTrue(seconds < 1, "answered after " + seconds + " s");
      assertEquals(500, reply.status(), new String(reply.body()));
      assertEquals("application/problem+json", reply.header("content-type"));
      Map<?, ?> problem = (Map<?, ?>) StrictJson.parse(reply.body());
      assertEquals("https://idemd.dev/problems/middleware_order", problem.get("type"));
      assertEquals("Internal Server Error", problem.get("title"));
      assertEquals("500", String.valueOf(problem.get("status")));
      assertEquals(IdempotencyFilter.ORDER_DETAIL, problem.get("detail"));
      assertEquals(0, container.app.of("/v1/payments/o1"), "the servlet ran");
      StatusRuntimeException lookup = assertThrows(StatusRuntimeException.class,
          () -> HttpScenariosTest.client.lookup(LookupRequest.newBuilder()
              .setEndpoint("POST /v1/payments/{id}").setKey(key).build()));
      assertEquals(Status.Code.NOT_FOUND, lookup.getStatus().getCode(), "the key was claimed");
    }
  }

  static void assertRefused(Filter before, String contentType, String body) throws Exception {
    assertRefused(before, contentType, body, false);
  }

  /** A JSON POST sent chunked (no Content-Length). */
  static HttpScenariosTest.Reply post(int port, String path, String key, byte[] body)
      throws Exception {
    HttpResponse<byte[]> response = HttpScenariosTest.HTTP.send(
        HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofInputStream(() -> new ByteArrayInputStream(body)))
            .build(),
        HttpResponse.BodyHandlers.ofByteArray());
    Map<String, List<String>> headers = new HashMap<>();
    response.headers().map().forEach((k, v) -> headers.put(k.toLowerCase(Locale.ROOT), v));
    return new HttpScenariosTest.Reply(response.statusCode(), headers, response.body());
  }

  static final Filter READS_THE_STREAM = (req, res, chain) -> {
    req.getInputStream().readAllBytes();
    chain.doFilter(req, res);
  };

  @Test
  void theMistakeIsLoggedOncePerFilter() throws Exception {
    java.util.logging.Logger logger = java.util.logging.Logger.getLogger("dev.idemd.servlet");
    List<java.util.logging.LogRecord> records = new java.util.concurrent.CopyOnWriteArrayList<>();
    java.util.logging.Handler handler = new java.util.logging.Handler() {
      @Override
      public void publish(java.util.logging.LogRecord record) {
        records.add(record);
      }

      @Override
      public void flush() {}

      @Override
      public void close() {}
    };
    logger.addHandler(handler);
    try (HttpScenariosTest.Container container =
        new HttpScenariosTest.Container(true, READS_THE_STREAM)) {
      for (int i = 0; i < 3; i++) {
        String key = HexFormat.of().formatHex(SecureRandom.getSeed(8));
        HttpScenariosTest.Reply reply = HttpScenariosTest.send(container.port, Map.of(
            "method", "POST", "path", "/v1/payments/o5", "body", "{}",
            "headers", List.of(List.of("idempotency-key", key))), "");
        assertEquals(500, reply.status());
        assertFalse(new String(reply.body()).contains(key));
      }
    } finally {
      logger.removeHandler(handler);
    }
    assertEquals(1, records.size(), "log records: " + records.size());
    assertEquals(java.util.logging.Level.SEVERE, records.get(0).getLevel());
    assertEquals(IdempotencyFilter.ORDER_DETAIL, records.get(0).getMessage());
  }

  @Test
  void aChunkedBodyReadBeforeTheFilter() throws Exception {
    assertRefused(READS_THE_STREAM, "application/json", "{\"amount\":4200}", true);
  }

  @Test
  void aBodyReadFromTheStreamBeforeTheFilter() throws Exception {
    assertRefused(READS_THE_STREAM, "application/json", "{\"amount\":4200}");
  }

  @Test
  void aBodyReadPartlyBeforeTheFilter() throws Exception {
    assertRefused((req, res, chain) -> {
      req.getInputStream().readNBytes(3);
      chain.doFilter(req, res);
    }, "application/json", "{\"amount\":4200}");
  }

  @Test
  void aReaderTakenBeforeTheFilter() throws Exception {
    assertRefused((req, res, chain) -> {
      req.getReader().readLine();
      chain.doFilter(req, res);
    }, "application/json", "{\"amount\":4200}");
  }

  @Test
  void aFormParsedBeforeTheFilter() throws Exception {
    assertRefused((req, res, chain) -> {
      ((HttpServletRequest) req).getParameter("amount");
      chain.doFilter(req, res);
    }, "application/x-www-form-urlencoded", "amount=4200&currency=usd");
  }

  @Test
  void aRequestWithoutABodyIsNotMistakenForARead() throws Exception {
    try (HttpScenariosTest.Container container =
        new HttpScenariosTest.Container(true, READS_THE_STREAM)) {
      HttpScenariosTest.Reply reply = HttpScenariosTest.send(container.port, Map.of(
          "method", "POST", "path", "/v1/payments/o2", "body", "",
          "headers", List.of(List.of("idempotency-key", HexFormat.of().formatHex(SecureRandom.getSeed(8))))), "");
      assertNotNull(reply);
      assertEquals(201, reply.status(), new String(reply.body()));
      assertEquals(1, container.app.of("/v1/payments/o2"));
    }
  }

  @Test
  void anEmptyChunkedBodyIsNotMistakenForARead() throws Exception {
    try (HttpScenariosTest.Container container = new HttpScenariosTest.Container(true)) {
      HttpScenariosTest.Reply empty = post(container.port, "/v1/payments/o3",
          HexFormat.of().formatHex(SecureRandom.getSeed(8)), new byte[0]);
      assertEquals(201, empty.status(), new String(empty.body()));
      HttpScenariosTest.Reply full = post(container.port, "/v1/payments/o4",
          HexFormat.of().formatHex(SecureRandom.getSeed(8)), "{\"amount\":4200}".getBytes(StandardCharsets.UTF_8));
      assertEquals(201, full.status(), new String(full.body()));
      assertTrue(new String(full.body()).contains("\"request_bytes\":15"), new String(full.body()));
    }
  }
}
