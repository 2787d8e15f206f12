package dev.idemd.servlet;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.idemd.client.Execution;
import dev.idemd.client.IdemdClient;
import dev.idemd.client.NoSideEffectException;
import dev.idemd.client.json.JsonNumber;
import dev.idemd.client.json.StrictJson;
import jakarta.servlet.DispatcherType;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.eclipse.jetty.ee10.servlet.FilterHolder;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The filter inside a real servlet container (Jetty 12, ee10) over real HTTP against a live idemd:
 * the shared HTTP scenarios (clients/conformance/http-scenarios.json, which {@code idemd proxy}'s
 * suite runs too), and what the filter hands the servlet.
 */
@NeedsIdemd
class HttpScenariosTest {
  static Idemd idemd;
  static IdemdClient client;
  static Map<String, Object> file;

  @BeforeAll
  static void start() throws Exception {
    idemd = new Idemd();
    client = IdemdClient.builder(idemd.address).plaintext().bearerToken(Idemd.ALICE).build();
    file = map(StrictJson.parse(Files.readAllBytes(
        Idemd.root().resolve("clients/conformance/http-scenarios.json"))));
  }

  @AfterAll
  static void stop() throws Exception {
    client.close();
    idemd.close();
  }

  @SuppressWarnings("unchecked")
  static Map<String, Object> map(Object v) {
    return (Map<String, Object>) v;
  }

  @SuppressWarnings("unchecked")
  static List<Object> list(Object v) {
    return (List<Object>) v;
  }

  static int number(Object v) {
    return Integer.parseInt(((JsonNumber) v).text());
  }

  /** What the app's {@code /crash/} handler throws (http-scenarios.md). */
  static final String CRASH_MESSAGE = "boom: secret-4711";

  /** The scenarios' app (http-scenarios.md), counting executions per path. */
  static final class App extends HttpServlet {
    private static final long serialVersionUID = 1L;
    final transient Map<String, AtomicInteger> executions = new ConcurrentHashMap<>();

    int of(String path) {
      AtomicInteger n = executions.get(path);
      return n == null ? 0 : n.get();
    }

    @Override
    protected void service(HttpServletRequest req, HttpServletResponse res) throws IOException {
      byte[] body = req.getInputStream().readAllBytes();
      String path = req.getRequestURI();
      int execution = executions.computeIfAbsent(path, k -> new AtomicInteger()).incrementAndGet();
      if (path.contains("/slow/")) {
        try {
          Thread.sleep(600);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
      if (path.startsWith("/crash/") || path.startsWith("/crash-exposed/")) {
        throw new IllegalStateException(CRASH_MESSAGE);
      }
      if (path.startsWith("/norun/")) {
        throw new IOException(new NoSideEffectException("card rejected before charging"));
      }
      int status = 201;
      byte[] payload;
      if (path.contains("/fail/")) {
        status = 500;
        payload = "{\"error\":\"boom\"}".getBytes(StandardCharsets.UTF_8);
      } else if (path.startsWith("/big/")) {
        status = 200;
        payload = "x".repeat(65536).getBytes(StandardCharsets.UTF_8);
      } else {
        payload = ("{\"path\":\"" + path + "\",\"execution\":" + execution + ",\"request_bytes\":"
            + body.length + "}").getBytes(StandardCharsets.UTF_8);
      }
      res.setStatus(status);
      res.setHeader("Content-Type", "application/json");
      res.setHeader("Location", path);
      res.addHeader("Set-Cookie", "session=secret-" + execution);
      res.setHeader("X-Execution", Integer.toString(execution));
      try {
        res.setHeader("X-Body-Sha256",
            HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(body)));
      } catch (java.security.NoSuchAlgorithmException e) {
        throw new IOException(e);
      }
      if (req.getAttribute(IdempotencyFilter.EXECUTION_ATTRIBUTE) instanceof Execution ex) {
        res.setHeader("X-Downstream-Key", ex.downstreamKey("charge"));
      }
      res.getOutputStream().write(payload);
    }
  }

