package dev.idemd.examples.payments;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.IdemdClient;
import dev.idemd.client.json.StrictJson;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.Record;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.boot.SpringApplication;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RestController;

/** The Spring Boot example over real HTTP against a live idemd. */
class PaymentsApplicationTest {
  static Process idemd;
  static ConfigurableApplicationContext app;
  static int port;
  static final HttpClient HTTP = HttpClient.newHttpClient();
  static final String PAYMENT = "{\"amount\":4200,\"currency\":\"usd\",\"customer\":\"cus_8812\"}";

  @BeforeAll
  static void start() throws Exception {
    Path root = Path.of(System.getProperty("idemd.repo.root", "../../..")).toAbsolutePath().normalize();
    Path conformance = root.resolve("clients/conformance");
    idemd = new ProcessBuilder(List.of(
            System.getenv().getOrDefault("IDEMD_BIN", root.resolve("target/debug/idemd").toString()),
            "--listen", "127.0.0.1:0", "--data-dir", Files.createTempDirectory("idemd-spring-").toString(),
            "--config", conformance.resolve("idemd.toml").toString(),
            "--auth-tokens", conformance.resolve("tokens.txt").toString(), "--log-format", "json"))
        .redirectOutput(ProcessBuilder.Redirect.DISCARD)
        .start();
    CompletableFuture<String> serving = new CompletableFuture<>();
    Thread reader = new Thread(() -> {
      try (BufferedReader lines = new BufferedReader(
          new InputStreamReader(idemd.getErrorStream(), StandardCharsets.UTF_8))) {
        for (String line; (line = lines.readLine()) != null; ) {
          try {
            if (StrictJson.parse(line) instanceof Map<?, ?> entry
                && "idemd serving".equals(entry.get("message"))) {
              serving.complete((String) entry.get("address"));
            }
          } catch (Exception notJson) {
            // keep reading
          }
        }
      } catch (Exception gone) {
        serving.completeExceptionally(gone);
      }
    });
    reader.setDaemon(true);
    reader.start();
    String address = serving.get(30, TimeUnit.SECONDS);
    app = SpringApplication.run(PaymentsApplication.class, "--server.port=0",
        "--idemd.address=" + address, "--idemd.token=conformance-token-alice-3f9a",
        "--spring.main.banner-mode=off", "--logging.level.root=warn");
    port = Integer.parseInt(app.getEnvironment().getProperty("local.server.port"));
  }

  @AfterAll
  static void stop() throws Exception {
    app.close();
    idemd.destroy();
    idemd.waitFor(10, TimeUnit.SECONDS);
  }

  static HttpResponse<String> post(String body, String key) throws Exception {
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/v1/payments"))
        .header("Content-Type", "application/json")
        .POST(HttpRequest.BodyPublishers.ofString(body));
    if (key != null) {
      request.header("Idempotency-Key", key);
    }
    return HTTP.send(request.build(), HttpResponse.BodyHandlers.ofString());
  }

  /**
   * A controller that fails with its outcome unknown (http-scenarios.md's {@code /crash/}); found
   * by the application's component scan, in tests only. Spring's DispatcherServlet wraps what it
   * throws in a ServletException ("Request processing failed: ...").
   */
  @RestController
  static class CrashController {
    @PostMapping("/v1/crash")
    String crash() {
      throw new IllegalStateException("boom: secret-4711");
    }
  }

