package dev.idemd.client;

import static dev.idemd.client.testing.Json.array;
import static dev.idemd.client.testing.Json.bool;
import static dev.idemd.client.testing.Json.integer;
import static dev.idemd.client.testing.Json.object;
import static dev.idemd.client.testing.Json.onlyFields;
import static dev.idemd.client.testing.Json.string;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.protobuf.ByteString;
import dev.idemd.client.json.StrictJson;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.Json;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.client.testing.RepoPaths;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.Claimed;
import dev.idemd.v1.CompleteRequest;
import dev.idemd.v1.Disposition;
import dev.idemd.v1.Header;
import dev.idemd.v1.HttpRequest;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.LookupResponse;
import dev.idemd.v1.StoredResponse;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.extension.ExtendWith;
import org.opentest4j.AssertionFailedError;

/**
 * Runs every scenario of clients/conformance/scenarios.json against a live idemd. The runner
 * interprets the scenario language of clients/conformance/README.md; an unknown op, field or
 * expectation fails the scenario.
 */
@ExtendWith(LiveIdemd.class)
class ConformanceTest {
  private static final Set<String> FILE_FIELDS =
      Set.of("version", "description", "credentials", "scenarios");
  private static final Set<String> SCENARIO_FIELDS = Set.of("name", "description", "steps");
  private static final Map<String, Set<String>> STEP_FIELDS =
      Map.of(
          "execute",
          Set.of(
              "op", "as", "endpoint", "key", "request", "handler", "fingerprint", "max_wait_ms",
              "parallel", "expect"),
          "claim",
          Set.of("op", "as", "endpoint", "key", "request", "lease_ms", "save_as", "expect"),
          "complete",
          Set.of("op", "as", "endpoint", "key", "lease_from", "response", "expect"),
          "lookup",
          Set.of("op", "as", "endpoint", "key", "expect"),
          "sleep",
          Set.of("op", "ms"));
  private static final Map<String, Set<String>> EXPECT_FIELDS =
      Map.of(
          "execute",
          Set.of(
              "result", "status", "body", "headers", "http_status", "error_code", "attempt",
              "handler_calls", "results", "error"),
          "claim",
          Set.of("outcome", "attempt", "error"),
          "complete",
          Set.of("ok", "error"),
          "lookup",
          Set.of("state", "error"));
  private static final Set<String> RESULTS =
      Set.of("executed", "replayed", "mismatch", "pending", "in_progress", "handler_error");
  private static final Pattern KEY_PLACEHOLDER = Pattern.compile("\\{key:(\\d+)\\}");

  @TestFactory
  Stream<DynamicTest> scenarios(IdemdServer server) throws Exception {
    Map<String, Object> file =
        object(Json.read(RepoPaths.conformance().resolve("scenarios.json")), "scenarios.json");
    onlyFields(file, FILE_FIELDS, "scenarios.json");
    assertEquals(1, integer(file, "version"), "scenarios.json version");
    Map<String, String> credentials = new HashMap<>();
    object(file, "credentials").forEach((name, token) -> credentials.put(name, (String) token));
    List<Object> scenarios = array(file, "scenarios");
    assertFalse(scenarios.isEmpty(), "scenarios.json has no scenarios");
    return scenarios.stream()
        .map(s -> object(s, "scenario"))
        .map(
            scenario ->
                DynamicTest.dynamicTest(
                    string(scenario, "name"),
                    () -> new ScenarioRun(server, credentials, scenario).run()));
  }

