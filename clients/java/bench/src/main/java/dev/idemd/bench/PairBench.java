package dev.idemd.bench;

import dev.idemd.client.HttpRequestSpec;
import dev.idemd.client.HttpResponseSpec;
import dev.idemd.client.IdemdClient;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.CompleteRequest;
import dev.idemd.v1.HttpRequest;
import dev.idemd.v1.StoredResponse;
import com.google.protobuf.ByteString;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.UUID;

/**
 * What the SDK itself costs per fresh key, without HTTP: a raw Claim + Complete pair (the client's
 * raw RPCs, as executeOnce makes them), and {@code executeOnce} with a handler that does nothing,
 * one at a time against the same idemd as the bench app. The difference between the app's
 * fresh-key time with and without the filter, less these, is the filter's own, when this runs
 * where the app runs (README.md: on idemd's core, as middleware.sh places the app).
 *
 * <pre>{@code
 * PairBench --idemd HOST:PORT [--requests N]
 * }</pre>
 */
public final class PairBench {
  private PairBench() {}

  public static void main(String[] args) {
    String idemd = null;
    int requests = 2000;
    for (int i = 0; i + 1 < args.length; i += 2) {
      switch (args[i]) {
        case "--idemd" -> idemd = args[i + 1];
        case "--requests" -> requests = Integer.parseInt(args[i + 1]);
        default -> throw new IllegalArgumentException("unexpected argument " + args[i]);
      }
    }
    if (idemd == null) {
      throw new IllegalArgumentException("usage: PairBench --idemd HOST:PORT [--requests N]");
    }
    byte[] body = "{\"amount\":100}".getBytes(StandardCharsets.UTF_8);
    String prefix = UUID.randomUUID().toString().replace("-", "");
    try (IdemdClient client = BenchApp.client(idemd)) {
      for (int round = 0; round < 2; round++) {
        // The first round warms the JIT up; the second is reported.
        String tag = prefix + "-" + round;
        double[] pair = new double[requests];
        double[] execute = new double[requests];
        for (int i = 0; i < requests; i++) {
          long started = System.nanoTime();
          ClaimResponse claimed = client.claim(ClaimRequest.newBuilder()
              .setEndpoint("POST /pay")
              .setKey(tag + "-pair-" + i)
              .setAttemptId(tag + "-" + i)
              .setRequest(HttpRequest.newBuilder().setMethod("POST").setPath("/pay")
                  .setContentType("application/json").setBody(ByteString.copyFrom(body)))
              .build());
          client.complete(CompleteRequest.newBuilder()
              .setEndpoint("POST /pay")
              .setKey(tag + "-pair-" + i)
              .setLeaseToken(claimed.getClaimed().getLeaseToken())
              .setResponse(StoredResponse.newBuilder().setStatus(201)
                  .setBody(ByteString.copyFrom(BenchApp.answer(i).getBytes(StandardCharsets.UTF_8))))
              .build());
          pair[i] = (System.nanoTime() - started) / 1e6;
        }
        HttpRequestSpec spec = new HttpRequestSpec("POST", "/pay", "application/json", body, List.of());
        for (int i = 0; i < requests; i++) {
          long started = System.nanoTime();
          int n = i;
          client.executeOnce("POST /pay", tag + "-execute-" + i, spec,
              execution -> HttpResponseSpec.of(201, List.of(),
                  BenchApp.answer(n).getBytes(StandardCharsets.UTF_8)));
          execute[i] = (System.nanoTime() - started) / 1e6;
        }
        if (round == 1) {
          System.out.printf("Claim+Complete pair: %s%nexecuteOnce (empty handler): %s%n",
              summary(pair), summary(execute));
        }
      }
    }
  }

  static String summary(double[] samples) {
    double[] sorted = samples.clone();
    Arrays.sort(sorted);
    return String.format("n=%d p50 %.3f ms p99 %.3f ms", sorted.length,
        sorted[sorted.length / 2], sorted[(int) (sorted.length * 0.99)]);
  }
}
