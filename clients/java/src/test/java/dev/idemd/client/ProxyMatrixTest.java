package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.Nginx;
import dev.idemd.client.testing.RepoPaths;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.CompleteRequest;
import dev.idemd.v1.HttpRequest;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.Record;
import dev.idemd.v1.StoredResponse;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.IntConsumer;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The proxy matrix (clients/conformance/proxy-matrix.md, issue 51): the SDK's default transport,
 * grpc-java on Netty, calling idemd through a real nginx (scripts/nginx.sh) in every profile,
 * executor and raw runs, every key checked afterwards by a direct Lookup. Tagged so that pom.xml
 * runs it in a Surefire execution of its own with its output on the console (the {@code
 * proxy-matrix:} lines).
 */
@Tag("proxy-matrix")
class ProxyMatrixTest {
  static final String ENDPOINT = "POST /v1/proxy-matrix";
  static final Duration LEASE = Duration.ofSeconds(10);
  static final long RUN_LIMIT_SECONDS = 120;
  static final int IN_FLIGHT = 32;
  static final String TRANSPORT = "grpc-java-netty";
  static final String TOKEN = "conformance-token-alice-3f9a";
  static final List<String> PROFILES = List.of("h2c", "tls", "goaway", "streams4", "idle1s");
  static final HttpRequestSpec REQUEST =
      HttpRequestSpec.json("POST", "/v1/proxy-matrix", "{\"matrix\":true}");

  static byte[] body(String key) {
    return ("{\"key\":\"" + key + "\"}").getBytes(StandardCharsets.UTF_8);
  }

  /** Direct Lookup: "ABSENT" for NOT_FOUND, else the state without "STATE_" and the stored body. */
  record Looked(String state, byte[] body) {}

  interface Lookup {
    Looked lookup(String key);
  }

  static Lookup direct(IdemdClient client) {
    return key -> {
      try {
        Record r =
            client
                .lookup(
                    LookupRequest.newBuilder()
                        .setEndpoint(ENDPOINT)
                        .setKey(key)
                        .setIncludeResponse(true)
                        .build())
                .getRecord();
        return new Looked(
            r.getState().name().replace("STATE_", ""), r.getResponse().getBody().toByteArray());
      } catch (StatusRuntimeException e) {
        if (e.getStatus().getCode() == Status.Code.NOT_FOUND) {
          return new Looked("ABSENT", new byte[0]);
        }
        throw e;
      }
    };
  }

  /** One executeOnce of an executor run. */
  record ExecOutcome(String key, Throwable error, boolean hung, boolean replayed, byte[] body) {}

  /** One key of a raw run: {@code stage} is null, "claim" or "complete" (the call that failed). */
  record RawOutcome(String key, String stage, StatusRuntimeException error) {}

  /** The result of a check: errors, errors on requests idemd received (raw), violations. */
  record Checked(int errors, int received, List<String> violations) {}

  /**
   * An executor run held to proxy-matrix.md: no error, no hang, the handler called exactly once per
   * key ({@code calls} counts the replays' first run), every key COMPLETED with the handler's
   * response.
   */
  static Checked checkExecutor(
      List<ExecOutcome> outcomes, Map<String, Integer> calls, boolean replays, Lookup lookup) {
    int errors = 0;
    List<String> violations = new ArrayList<>();
    for (ExecOutcome o : outcomes) {
      byte[] want = body(o.key());
      if (o.hung()) {
        errors++;
        violations.add(o.key() + ": hung past the run's deadline");
      } else if (o.error() != null) {
        errors++;
        violations.add(o.key() + ": " + o.error());
      } else if (o.replayed() != replays) {
        violations.add(o.key() + ": replayed " + o.replayed() + ", want " + replays);
      } else if (!java.util.Arrays.equals(o.body(), want)) {
        violations.add(o.key() + ": wrong response");
      }
      int n = calls.getOrDefault(o.key(), 0);
      if (n != 1) {
        violations.add(o.key() + ": handler called " + n + " times");
      }
      Looked l = lookup.lookup(o.key());
      if (!l.state().equals("COMPLETED")) {
        violations.add(o.key() + ": left " + l.state());
      } else if (!java.util.Arrays.equals(l.body(), want)) {
        violations.add(o.key() + ": stored a different response");
      }
    }
    return new Checked(errors, 0, violations);
  }