  /** The runner refuses what it does not understand instead of skipping it. */
  @TestFactory
  Stream<DynamicTest> unknownStepsFailLoudly(IdemdServer server) {
    Map<String, String> credentials = Map.of("alice", "conformance-token-alice-3f9a");
    String execute =
        "{\"op\":\"execute\",\"as\":\"alice\",\"endpoint\":\"POST /v1/payments\","
            + "\"key\":\"{key:1}\",\"request\":{\"method\":\"POST\",\"path\":\"/v1/payments\","
            + "\"content_type\":\"application/json\",\"body\":\"{}\"},"
            + "\"handler\":%s,\"expect\":%s}";
    String respond = "{\"action\":\"respond\",\"status\":201,\"headers\":[],\"body\":\"ok\"}";
    // name -> {step, what the failure must say}
    Map<String, List<String>> broken =
        Map.of(
            "unknown op",
            List.of("{\"op\":\"frobnicate\",\"as\":\"alice\"}", "unknown op 'frobnicate'"),
            "unknown step field",
            List.of("{\"op\":\"sleep\",\"ms\":1,\"colour\":\"red\"}", "unknown sleep step field"),
            "unknown expect field",
            List.of(
                String.format(execute, respond, "{\"result\":\"executed\",\"colour\":\"red\"}"),
                "unknown execute expect field"),
            "unknown result",
            List.of(
                String.format(execute, respond, "{\"result\":\"teleported\"}"),
                "unknown result 'teleported'"),
            "unknown handler action",
            List.of(
                String.format(execute, "{\"action\":\"dance\"}", "{}"),
                "unknown handler action 'dance'"),
            "wrong expectation",
            List.of(
                String.format(execute, respond, "{\"result\":\"replayed\"}"),
                "result: expected replayed, got executed"));
    return broken.entrySet().stream()
        .map(
            e ->
                DynamicTest.dynamicTest(
                    e.getKey(),
                    () -> {
                      Map<String, Object> scenario =
                          object(
                              StrictJson.parse(
                                  "{\"name\":\"broken\",\"steps\":[" + e.getValue().get(0) + "]}"),
                              "scenario");
                      AssertionError error =
                          assertThrows(
                              AssertionError.class,
                              () -> new ScenarioRun(server, credentials, scenario).run());
                      assertTrue(
                          error.getMessage().contains(e.getValue().get(1)),
                          "expected '" + e.getValue().get(1) + "' in: " + error.getMessage());
                    }));
  }

  /** One run of one scenario. */
  private static final class ScenarioRun {
    private final IdemdServer server;
    private final Map<String, String> credentials;
    private final Map<String, Object> scenario;
    private final String prefix;
    private final Map<String, IdemdClient> clients = new HashMap<>();
    private final Map<String, Claimed> leases = new HashMap<>();

    ScenarioRun(IdemdServer server, Map<String, String> credentials, Map<String, Object> scenario) {
      this.server = server;
      this.credentials = credentials;
      this.scenario = scenario;
      byte[] random = new byte[6];
      new SecureRandom().nextBytes(random);
      this.prefix = HexFormat.of().formatHex(random);
    }

    void run() throws Exception {
      onlyFields(scenario, SCENARIO_FIELDS, "scenario");
      String name = string(scenario, "name");
      List<Object> steps = array(scenario, "steps");
      try {
        for (int i = 0; i < steps.size(); i++) {
          Map<String, Object> step = object(steps.get(i), "step");
          String op = string(step, "op");
          long started = System.nanoTime();
          try {
            runStep(op, step);
            System.out.printf(
                "%s: step %d (%s) passed in %d ms%n",
                name, i, op, (System.nanoTime() - started) / 1_000_000);
          } catch (AssertionError e) {
            throw new AssertionFailedError(
                "scenario '" + name + "' step " + i + " (" + op + "): " + e.getMessage()
                    + "\n-- idemd log tail --\n" + server.logTail(),
                e);
          }
        }
      } finally {
        clients.values().forEach(IdemdClient::close);
      }
    }

    private void runStep(String op, Map<String, Object> step) throws Exception {
      Set<String> fields = STEP_FIELDS.get(op);
      if (fields == null) {
        fail("unknown op '" + op + "' (known: " + STEP_FIELDS.keySet() + ")");
      }
      onlyFields(step, fields, op + " step");
      Map<String, Object> expect =
          step.containsKey("expect") ? object(step, "expect") : Map.of();
      if (EXPECT_FIELDS.containsKey(op)) {
        onlyFields(expect, EXPECT_FIELDS.get(op), op + " expect");
      }
      switch (op) {
        case "execute" -> execute(step, expect);
        case "claim" -> claim(step, expect);
        case "complete" -> complete(step, expect);
        case "lookup" -> lookup(step, expect);
        case "sleep" -> Thread.sleep(integer(step, "ms"));
        default -> fail("unknown op '" + op + "'");
      }
    }