  static HttpResponse<String> send(String method, String path, String contentType, String body,
      String key) throws Exception {
    return HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
        .header("Content-Type", contentType)
        .header("Idempotency-Key", key)
        .method(method, HttpRequest.BodyPublishers.ofString(body))
        .build(), HttpResponse.BodyHandlers.ofString());
  }

  static Record lookup(String endpoint, String key) {
    return app.getBean(IdemdClient.class)
        .lookup(LookupRequest.newBuilder().setEndpoint(endpoint).setKey(key).build())
        .getRecord();
  }

  @Test
  void aControllerExceptionIsStoredUnwrappedAndNotShownToTheCaller() throws Exception {
    String key = UUID.randomUUID().toString();
    HttpResponse<String> first = send("POST", "/v1/crash", "application/json", "{}", key);
    assertEquals(500, first.statusCode(), first.body());
    assertEquals("IllegalStateException: boom: secret-4711", lookup("POST /v1/crash", key).getReason());

    HttpResponse<String> retry = send("POST", "/v1/crash", "application/json", "{}", key);
    assertEquals(409, retry.statusCode(), retry.body());
    assertEquals("https://idemd.dev/problems/outcome_pending", problem(retry));
    assertFalse(retry.body().contains("secret-4711"), retry.body());
    assertFalse(retry.body().contains("\"reason\""), retry.body());
  }

  @Test
  void aFormSpringParsedBeforeTheFilterIsAnOrderMistake() throws Exception {
    // Spring Boot's FormContentFilter (order -9900) reads PATCH forms before this registration
    // (default order, last): the filter must say so at once, not claim a key for an empty body.
    String key = UUID.randomUUID().toString();
    long started = System.nanoTime();
    HttpResponse<String> answer =
        send("PATCH", "/v1/payments", "application/x-www-form-urlencoded", "amount=4200", key);
    double seconds = (System.nanoTime() - started) / 1e9;
    assertTrue(seconds < 1, "answered after " + seconds + " s");
    assertEquals(500, answer.statusCode(), answer.body());
    assertEquals("https://idemd.dev/problems/middleware_order", problem(answer));
    StatusRuntimeException missing =
        assertThrows(StatusRuntimeException.class, () -> lookup("PATCH /v1/payments", key));
    assertEquals(Status.Code.NOT_FOUND, missing.getStatus().getCode());
  }

  static String problem(HttpResponse<String> response) throws Exception {
    return String.valueOf(((Map<?, ?>) StrictJson.parse(response.body())).get("type"));
  }

  @Test
  void theReadmeBlockIsThisApplicationsRegistration() throws Exception {
    Path root = Path.of(System.getProperty("idemd.repo.root", "../../..")).toAbsolutePath().normalize();
    String readme = Files.readString(root.resolve("clients/java/README.md"));
    String section = readme.substring(readme.indexOf("## Servlet filter"));
    String block = section.substring(section.indexOf("```java\n") + 8, section.indexOf("```\n", section.indexOf("```java\n") + 8));
    String source = Files.readString(root.resolve(
        "clients/java/spring-example/src/main/java/dev/idemd/examples/payments/PaymentsApplication.java"));
    assertTrue(source.contains(block), "README block is not in PaymentsApplication.java:\n" + block);
  }

  @Test
  void paymentsRunOnceReplayAndRefuseReuse() throws Exception {
    InMemoryPaymentProvider provider = app.getBean(InMemoryPaymentProvider.class);
    int before = provider.chargeCount();

    HttpResponse<String> missing = post(PAYMENT, null);
    assertEquals(400, missing.statusCode());
    assertEquals("https://idemd.dev/problems/idempotency_key_missing", problem(missing));

    String key = UUID.randomUUID().toString();
    HttpResponse<String> first = post(PAYMENT, key);
    assertEquals(201, first.statusCode(), first.body());
    assertFalse(first.headers().firstValue("Idempotent-Replayed").isPresent());
    assertTrue(first.body().contains("\"status\":\"succeeded\""), first.body());

    // The same payment in another key order: the same fingerprint, a replay.
    HttpResponse<String> retry =
        post("{\"customer\":\"cus_8812\",\"currency\":\"usd\",\"amount\":4200}", key);
    assertEquals(201, retry.statusCode());
    assertEquals(first.body(), retry.body());
    assertEquals("true", retry.headers().firstValue("Idempotent-Replayed").orElse(null));

    HttpResponse<String> reuse = post(PAYMENT.replace("4200", "42000"), key);
    assertEquals(422, reuse.statusCode());
    assertEquals("https://idemd.dev/problems/idempotency_key_reuse", problem(reuse));

    assertEquals(before + 1, provider.chargeCount(), "the card was charged once");
  }
}
