package dev.idemd.examples.payments;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import dev.idemd.client.CompleteFailedException;
import dev.idemd.client.ExecuteOptions;
import dev.idemd.client.ExecuteResult;
import dev.idemd.client.HandlerException;
import dev.idemd.client.HttpHeader;
import dev.idemd.client.HttpRequestSpec;
import dev.idemd.client.HttpResponseSpec;
import dev.idemd.client.IdemdClient;
import dev.idemd.client.InProgressException;
import dev.idemd.client.KeyReuseException;
import dev.idemd.client.OutcomePendingException;
import dev.idemd.client.json.JsonException;
import dev.idemd.client.json.JsonNumber;
import dev.idemd.client.json.StrictJson;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;

/**
 * Example: {@code POST /v1/payments} made safe to retry with idemd, on the JDK's HTTP server.
 *
 * <ul>
 *   <li>{@code Idempotency-Key} missing or malformed: 400 {@code idempotency_key_missing} / {@code
 *       idempotency_key_invalid};
 *   <li>the charge runs through {@link IdemdClient#executeOnce}, at most once per key;
 *   <li>a retry gets the stored response with {@code Idempotent-Replayed: true};
 *   <li>in flight: 409 {@code request_in_progress} with {@code Retry-After}; undecided: 409 {@code
 *       outcome_pending}; the key reused with another body: 422 {@code idempotency_key_reuse}.
 * </ul>
 *
 * <p>Run it: {@code IDEMD_TARGET=localhost:50051 IDEMD_TOKEN=... java ... PaymentsServer 8080}.
 */
public final class PaymentsServer implements AutoCloseable {
  /** The logical endpoint the key is scoped to. */
  public static final String ENDPOINT = "POST /v1/payments";

  private static final Pattern KEY = Pattern.compile("[A-Za-z0-9_-]{1,255}");
  private static final int MAX_BODY_BYTES = 64 * 1024;
  /** Hop-by-hop and framing headers are the server's business, never replayed. */
  private static final Set<String> NOT_REPLAYED =
      Set.of("content-length", "transfer-encoding", "connection", "date");

  private final HttpServer server;
  private final ExecutorService executor;
  private final IdemdClient idemd;
  private final PaymentProvider provider;
  private final ExecuteOptions options;

  /** Binds the server (port 0 picks a free port); call {@link #start()} to serve. */
  public PaymentsServer(InetSocketAddress address, IdemdClient idemd, PaymentProvider provider)
      throws IOException {
    this(address, idemd, provider, ExecuteOptions.defaults());
  }

  /** As above, with executor options (e.g. how long a retry waits for an in-flight original). */
  public PaymentsServer(
      InetSocketAddress address, IdemdClient idemd, PaymentProvider provider, ExecuteOptions options)
      throws IOException {
    this.idemd = idemd;
    this.provider = provider;
    this.options = options;
    this.server = HttpServer.create(address, 0);
    this.executor = Executors.newFixedThreadPool(16);
    server.setExecutor(executor);
    server.createContext("/v1/payments", this::handle);
  }

  /** Starts serving. */
  public PaymentsServer start() {
    server.start();
    return this;
  }

  /** The bound address. */
  public InetSocketAddress address() {
    return server.getAddress();
  }