    // -------------------------------------------------------------------------------------------
    // execute

    private void execute(Map<String, Object> step, Map<String, Object> expect) throws Exception {
      IdemdClient client = client(step);
      String endpoint = string(step, "endpoint");
      String key = key(step);
      HttpRequestSpec request = request(object(step, "request"));
      HandlerSpec handler = HandlerSpec.parse(object(step, "handler"));
      ExecuteOptions options = ExecuteOptions.defaults();
      if (step.containsKey("fingerprint")) {
        String mode = string(step, "fingerprint");
        options =
            switch (mode) {
              case "server" -> options.withFingerprint(ExecuteOptions.FingerprintMode.SERVER);
              case "local" -> options.withFingerprint(ExecuteOptions.FingerprintMode.LOCAL);
              default -> fail("unknown fingerprint mode '" + mode + "'");
            };
      }
      if (step.containsKey("max_wait_ms")) {
        options = options.withMaxWait(Duration.ofMillis(integer(step, "max_wait_ms")));
      }
      int parallel = step.containsKey("parallel") ? integer(step, "parallel") : 1;
      assertTrue(parallel >= 1, "parallel must be at least 1");
      if (expect.containsKey("results") && !step.containsKey("parallel")) {
        fail("expect.results needs 'parallel'");
      }

      AtomicInteger calls = new AtomicInteger();
      List<Throwable> thrownByHandler = Collections.synchronizedList(new ArrayList<>());
      Handler counted =
          execution -> {
            calls.incrementAndGet();
            return handler.invoke(thrownByHandler);
          };
      ExecuteOptions finalOptions = options;
      List<Outcome> outcomes = new ArrayList<>();
      if (parallel == 1) {
        outcomes.add(Outcome.of(() -> client.executeOnce(endpoint, key, request, counted, finalOptions)));
      } else {
        ExecutorService pool = Executors.newFixedThreadPool(parallel);
        try {
          CountDownLatch go = new CountDownLatch(1);
          List<Future<Outcome>> futures = new ArrayList<>();
          for (int i = 0; i < parallel; i++) {
            futures.add(
                pool.submit(
                    () -> {
                      go.await();
                      return Outcome.of(
                          () -> client.executeOnce(endpoint, key, request, counted, finalOptions));
                    }));
          }
          go.countDown();
          for (Future<Outcome> f : futures) {
            outcomes.add(f.get(60, java.util.concurrent.TimeUnit.SECONDS));
          }
        } finally {
          pool.shutdownNow();
        }
      }

      if (expect.containsKey("results")) {
        Map<String, Integer> expected = new TreeMap<>();
        object(expect, "results")
            .forEach(
                (result, count) -> {
                  if (!RESULTS.contains(result) && !result.equals("error")) {
                    fail("unknown result '" + result + "' in expect.results");
                  }
                  expected.put(result, integer(count, "results." + result));
                });
        expected.values().removeIf(c -> c == 0);
        Map<String, Integer> actual = new TreeMap<>();
        for (Outcome o : outcomes) {
          actual.merge(o.classify(), 1, Integer::sum);
        }
        if (!expected.equals(actual)) {
          fail("results: expected " + expected + ", got " + actual + describe(outcomes));
        }
      }
      for (Outcome outcome : outcomes) {
        checkOutcome(outcome, expect, handler, thrownByHandler);
      }
      if (expect.containsKey("handler_calls")) {
        assertEquals(integer(expect, "handler_calls"), calls.get(), "handler_calls");
      }
    }