  /** Jetty with the filter (built from the file's routes) in front of the app. */
  static final class Container implements AutoCloseable {
    final Server server = new Server();
    final App app = new App();
    final int port;

    Container() throws Exception {
      this(true);
    }

    /** With or without the filter (the latency test compares both). */
    Container(boolean filtered) throws Exception {
      this(filtered, null);
    }

    /** With {@code before} (when not null) mounted in front of the filter. */
    Container(boolean filtered, jakarta.servlet.Filter before) throws Exception {
      ServerConnector connector = new ServerConnector(server);
      connector.setHost("127.0.0.1");
      server.addConnector(connector);
      ServletContextHandler context = new ServletContextHandler();
      IdempotencyFilter.Builder builder = IdempotencyFilter.builder(client);
      Set<String> proxyOnly = new HashSet<>();
      for (Object name : list(file.get("proxy_only_fields"))) {
        proxyOnly.add((String) name);
      }
      for (Object table : list(map(file.get("routes")).get("routes"))) {
        builder.route(Route.fromTable(map(table), proxyOnly));
      }
      if (before != null) {
        context.addFilter(new FilterHolder(before), "/*", EnumSet.of(DispatcherType.REQUEST));
      }
      if (filtered) {
        context.addFilter(new FilterHolder(builder.build()), "/*", EnumSet.of(DispatcherType.REQUEST));
      }
      context.addServlet(new ServletHolder(app), "/*");
      server.setHandler(context);
      server.start();
      port = connector.getLocalPort();
    }

    @Override
    public void close() throws Exception {
      server.stop();
    }
  }

  record Reply(int status, Map<String, List<String>> headers, byte[] body) {
    String header(String name) {
      List<String> values = headers.get(name.toLowerCase());
      return values == null || values.isEmpty() ? null : values.get(values.size() - 1);
    }
  }

  static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

  /**
   * A request's outcome: its reply, or (reply null) the exception that left it without one, and
   * how long it took either way.
   */
  record Sent(Reply reply, Exception failure, long millis) {
    /** Why there is no reply, for a failure message. */
    String why() {
      return "no answer after " + millis + " ms ("
          + (failure == null ? "no exception" : failure.getClass().getName() + ": " + failure.getMessage())
          + ")";
    }
  }

  /** The reply to {@code request}, or null when the connection closed without one. */
  static Reply send(int port, Map<String, Object> request, String prefix) {
    return attempt(port, request, prefix).reply();
  }

  static Sent attempt(int port, Map<String, Object> request, String prefix) {
    long started = System.nanoTime();
    String body = request.get("body") instanceof String b ? b : "";
    HttpRequest.Builder builder = HttpRequest.newBuilder(
            URI.create("http://127.0.0.1:" + port + request.get("path")))
        .method((String) request.get("method"), body.isEmpty() && "GET".equals(request.get("method"))
            ? HttpRequest.BodyPublishers.noBody()
            : HttpRequest.BodyPublishers.ofString(body));
    if (request.get("headers") instanceof List<?> headers) {
      for (Object pair : headers) {
        List<Object> p = list(pair);
        builder.header((String) p.get(0), ((String) p.get(1)).replaceAll("\\{key:(\\d+)\\}", prefix + "-$1"));
      }
    }
    try {
      HttpResponse<byte[]> response = HTTP.send(builder.build(), HttpResponse.BodyHandlers.ofByteArray());
      Map<String, List<String>> headers = new HashMap<>();
      response.headers().map().forEach((k, v) -> headers.put(k.toLowerCase(), v));
      return new Sent(new Reply(response.statusCode(), headers, response.body()), null,
          (System.nanoTime() - started) / 1_000_000);
    } catch (IOException | InterruptedException e) {
      // the connection closed without an answer
      return new Sent(null, e, (System.nanoTime() - started) / 1_000_000);
    }
  }