  @Override
  public void close() {
    server.stop(0);
    executor.shutdown();
    try {
      executor.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private void handle(HttpExchange exchange) throws IOException {
    try (exchange) {
      if (!exchange.getRequestURI().getPath().equals("/v1/payments")) {
        sendError(exchange, 404, "not_found");
        return;
      }
      if (!exchange.getRequestMethod().equals("POST")) {
        exchange.getResponseHeaders().add("Allow", "POST");
        sendError(exchange, 405, "method_not_allowed");
        return;
      }
      // HttpExchange headers are case-insensitive.
      String key = exchange.getRequestHeaders().getFirst("Idempotency-Key");
      if (key == null) {
        sendError(exchange, 400, "idempotency_key_missing");
        return;
      }
      if (!KEY.matcher(key).matches()) {
        sendError(exchange, 400, "idempotency_key_invalid");
        return;
      }
      byte[] body = readBody(exchange);
      if (body == null) {
        sendError(exchange, 413, "request_too_large");
        return;
      }
      PaymentRequest payment = PaymentRequest.parse(body);
      if (payment == null) {
        // Refused before anything happened: no idempotent result is stored.
        sendError(exchange, 400, "invalid_request");
        return;
      }
      String contentType = exchange.getRequestHeaders().getFirst("Content-Type");
      HttpRequestSpec request =
          HttpRequestSpec.of(
              "POST",
              "/v1/payments",
              contentType == null ? "application/json" : contentType,
              body);
      try {
        ExecuteResult result =
            idemd.executeOnce(
                ENDPOINT,
                key,
                request,
                execution -> {
                  PaymentProvider.Charge charge =
                      provider.charge(
                          execution.downstreamKey("charge"),
                          payment.amount(),
                          payment.currency(),
                          payment.customer());
                  return HttpResponseSpec.json(201, chargeJson(charge));
                },
                options);
        send(exchange, result.response(), result.replayed());
      } catch (InProgressException e) {
        long seconds = Math.max(1, ceilSeconds(e.retryAfter()));
        exchange.getResponseHeaders().add("Retry-After", Long.toString(seconds));
        sendError(exchange, e.httpStatus(), e.errorCode());
      } catch (OutcomePendingException | KeyReuseException e) {
        sendError(exchange, e.httpStatus(), e.errorCode());
      } catch (CompleteFailedException e) {
        // The charge happened; answer it even though idemd could not store it.
        send(exchange, e.response(), false);
      } catch (HandlerException e) {
        sendError(exchange, 502, "payment_provider_error");
      } catch (StatusRuntimeException e) {
        if (e.getStatus().getCode() == Status.Code.INVALID_ARGUMENT) {
          sendError(exchange, 400, "invalid_request");
        } else {
          exchange.getResponseHeaders().add("Retry-After", "1");
          sendError(exchange, 503, "idempotency_unavailable");
        }
      } catch (RuntimeException e) {
        sendError(exchange, 500, "internal_error");
      }
    }
  }

  private static long ceilSeconds(Duration d) {
    return d.getSeconds() + (d.getNano() > 0 ? 1 : 0);
  }

  private static String chargeJson(PaymentProvider.Charge charge) {
    return "{\"id\":" + quote(charge.id()) + ",\"amount\":" + charge.amount()
        + ",\"currency\":" + quote(charge.currency()) + ",\"customer\":" + quote(charge.customer())
        + ",\"status\":\"succeeded\"}";
  }

  private static String quote(String s) {
    return new String(StrictJson.canonicalize(s), StandardCharsets.UTF_8);
  }

  private static void send(HttpExchange exchange, HttpResponseSpec response, boolean replayed)
      throws IOException {
    for (HttpHeader header : response.headers()) {
      if (!NOT_REPLAYED.contains(header.name().toLowerCase(java.util.Locale.ROOT))) {
        exchange.getResponseHeaders().add(header.name(), header.value());
      }
    }
    if (replayed) {
      exchange.getResponseHeaders().add("Idempotent-Replayed", "true");
    }
    byte[] body = response.body();
    exchange.sendResponseHeaders(response.status(), body.length == 0 ? -1 : body.length);
    if (body.length > 0) {
      exchange.getResponseBody().write(body);
    }
  }

  private static void sendError(HttpExchange exchange, int status, String code)
      throws IOException {
    send(exchange, HttpResponseSpec.json(status, "{\"error\":" + quote(code) + "}"), false);
  }

  private static byte[] readBody(HttpExchange exchange) throws IOException {
    try (InputStream in = exchange.getRequestBody()) {
      byte[] body = in.readNBytes(MAX_BODY_BYTES + 1);
      return body.length > MAX_BODY_BYTES ? null : body;
    }
  }

  /** The fields of a payment request; null when the body is not a valid one. */
  private record PaymentRequest(long amount, String currency, String customer) {
    static PaymentRequest parse(byte[] body) {
      try {
        if (!(StrictJson.parse(body) instanceof Map<?, ?> fields)
            || !(fields.get("amount") instanceof JsonNumber amount)
            || !(fields.get("currency") instanceof String currency)
            || !(fields.get("customer") instanceof String customer)) {
          return null;
        }
        long cents = amount.longValueExact();
        return cents > 0 ? new PaymentRequest(cents, currency, customer) : null;
      } catch (JsonException | ArithmeticException e) {
        return null;
      }
    }
  }

  /** Serves the example on the port given as the first argument (default 8080). */
  public static void main(String[] args) throws Exception {
    String target = System.getenv().getOrDefault("IDEMD_TARGET", "localhost:50051");
    String token = System.getenv("IDEMD_TOKEN");
    IdemdClient.Builder builder = IdemdClient.builder(target);
    if (System.getenv("IDEMD_PLAINTEXT") != null) {
      builder.plaintext();
    }
    if (token != null) {
      builder.bearerToken(token);
    }
    int port = args.length > 0 ? Integer.parseInt(args[0]) : 8080;
    IdemdClient idemd = builder.build();
    PaymentsServer server =
        new PaymentsServer(new InetSocketAddress(port), idemd, new InMemoryPaymentProvider())
            .start();
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  server.close();
                  idemd.close();
                }));
    System.out.println("payments example listening on " + server.address());
  }
}