    private void checkOutcome(
        Outcome outcome,
        Map<String, Object> expect,
        HandlerSpec handler,
        List<Throwable> thrownByHandler) {
      String actual = outcome.classify();
      if (expect.containsKey("result")) {
        String expected = string(expect, "result");
        if (!RESULTS.contains(expected)) {
          fail("unknown result '" + expected + "' (known: " + RESULTS + ")");
        }
        if (!expected.equals(actual)) {
          fail("result: expected " + expected + ", got " + outcome);
        }
      } else if (expect.containsKey("error")) {
        if (!actual.equals("error")) {
          fail("expected a gRPC error, got " + outcome);
        }
      } else if (!expect.containsKey("results") && !Set.of("executed", "replayed").contains(actual)) {
        fail("unexpected outcome " + outcome);
      }
      if (actual.equals("unexpected")) {
        fail("unexpected outcome " + outcome);
      }

      if (expect.containsKey("error")) {
        checkError(object(expect, "error"), outcome.error);
      }
      if (actual.equals("handler_error")) {
        HandlerException e = (HandlerException) outcome.error;
        assertTrue(
            thrownByHandler.stream().anyMatch(t -> t == e.getCause()),
            "the surfaced error must be the handler's own error, got " + e.getCause());
        assertEquals(handler.disposition(), e.disposition(), "Fail disposition");
        assertTrue(e.recorded(), "the Fail call must have succeeded");
      }
      for (String field : List.of("status", "body", "headers", "attempt")) {
        if (expect.containsKey(field) && outcome.result == null) {
          fail("expect." + field + " needs a response, got " + outcome);
        }
      }
      if (expect.containsKey("status")) {
        assertEquals(integer(expect, "status"), outcome.result.response().status(), "status");
      }
      if (expect.containsKey("body")) {
        assertEquals(string(expect, "body"), outcome.result.response().bodyText(), "body");
      }
      if (expect.containsKey("headers")) {
        assertEquals(headers(array(expect, "headers")), outcome.result.response().headers(), "headers");
      }
      if (expect.containsKey("attempt")) {
        assertEquals(integer(expect, "attempt"), outcome.result.attempt(), "attempt");
      }
      if (expect.containsKey("http_status") || expect.containsKey("error_code")) {
        if (!(outcome.error instanceof IdempotencyConflictException conflict)) {
          fail("expect.http_status/error_code need a mismatch, pending or in-progress error, got "
              + outcome);
          return;
        }
        if (expect.containsKey("http_status")) {
          assertEquals(integer(expect, "http_status"), conflict.httpStatus(), "http_status");
        }
        if (expect.containsKey("error_code")) {
          assertEquals(string(expect, "error_code"), conflict.errorCode(), "error_code");
        }
      }
    }

    // -------------------------------------------------------------------------------------------
    // raw steps

    private void claim(Map<String, Object> step, Map<String, Object> expect) {
      IdemdClient client = client(step);
      ClaimRequest.Builder request =
          ClaimRequest.newBuilder()
              .setEndpoint(string(step, "endpoint"))
              .setKey(key(step))
              .setRequest(requestProto(object(step, "request")));
      if (step.containsKey("lease_ms")) {
        Duration lease = Duration.ofMillis(integer(step, "lease_ms"));
        request.setLease(
            com.google.protobuf.Duration.newBuilder()
                .setSeconds(lease.getSeconds())
                .setNanos(lease.getNano()));
      }
      ClaimResponse response;
      try {
        response = client.claim(request.build());
      } catch (StatusRuntimeException e) {
        expectError(expect, e);
        return;
      }
      noErrorExpected(expect, "claim returned " + response.getOutcomeCase());
      String outcome =
          switch (response.getOutcomeCase()) {
            case CLAIMED -> "claimed";
            case REPLAYED -> "replayed";
            case IN_PROGRESS -> "in_progress";
            case MISMATCH -> "mismatch";
            case PENDING -> "pending";
            default -> fail("claim returned no outcome");
          };
      if (expect.containsKey("outcome")) {
        assertEquals(string(expect, "outcome"), outcome, "outcome");
      }
      if (expect.containsKey("attempt")) {
        assertEquals("claimed", outcome, "expect.attempt needs a claimed outcome");
        assertEquals(integer(expect, "attempt"), response.getClaimed().getAttempt(), "attempt");
      }
      if (step.containsKey("save_as")) {
        assertEquals("claimed", outcome, "save_as needs a claimed outcome");
        leases.put(string(step, "save_as"), response.getClaimed());
      }
    }