  static void check(String at, Map<String, Object> expect, Sent sent, Map<String, byte[]> saved) {
    Reply reply = sent.reply();
    if (Boolean.TRUE.equals(expect.get("failed"))) {
      assertTrue(reply == null || reply.status() >= 500, at + ": expected a failure");
      return;
    }
    assertNotNull(reply, at + ": " + sent.why());
    String text = new String(reply.body(), StandardCharsets.UTF_8);
    if (expect.containsKey("status")) {
      assertEquals(number(expect.get("status")), reply.status(), at + ": status; body " + text);
    }
    if (expect.get("headers") instanceof Map<?, ?> headers) {
      for (Map.Entry<?, ?> e : headers.entrySet()) {
        assertEquals(e.getValue(), reply.header((String) e.getKey()),
            at + ": header " + e.getKey() + "; " + reply.headers());
      }
    }
    if (expect.get("problem") instanceof String problem) {
      assertEquals("application/problem+json", reply.header("content-type"), at);
      assertEquals("https://idemd.dev/problems/" + problem, map(parse(reply.body())).get("type"), at);
    }
    if (Boolean.TRUE.equals(expect.get("retry_after"))) {
      assertNotNull(reply.header("retry-after"), at + ": Retry-After");
    }
    if (expect.get("body") instanceof String b) {
      assertEquals(b, text, at + ": body");
    }
    if (expect.containsKey("body_length")) {
      assertEquals(number(expect.get("body_length")), reply.body().length, at + ": body length");
    }
    if (expect.get("body_includes") instanceof List<?> includes) {
      for (Object part : includes) {
        assertTrue(text.contains((String) part), at + ": body lacks " + part + ": " + text);
      }
    }
    if (expect.get("body_excludes") instanceof List<?> excludes) {
      for (Object part : excludes) {
        assertFalse(text.contains((String) part), at + ": body contains " + part + ": " + text);
      }
    }
    if (expect.get("body_same_as") instanceof String name) {
      assertArrayEquals(saved.get(name), reply.body(), at + ": body differs from " + name + "'s");
    }
  }

  static Object parse(byte[] json) {
    try {
      return StrictJson.parse(json);
    } catch (Exception e) {
      throw new AssertionError("not JSON: " + new String(json, StandardCharsets.UTF_8), e);
    }
  }

