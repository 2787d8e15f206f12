package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.State;
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
import java.time.Duration;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * A Complete that cannot be delivered (refused 6 times, more than the 3 retries of before) is
 * retried while the lease holds: the key ends COMPLETED and the caller gets its result instead of
 * a CompleteFailedException and a key left IN_PROGRESS.
 */
@ExtendWith(LiveIdemd.class)
class RecordRetryTest {
  @Test
  void completeIsRetriedWithinTheLease(IdemdServer server) {
    AtomicInteger completes = new AtomicInteger();
    ClientInterceptor refusing =
        new ClientInterceptor() {
          @Override
          public <Q, A> ClientCall<Q, A> interceptCall(
              MethodDescriptor<Q, A> method, CallOptions options, Channel next) {
            if (!"Complete".equals(method.getBareMethodName()) || completes.incrementAndGet() > 6) {
              return next.newCall(method, options);
            }
            return new ClientCall<>() {
              @Override
              public void start(Listener<A> listener, Metadata headers) {
                listener.onClose(Status.UNAVAILABLE.withDescription("synthetic: connection closed"
                    + " before the request was written"), new Metadata());
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
    try (IdemdClient client =
        IdemdClient.builder(ClientInterceptors.intercept(channel, refusing))
            .bearerToken(ProxyMatrixTest.TOKEN)
            .build()) {
      String key = UUID.randomUUID().toString();
      ExecuteResult result =
          client.executeOnce("POST /v1/orders", key,
              HttpRequestSpec.json("POST", "/v1/orders", "{}"),
              e -> HttpResponseSpec.json(201, "{\"ok\":1}"),
              ExecuteOptions.defaults().withLease(Duration.ofSeconds(10)));
      assertFalse(result.replayed());
      assertEquals(7, completes.get());
      assertEquals(State.STATE_COMPLETED, client.lookup(
          LookupRequest.newBuilder().setEndpoint("POST /v1/orders").setKey(key).build())
          .getRecord().getState());
    } finally {
      channel.shutdownNow();
    }
  }

  /**
   * {@link IdemdClient#unprocessed}: only grpc-java's statuses for a call the server never took
   * are sent again by the raw RPCs; an error the server may have seen is not.
   */
  @Test
  void onlyCallsTheServerNeverTookAreSentAgain() {
    for (String never : new String[] {
        "Abrupt GOAWAY closed sent stream. HTTP/2 error code: NO_ERROR",
        "Abrupt GOAWAY closed unsent stream. HTTP/2 error code: NO_ERROR",
        "GOAWAY closed buffered stream. HTTP/2 error code: NO_ERROR",
        "RST_STREAM closed stream. HTTP/2 error code: REFUSED_STREAM"}) {
      assertTrue(IdemdClient.unprocessed(Status.UNAVAILABLE.withDescription(never)), never);
      assertFalse(IdemdClient.unprocessed(Status.INTERNAL.withDescription(never)), never);
    }
    for (String maybe : new String[] {
        "Abrupt GOAWAY closed sent stream. HTTP/2 error code: PROTOCOL_ERROR",
        "Connection closed after GOAWAY. HTTP/2 error code: NO_ERROR",
        "RST_STREAM closed stream. HTTP/2 error code: INTERNAL_ERROR",
        "io exception"}) {
      assertFalse(IdemdClient.unprocessed(Status.UNAVAILABLE.withDescription(maybe)), maybe);
    }
    assertFalse(IdemdClient.unprocessed(Status.UNAVAILABLE));
  }
}