    private void complete(Map<String, Object> step, Map<String, Object> expect) {
      IdemdClient client = client(step);
      String from = string(step, "lease_from");
      Claimed lease = leases.get(from);
      if (lease == null) {
        fail("no saved lease '" + from + "'");
      }
      Map<String, Object> response = object(step, "response");
      onlyFields(response, Set.of("status", "headers", "body"), "response");
      StoredResponse.Builder stored =
          StoredResponse.newBuilder()
              .setStatus(integer(response, "status"))
              .setBody(ByteString.copyFromUtf8(string(response, "body")));
      for (HttpHeader h : headers(array(response, "headers"))) {
        stored.addHeaders(Header.newBuilder().setName(h.name()).setValue(h.value()));
      }
      try {
        client.complete(
            CompleteRequest.newBuilder()
                .setEndpoint(string(step, "endpoint"))
                .setKey(key(step))
                .setLeaseToken(lease.getLeaseToken())
                .setResponse(stored)
                .build());
      } catch (StatusRuntimeException e) {
        expectError(expect, e);
        return;
      }
      noErrorExpected(expect, "complete succeeded");
      if (expect.containsKey("ok")) {
        assertTrue(bool(expect, "ok"), "complete succeeded but expect.ok is false");
      }
    }

    private void lookup(Map<String, Object> step, Map<String, Object> expect) {
      IdemdClient client = client(step);
      LookupResponse response;
      try {
        response =
            client.lookup(
                LookupRequest.newBuilder()
                    .setEndpoint(string(step, "endpoint"))
                    .setKey(key(step))
                    .build());
      } catch (StatusRuntimeException e) {
        expectError(expect, e);
        return;
      }
      String state = response.getRecord().getState().name().replaceFirst("^STATE_", "");
      noErrorExpected(expect, "lookup returned state " + state);
      if (expect.containsKey("state")) {
        assertEquals(string(expect, "state"), state, "state");
      }
    }

    private void expectError(Map<String, Object> expect, StatusRuntimeException e) {
      if (!expect.containsKey("error")) {
        fail("unexpected error " + e.getStatus() + " " + IdemdErrors.reason(e).orElse(""));
      }
      checkError(object(expect, "error"), e);
    }

    private static void noErrorExpected(Map<String, Object> expect, String what) {
      if (expect.containsKey("error")) {
        fail("expected error " + expect.get("error") + ", but " + what);
      }
    }

    private static void checkError(Map<String, Object> expected, Throwable actual) {
      onlyFields(expected, Set.of("code", "reason"), "error");
      if (!(actual instanceof StatusRuntimeException e)) {
        fail("expected a gRPC error " + expected + ", got " + actual);
        return;
      }
      assertEquals(string(expected, "code"), e.getStatus().getCode().name(), "error code");
      if (expected.containsKey("reason")) {
        assertEquals(
            string(expected, "reason"), IdemdErrors.reason(e).orElse(null), "ErrorInfo reason");
      }
    }

    // -------------------------------------------------------------------------------------------
    // helpers

    private IdemdClient client(Map<String, Object> step) {
      String as = string(step, "as");
      String token = credentials.get(as);
      if (token == null) {
        fail("unknown credential '" + as + "'");
      }
      return clients.computeIfAbsent(
          as,
          k -> IdemdClient.builder(server.address()).plaintext().bearerToken(token).build());
    }

    private String key(Map<String, Object> step) {
      Matcher m = KEY_PLACEHOLDER.matcher(string(step, "key"));
      return m.replaceAll(r -> prefix + "-" + r.group(1));
    }

    private static HttpRequestSpec request(Map<String, Object> request) {
      onlyFields(request, Set.of("method", "path", "content_type", "body"), "request");
      return HttpRequestSpec.of(
          string(request, "method"),
          string(request, "path"),
          string(request, "content_type"),
          string(request, "body").getBytes(StandardCharsets.UTF_8));
    }

