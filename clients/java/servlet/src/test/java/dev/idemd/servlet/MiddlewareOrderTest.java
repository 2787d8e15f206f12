package dev.idemd.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.json.StrictJson;
import dev.idemd.v1.LookupRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServletRequest;
import java.security.SecureRandom;
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

  /** Posts {@code body} to {@code path} through the filter with {@code before} in front of it. */
  static void assertRefused(Filter before, String contentType, String body) throws Exception {
    try (HttpScenariosTest.Container container = new HttpScenariosTest.Container(true, before)) {
      String key = HexFormat.of().formatHex(SecureRandom.getSeed(8));
      long started = System.nanoTime();
      HttpScenariosTest.Reply reply = HttpScenariosTest.send(container.port, Map.of(
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

  @Test
  void aBodyReadFromTheStreamBeforeTheFilter() throws Exception {
    assertRefused((req, res, chain) -> {
      req.getInputStream().readAllBytes();
      chain.doFilter(req, res);
    }, "application/json", "{\"amount\":4200}");
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
    Filter before = (req, res, chain) -> {
      req.getInputStream().readAllBytes();
      chain.doFilter(req, res);
    };
    try (HttpScenariosTest.Container container = new HttpScenariosTest.Container(true, before)) {
      HttpScenariosTest.Reply reply = HttpScenariosTest.send(container.port, Map.of(
          "method", "POST", "path", "/v1/payments/o2", "body", "",
          "headers", List.of(List.of("idempotency-key", HexFormat.of().formatHex(SecureRandom.getSeed(8))))), "");
      assertNotNull(reply);
      assertEquals(201, reply.status(), new String(reply.body()));
      assertEquals(1, container.app.of("/v1/payments/o2"));
    }
  }
}