  /**
   * A raw run held to proxy-matrix.md: an error on a request idemd never received (a failed Claim
   * whose key is absent, a failed Complete whose key is still IN_PROGRESS) is a violation, and so
   * is an error on one it received other than UNAVAILABLE / DEADLINE_EXCEEDED; a key without error
   * must be COMPLETED.
   */
  static Checked checkRaw(List<RawOutcome> outcomes, Lookup lookup) {
    int errors = 0;
    int received = 0;
    List<String> violations = new ArrayList<>();
    for (RawOutcome o : outcomes) {
      Looked l = lookup.lookup(o.key());
      if (o.stage() == null) {
        if (!l.state().equals("COMPLETED") || !java.util.Arrays.equals(l.body(), body(o.key()))) {
          violations.add(o.key() + ": completed without error but " + l.state());
        }
        continue;
      }
      errors++;
      Status.Code code = o.error().getStatus().getCode();
      boolean neverReceived =
          (o.stage().equals("claim") && l.state().equals("ABSENT"))
              || (o.stage().equals("complete") && l.state().equals("IN_PROGRESS"));
      if (neverReceived) {
        violations.add(o.key() + ": " + o.stage() + " failed (" + o.error().getStatus()
            + ") although idemd never received it (key " + l.state() + ")");
      } else if (code != Status.Code.UNAVAILABLE && code != Status.Code.DEADLINE_EXCEEDED) {
        violations.add(o.key() + ": " + o.stage() + " failed with " + code + " (key " + l.state() + ")");
      } else {
        received++;
      }
    }
    return new Checked(errors, received, violations);
  }