    private static HttpRequest requestProto(Map<String, Object> request) {
      HttpRequestSpec spec = request(request);
      return HttpRequest.newBuilder()
          .setMethod(spec.method())
          .setPath(spec.path())
          .setContentType(spec.contentType())
          .setBody(ByteString.copyFrom(spec.body()))
          .build();
    }

    private static String describe(List<Outcome> outcomes) {
      StringBuilder out = new StringBuilder();
      for (Outcome o : outcomes) {
        out.append("\n  ").append(o);
      }
      return out.toString();
    }
  }

  static List<HttpHeader> headers(List<Object> pairs) {
    List<HttpHeader> headers = new ArrayList<>();
    for (Object pair : pairs) {
      List<Object> nameValue = array(pair, "header");
      assertEquals(2, nameValue.size(), "a header is [name, value]");
      headers.add(new HttpHeader((String) nameValue.get(0), (String) nameValue.get(1)));
    }
    return headers;
  }

  /** What the runner's handler does when the executor calls it. */
  private record HandlerSpec(String action, HttpResponseSpec response, int delayMs) {
    static HandlerSpec parse(Map<String, Object> handler) {
      String action = string(handler, "action");
      switch (action) {
        case "respond" -> {
          onlyFields(handler, Set.of("action", "status", "headers", "body", "delay_ms"), "handler");
          HttpResponseSpec response =
              HttpResponseSpec.of(
                  integer(handler, "status"),
                  handler.containsKey("headers") ? headers(array(handler, "headers")) : List.of(),
                  string(handler, "body").getBytes(StandardCharsets.UTF_8));
          int delay = handler.containsKey("delay_ms") ? integer(handler, "delay_ms") : 0;
          return new HandlerSpec(action, response, delay);
        }
        case "error_before_side_effect", "error_ambiguous" -> {
          onlyFields(handler, Set.of("action"), "handler");
          return new HandlerSpec(action, null, 0);
        }
        default -> {
          return fail("unknown handler action '" + action + "'");
        }
      }
    }

    HttpResponseSpec invoke(List<Throwable> thrown) throws Exception {
      switch (action) {
        case "respond" -> {
          if (delayMs > 0) {
            Thread.sleep(delayMs);
          }
          return response;
        }
        case "error_before_side_effect" -> {
          NoSideEffectException e =
              new NoSideEffectException("conformance handler: refused before any side effect");
          thrown.add(e);
          throw e;
        }
        default -> {
          TimeoutException e =
              new TimeoutException("conformance handler: upstream timed out, outcome unknown");
          thrown.add(e);
          throw e;
        }
      }
    }

    Disposition disposition() {
      return action.equals("error_before_side_effect")
          ? Disposition.DISPOSITION_RELEASE
          : Disposition.DISPOSITION_UNKNOWN;
    }
  }

  /** How one execute ended. */
  private static final class Outcome {
    final ExecuteResult result;
    final Throwable error;

    private Outcome(ExecuteResult result, Throwable error) {
      this.result = result;
      this.error = error;
    }

    interface Call {
      ExecuteResult run();
    }

    static Outcome of(Call call) {
      try {
        return new Outcome(call.run(), null);
      } catch (RuntimeException e) {
        return new Outcome(null, e);
      }
    }

    String classify() {
      if (result != null) {
        return result.replayed() ? "replayed" : "executed";
      }
      if (error instanceof KeyReuseException) {
        return "mismatch";
      }
      if (error instanceof OutcomePendingException) {
        return "pending";
      }
      if (error instanceof InProgressException) {
        return "in_progress";
      }
      if (error instanceof HandlerException) {
        return "handler_error";
      }
      if (error instanceof StatusRuntimeException) {
        return "error";
      }
      return "unexpected";
    }

    @Override
    public String toString() {
      if (result != null) {
        return classify() + " " + result;
      }
      java.io.StringWriter trace = new java.io.StringWriter();
      error.printStackTrace(new java.io.PrintWriter(trace));
      return classify() + " " + trace;
    }
  }
}
