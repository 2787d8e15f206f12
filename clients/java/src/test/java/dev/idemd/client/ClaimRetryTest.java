package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.IdempotencyGrpc;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * Transport retries of Claim, against the real server: a client-side interceptor lets the first
 * Claim reach idemd and then loses its response (the caller sees UNAVAILABLE), as a dropped
 * connection would.
 */
@ExtendWith(LiveIdemd.class)
class ClaimRetryTest {
  private static final String TOKEN = "conformance-token-alice-3f9a";
  private static final HttpRequestSpec REQUEST =
      HttpRequestSpec.json("POST", "/v1/payments", "{\"amount\":4200}");

  private ManagedChannel channel;
  private ClaimTap tap;
  private IdemdClient client;

  @BeforeEach
  void connect(IdemdServer server) {
    channel = Grpc.newChannelBuilder(server.address(), InsecureChannelCredentials.create()).build();
    tap = new ClaimTap();
    client =
        IdemdClient.builder(ClientInterceptors.intercept(channel, tap)).bearerToken(TOKEN).build();
  }

  @AfterEach
  void close() throws InterruptedException {
    client.close();
    channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
  }

  @Test
  void lostClaimResponseIsRetriedWithTheSameAttemptId() {
    tap.responsesToLose.set(1);
    AtomicInteger calls = new AtomicInteger();
    ExecuteResult result =
        client.executeOnce(
            "POST /v1/payments",
            UUID.randomUUID().toString(),
            REQUEST,
            e -> {
              calls.incrementAndGet();
              return HttpResponseSpec.json(201, "{\"id\":\"pay_retry\"}");
            });
    assertFalse(result.replayed());
    assertEquals(1, result.attempt());
    assertEquals(1, calls.get());

    assertEquals(2, tap.requests.size(), "one lost Claim, one retry");
    String attemptId = tap.requests.get(0).getAttemptId();
    assertFalse(attemptId.isEmpty());
    assertEquals(attemptId, tap.requests.get(1).getAttemptId(), "the retry reuses the attempt id");
    // The server answered both with the same lease: the retry did not end up "in progress".
    assertEquals(2, tap.responses.size());
    assertEquals(ClaimResponse.OutcomeCase.CLAIMED, tap.responses.get(1).getOutcomeCase());
    assertEquals(
        tap.responses.get(0).getClaimed().getLeaseToken(),
        tap.responses.get(1).getClaimed().getLeaseToken());
  }

  @Test
  void everyExecuteHasItsOwnAttemptId() {
    String key = UUID.randomUUID().toString();
    client.executeOnce("POST /v1/payments", key, REQUEST, e -> HttpResponseSpec.json(201, "{}"));
    client.executeOnce("POST /v1/payments", key, REQUEST, e -> HttpResponseSpec.json(201, "{}"));
    assertEquals(2, tap.requests.size());
    assertFalse(
        tap.requests.get(0).getAttemptId().equals(tap.requests.get(1).getAttemptId()),
        "attempt ids are random per execute");
  }

  @Test
  void refusedClaimsAreNotRetried() {
    StatusRuntimeException invalid =
        assertThrows(
            StatusRuntimeException.class,
            () ->
                client.executeOnce(
                    "POST /v1/payments", "not a valid key!", REQUEST, e -> fail()));
    assertEquals(Status.Code.INVALID_ARGUMENT, invalid.getStatus().getCode());
    assertEquals(1, tap.requests.size());

    try (IdemdClient stranger =
        IdemdClient.builder(ClientInterceptors.intercept(channel, tap))
            .bearerToken("not-a-real-token")
            .build()) {
      StatusRuntimeException unauthenticated =
          assertThrows(
              StatusRuntimeException.class,
              () ->
                  stranger.executeOnce(
                      "POST /v1/payments", UUID.randomUUID().toString(), REQUEST, e -> fail()));
      assertEquals(Status.Code.UNAUTHENTICATED, unauthenticated.getStatus().getCode());
    }
    assertEquals(2, tap.requests.size());
  }

  private static HttpResponseSpec fail() {
    throw new AssertionError("the handler must not run");
  }

  /** Records Claim requests and responses, and loses the next N responses. */
  private static final class ClaimTap implements ClientInterceptor {
    final List<ClaimRequest> requests = new CopyOnWriteArrayList<>();
    final List<ClaimResponse> responses = new CopyOnWriteArrayList<>();
    final AtomicInteger responsesToLose = new AtomicInteger();

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      ClientCall<ReqT, RespT> call = next.newCall(method, options);
      if (!method.getFullMethodName().equals(IdempotencyGrpc.getClaimMethod().getFullMethodName())) {
        return call;
      }
      return new ForwardingClientCall.SimpleForwardingClientCall<>(call) {
        @Override
        public void sendMessage(ReqT message) {
          requests.add((ClaimRequest) message);
          super.sendMessage(message);
        }

        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          boolean lose = responsesToLose.getAndUpdate(n -> Math.max(0, n - 1)) > 0;
          AtomicReference<RespT> received = new AtomicReference<>();
          super.start(
              new ForwardingClientCallListener.SimpleForwardingClientCallListener<>(listener) {
                @Override
                public void onMessage(RespT message) {
                  responses.add((ClaimResponse) message);
                  received.set(message);
                  if (!lose) {
                    super.onMessage(message);
                  }
                }

                @Override
                public void onClose(Status status, Metadata trailers) {
                  if (lose && received.get() != null) {
                    super.onClose(
                        Status.UNAVAILABLE.withDescription("injected: Claim response lost"),
                        new Metadata());
                  } else {
                    super.onClose(status, trailers);
                  }
                }
              },
              headers);
        }
      };
    }
  }
}