  static List<String> keys(String run, int n) {
    String prefix = "pm-java-" + UUID.randomUUID().toString().substring(0, 8) + "-" + run + "-";
    List<String> keys = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      keys.add(prefix + i);
    }
    return keys;
  }

  interface KeyCall<T> {
    T call(String key);
  }

  /**
   * Runs {@code call} for every key with at most {@code inFlight} at once (a {@code pause} before
   * each is handed out); a call not done within the run's limit gives null (a hang).
   */
  static <T> List<T> forEach(List<String> keys, int inFlight, IntConsumer pause, KeyCall<T> call)
      throws InterruptedException {
    ExecutorService pool = Executors.newFixedThreadPool(inFlight);
    try {
      List<Future<T>> futures = new ArrayList<>();
      for (int i = 0; i < keys.size(); i++) {
        if (pause != null) {
          pause.accept(i);
        }
        String key = keys.get(i);
        if (inFlight == 1) {
          // Sequential: one after the other, so that a pause separates two calls.
          Future<T> f = pool.submit(() -> call.call(key));
          try {
            f.get(RUN_LIMIT_SECONDS, TimeUnit.SECONDS);
          } catch (Exception ignored) {
            // judged below
          }
          futures.add(f);
        } else {
          futures.add(pool.submit(() -> call.call(key)));
        }
      }
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(RUN_LIMIT_SECONDS);
      List<T> out = new ArrayList<>();
      for (Future<T> f : futures) {
        try {
          out.add(f.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS));
        } catch (java.util.concurrent.TimeoutException e) {
          out.add(null);
        } catch (java.util.concurrent.ExecutionException e) {
          throw new IllegalStateException(e.getCause());
        }
      }
      return out;
    } finally {
      pool.shutdownNow();
    }
  }

  static String line(String profile, String run, int calls, Checked c, long startNanos, String extra) {
    return String.format(
        java.util.Locale.ROOT,
        "proxy-matrix: java %s %s %s: %d calls, %d errors, %d violations, %.1f s (%s)",
        TRANSPORT, profile, run, calls, c.errors(), c.violations().size(),
        (System.nanoTime() - startNanos) / 1e9, extra);
  }

  /** The runs of one profile. */
  static final class Runner {
    final String profile;
    final IdemdClient proxied;
    final Lookup lookup;
    final Nginx nginx;
    final IntConsumer pause;
    final List<String> failures = new ArrayList<>();

    Runner(String profile, IdemdClient proxied, Lookup lookup, Nginx nginx, IntConsumer pause) {
      this.profile = profile;
      this.proxied = proxied;
      this.lookup = lookup;
      this.nginx = nginx;
      this.pause = pause;
    }

    void executor(String run, List<String> keys, int inFlight, boolean replays) throws Exception {
      Map<String, AtomicInteger> calls = new ConcurrentHashMap<>();
      Handler handler =
          execution -> {
            calls.computeIfAbsent(execution.key(), k -> new AtomicInteger()).incrementAndGet();
            return HttpResponseSpec.of(201, List.of(), body(execution.key()));
          };
      ExecuteOptions options = ExecuteOptions.defaults().withLease(LEASE);
      long start = System.nanoTime();
      List<ExecOutcome> results =
          forEach(keys, inFlight, pause, key -> {
            try {
              ExecuteResult r = proxied.executeOnce(ENDPOINT, key, REQUEST, handler, options);
              return new ExecOutcome(key, null, false, r.replayed(), r.response().body());
            } catch (RuntimeException e) {
              return new ExecOutcome(key, e, false, false, null);
            }
          });
      long took = System.nanoTime();
      List<ExecOutcome> outcomes = new ArrayList<>();
      Map<String, Integer> counted = new java.util.HashMap<>();
      for (int i = 0; i < keys.size(); i++) {
        ExecOutcome o = results.get(i);
        outcomes.add(o != null ? o : new ExecOutcome(keys.get(i), null, true, false, null));
        AtomicInteger n = calls.get(keys.get(i));
        counted.put(keys.get(i), (n == null ? 0 : n.get()) + (replays ? 1 : 0));
      }
      Checked c = checkExecutor(outcomes, counted, replays, lookup);
      report(run, keys.size(), c, start, took, nginx.stats());
    }

    void raw(List<String> keys) throws Exception {
      long start = System.nanoTime();
      List<RawOutcome> outcomes = rawCalls(proxied, keys, pause);
      long took = System.nanoTime();
      Checked c = checkRaw(outcomes, lookup);
      report("raw", keys.size(), c, start, took,
          c.received() + " errors on requests idemd received, " + nginx.stats());
    }

    private void report(String run, int n, Checked c, long start, long took, String extra) {
      System.out.println(line(profile, run, n, c, start + (System.nanoTime() - took), extra));
      for (String v : c.violations().subList(0, Math.min(20, c.violations().size()))) {
        failures.add(profile + " " + run + ": " + v);
      }
      if (c.violations().size() > 20) {
        failures.add(profile + " " + run + ": ... and " + (c.violations().size() - 20) + " more");
      }
    }
  }

  /** A raw run's calls: Claim then Complete per key, 32 keys in flight, no retry. */
  static List<RawOutcome> rawCalls(IdemdClient client, List<String> keys, IntConsumer pause)
      throws InterruptedException {
    HttpRequest request =
        HttpRequest.newBuilder()
            .setMethod("POST")
            .setPath("/v1/proxy-matrix")
            .setContentType("application/json")
            .setBody(com.google.protobuf.ByteString.copyFromUtf8("{\"matrix\":true}"))
            .build();
    List<RawOutcome> results =
        forEach(keys, IN_FLIGHT, pause, key -> {
          ClaimResponse claim;
          try {
            claim =
                client.claim(
                    ClaimRequest.newBuilder()
                        .setEndpoint(ENDPOINT)
                        .setKey(key)
                        .setAttemptId("raw-" + Integer.toHexString(key.hashCode()))
                        .setLease(ExecuteEngine.toProto(LEASE))
                        .setRequest(request)
                        .build());
          } catch (StatusRuntimeException e) {
            return new RawOutcome(key, "claim", e);
          }
          if (!claim.hasClaimed()) {
            return new RawOutcome(key, "claim",
                Status.INTERNAL.withDescription("not claimed: " + claim).asRuntimeException());
          }
          try {
            client.complete(
                CompleteRequest.newBuilder()
                    .setEndpoint(ENDPOINT)
                    .setKey(key)
                    .setLeaseToken(claim.getClaimed().getLeaseToken())
                    .setResponse(
                        StoredResponse.newBuilder()
                            .setStatus(201)
                            .setBody(com.google.protobuf.ByteString.copyFrom(body(key))))
                    .build());
          } catch (StatusRuntimeException e) {
            return new RawOutcome(key, "complete", e);
          }
          return new RawOutcome(key, null, null);
        });
    List<RawOutcome> outcomes = new ArrayList<>();
    for (int i = 0; i < keys.size(); i++) {
      RawOutcome o = results.get(i);
      outcomes.add(o != null ? o : new RawOutcome(keys.get(i), "claim",
          Status.DEADLINE_EXCEEDED.withDescription("hung").asRuntimeException()));
    }
    return outcomes;
  }

  @Test
  void matrix() throws Exception {
    Path certs = RepoPaths.testCerts();
    List<String> failures = new ArrayList<>();
    try (IdemdServer server = IdemdServer.startConformance();
        IdemdClient direct =
            IdemdClient.builder(server.address()).bearerToken(TOKEN).plaintext().build()) {
      Lookup lookup = direct(direct);
      for (String profile : PROFILES) {
        try (Nginx nginx = Nginx.start(server.address(), profile, certs)) {
          IdemdClient.Builder builder;
          if (profile.equals("tls") || profile.equals("goaway")) {
            // server.crt names localhost.
            builder = IdemdClient.builder("localhost:" + nginx.port())
                .tlsCaFile(certs.resolve("ca.pem"));
          } else {
            builder = IdemdClient.builder(nginx.address()).plaintext();
          }
          // Every 50th call of idle1s waits about as long as nginx keeps an idle connection
          // (it closes one idle for 1.00 s): 980 to 1,120 ms, so that calls land on either side
          // of the close, and some race it.
          IntConsumer pause = !profile.equals("idle1s") ? null : i -> {
            if (i > 0 && i % 50 == 0) {
              try {
                Thread.sleep(980 + ((i / 50) % 8) * 20);
              } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
              }
            }
          };
          try (IdemdClient proxied = builder.bearerToken(TOKEN).build()) {
            Runner r = new Runner(profile, proxied, lookup, nginx, pause);
            List<String> sequential = keys("seq", 300);
            r.executor("executor-sequential", sequential, 1, false);
            r.executor("executor-concurrent", keys("conc", 600), IN_FLIGHT, false);
            r.executor("replays", sequential.subList(0, 100), 1, true);
            r.raw(keys("raw", 300));
            if (profile.equals("h2c")) {
              r.executor("executor-300-in-flight", keys("300", 300), 300, false);
            }
            failures.addAll(r.failures);
          }
        }
      }
    }
    assertTrue(failures.isEmpty(), String.join("\n", failures));
  }

  /**
   * The negative control: a transport that surfaces an error for a request it never sent (as one
   * that turns a GOAWAY into an error does) must be caught by the raw run's check, and an executor
   * run with an error, a double or a key left behind by the executor's check.
   */
  @Test
  void checkFailsOnALostRequest() throws Exception {
    try (IdemdServer server = IdemdServer.startConformance();
        IdemdClient direct =
            IdemdClient.builder(server.address()).bearerToken(TOKEN).plaintext().build()) {
      AtomicInteger claims = new AtomicInteger();
      AtomicInteger completes = new AtomicInteger();
      AtomicInteger lost = new AtomicInteger();
      ClientInterceptor dropping =
          new ClientInterceptor() {
            @Override
            public <Q, A> ClientCall<Q, A> interceptCall(
                MethodDescriptor<Q, A> method, CallOptions options, Channel next) {
              String name = method.getBareMethodName();
              boolean drop =
                  ("Claim".equals(name) && claims.incrementAndGet() % 7 == 0)
                      || ("Complete".equals(name) && completes.incrementAndGet() % 11 == 0);
              if (!drop) {
                return next.newCall(method, options);
              }
              lost.incrementAndGet();
              return new ClientCall<>() {
                @Override
                public void start(Listener<A> listener, Metadata headers) {
                  listener.onClose(
                      Status.UNAVAILABLE.withDescription(
                          "synthetic: GOAWAY before the call was taken"),
                      new Metadata());
                }

                @Override
                public void request(int n) {}

                @Override
                public void cancel(String message, Throwable cause) {}

                @Override
                public void halfClose() {}

                @Override
                public void sendMessage(Q message) {}
              };
            }
          };
      ManagedChannel channel =
          Grpc.newChannelBuilder(server.address(), InsecureChannelCredentials.create()).build();
      try (IdemdClient broken =
          IdemdClient.builder(ClientInterceptors.intercept(channel, dropping))
              .bearerToken(TOKEN)
              .build()) {
        Lookup lookup = direct(direct);
        Checked c = checkRaw(rawCalls(broken, keys("neg", 100), null), lookup);
        assertTrue(lost.get() > 0);
        assertEquals(lost.get(), c.errors(), c.violations().toString());
        assertEquals(lost.get(), c.violations().size(), c.violations().toString());
        assertEquals(0, c.received());
        Checked clean = checkRaw(rawCalls(direct, keys("pos", 50), null), lookup);
        assertEquals(0, clean.errors() + clean.violations().size(), clean.violations().toString());

        List<String> k = keys("negx", 3);
        for (String key : k.subList(0, 2)) {
          direct.executeOnce(ENDPOINT, key, REQUEST,
              e -> HttpResponseSpec.of(201, List.of(), body(e.key())));
        }
        Checked x =
            checkExecutor(
                List.of(
                    new ExecOutcome(k.get(0), null, false, false, body(k.get(0))),
                    new ExecOutcome(k.get(1), null, false, false, body(k.get(1))),
                    new ExecOutcome(k.get(2), new RuntimeException("synthetic"), false, false, null)),
                Map.of(k.get(0), 1, k.get(1), 2), // a double on key 1; key 2 never ran
                false,
                lookup);
        // The error, the double, key 2 called 0 times and ABSENT.
        assertEquals(1, x.errors(), x.violations().toString());
        assertEquals(4, x.violations().size(), x.violations().toString());
      } finally {
        channel.shutdownNow();
      }
    }
  }
}