  @Test
  void sharedHttpScenarios() throws Exception {
    try (Container container = new Container()) {
      int ran = 0;
      List<Object> scenarios = list(file.get("scenarios"));
      for (int number = 0; number < scenarios.size(); number++) {
        Map<String, Object> scenario = map(scenarios.get(number));
        if (scenario.containsKey("only") && !"middleware".equals(scenario.get("only"))) {
          continue;
        }
        String prefix = HexFormat.of().formatHex(SecureRandom.getSeed(8));
        Map<String, byte[]> saved = new HashMap<>();
        Map<String, CompletableFuture<Sent>> started = new HashMap<>();
        Map<String, String> startedPath = new HashMap<>();
        List<Object> steps = list(scenario.get("steps"));
        for (int index = 0; index < steps.size(); index++) {
          Map<String, Object> step = map(steps.get(index));
          String at = "scenario " + number + " (" + scenario.get("name") + "), step " + index;
          Map<String, Object> expect = step.get("expect") == null ? Map.of() : map(step.get("expect"));
          Map<String, Object> request = step.get("request") == null ? null : map(step.get("request"));
          String path;
          if (step.containsKey("sleep_ms")) {
            Thread.sleep(number(step.get("sleep_ms")));
            continue;
          } else if (step.get("finish") instanceof String name) {
            path = startedPath.get(name);
            check(at, expect, started.get(name).get(), saved);
          } else if (step.get("start") instanceof String name) {
            startedPath.put(name, (String) request.get("path"));
            started.put(name, CompletableFuture.supplyAsync(() -> attempt(container.port, request, prefix)));
            continue;
          } else if (step.containsKey("parallel")) {
            path = (String) request.get("path");
            List<CompletableFuture<Sent>> futures = new ArrayList<>();
            for (int i = 0; i < number(step.get("parallel")); i++) {
              Thread[] holder = new Thread[1];
              CompletableFuture<Sent> f = new CompletableFuture<>();
              holder[0] = new Thread(() -> f.complete(attempt(container.port, request, prefix)));
              holder[0].start();
              futures.add(f);
            }
            List<Integer> statuses = new ArrayList<>();
            Set<String> bodies = new HashSet<>();
            for (CompletableFuture<Sent> f : futures) {
              Sent sent = f.get();
              Reply r = sent.reply();
              assertNotNull(r, at + ": a request got " + sent.why());
              statuses.add(r.status());
              if (expect.get("statuses") instanceof List<?> allowed) {
                boolean ok = false;
                for (Object a : allowed) {
                  ok |= number(a) == r.status();
                }
                assertTrue(ok, at + ": status " + r.status());
              }
              if (expect.containsKey("same_body_for") && number(expect.get("same_body_for")) == r.status()) {
                bodies.add(HexFormat.of().formatHex(r.body()));
              }
              if (r.status() == 409 && expect.get("on_409") instanceof Map<?, ?> on409) {
                check(at, map(on409), sent, saved);
              }
            }
            assertTrue(bodies.size() <= 1, at + ": different bodies");
            if (expect.containsKey("includes_status")) {
              assertTrue(statuses.contains(number(expect.get("includes_status"))), at + ": " + statuses);
            }
          } else {
            path = (String) request.get("path");
            Sent sent = attempt(container.port, request, prefix);
            check(at, expect, sent, saved);
            if (step.get("save_as") instanceof String name && sent.reply() != null) {
              saved.put(name, sent.reply().body());
            }
          }
          if (expect.containsKey("executions")) {
            assertEquals(number(expect.get("executions")), container.app.of(path),
                at + ": executions of " + path);
          }
        }
        ran++;
      }
      if (ran <= 10) {
        fail("only " + ran + " scenarios ran");
      }
    }
  }

  @Test
  void aCrashStoresTheHandlersExceptionAsTheReason() throws Exception {
    try (Container container = new Container()) {
      String key = HexFormat.of().formatHex(SecureRandom.getSeed(8));
      Reply reply = send(container.port, Map.of("method", "POST", "path", "/crash/r1", "body", "{}",
          "headers", List.of(List.of("idempotency-key", key), List.of("content-type", "application/json"))), "");
      assertTrue(reply == null || reply.status() >= 500, "the crash reached the container");
      var record = client.lookup(dev.idemd.v1.LookupRequest.newBuilder()
          .setEndpoint("POST /crash/r1").setKey(key).build()).getRecord();
      assertEquals(dev.idemd.v1.State.STATE_UNKNOWN, record.getState());
      assertEquals("IllegalStateException: " + CRASH_MESSAGE, record.getReason());
    }
  }

  @Test
  void theServletGetsTheBodyUnchangedAndItsExecution() throws Exception {
    try (Container container = new Container()) {
      String key = HexFormat.of().formatHex(SecureRandom.getSeed(8));
      String body = "{\"amount\": 4200,  \"currency\": \"usd\", \"note\": \"café\"}";
      Reply reply = send(container.port, Map.of("method", "POST", "path", "/v1/payments/b1", "body", body,
          "headers", List.of(List.of("idempotency-key", key), List.of("content-type", "application/json"))), "");
      assertNotNull(reply);
      assertEquals(201, reply.status());
      assertEquals(HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256")
          .digest(body.getBytes(StandardCharsets.UTF_8))), reply.header("x-body-sha256"));
      assertEquals(IdemdClient.downstreamKey(key, "charge"), reply.header("x-downstream-key"));
    }
  }
}
