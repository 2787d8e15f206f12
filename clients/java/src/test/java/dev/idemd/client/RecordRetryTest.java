package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.CompleteRequest;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.StoredResponse;
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
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.netty.handler.codec.http2.Http2Error;
import io.grpc.netty.shaded.io.netty.handler.codec.http2.Http2Exception;
import java.io.IOException;
import java.time.Duration;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * What is sent again, and by whom. The executor: a Complete that cannot be delivered (refused 6
 * times, more than the 3 retries of before) is retried while the lease holds, so the key ends
 * COMPLETED and the caller gets its result instead of a CompleteFailedException and a key left
 * IN_PROGRESS. The raw RPCs: a call the server never took, always; one whose connection failed
 * under it, only when idemd answers its repeat as the first.
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
   * are sent again by every raw RPC; an error the server may have seen is not.
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
    // Streams Netty failed before their request was written (grpc-java: INTERNAL "http2
    // exception"), as the proxy matrix met them on a loaded machine.
    for (Http2Exception never : new Http2Exception[] {
        Http2Exception.streamError(7, Http2Error.STREAM_CLOSED,
            "Stream closed before write could take place"),
        Http2Exception.streamError(2033, Http2Error.REFUSED_STREAM,
            "Cannot create stream 2033 greater than Last-Stream-ID 2001 from GOAWAY."),
        Http2Exception.streamError(9, Http2Error.REFUSED_STREAM,
            "Maximum active streams violated for this endpoint: 128")}) {
      assertTrue(IdemdClient.unprocessed(http2Exception(never)), never.getMessage());
    }
    // A stream error on a stream whose request may have been written, or a connection error.
    for (Http2Exception maybe : new Http2Exception[] {
        Http2Exception.streamError(7, Http2Error.PROTOCOL_ERROR, "Stream 7 in unexpected state"),
        Http2Exception.connectionError(Http2Error.PROTOCOL_ERROR,
            "Stream closed before write could take place")}) {
      assertFalse(IdemdClient.unprocessed(http2Exception(maybe)), maybe.getMessage());
    }
    assertFalse(IdemdClient.unprocessed(Status.INTERNAL.withDescription(
        "Stream closed before write could take place")));
  }

  /**
   * {@link IdemdClient#connectionFailed}: a broken connection is sent again only for a call that
   * is safe to repeat; idemd's own UNAVAILABLE answers (no cause) never are.
   */
  @Test
  void aBrokenConnectionIsSentAgainOnlyForACallSafeToRepeat() {
    Status[] broken = {
        Status.UNAVAILABLE.withDescription("io exception")
            .withCause(new IOException("writevAddresses(..) failed with error(-32): Broken pipe")),
        Status.UNAVAILABLE.withDescription("Connection closed after GOAWAY. HTTP/2 error code:"
            + " NO_ERROR"),
        Status.UNAVAILABLE.withDescription("Network closed for unknown reason"),
        http2Exception(Http2Exception.streamError(7, Http2Error.PROTOCOL_ERROR, "unexpected"))};
    for (Status s : broken) {
      assertTrue(IdemdClient.sendAgain(s, true), s.toString());
      assertFalse(IdemdClient.sendAgain(s, false), s.toString());
    }
    for (Status answer : new Status[] {
        Status.UNAVAILABLE.withDescription("store write outcome unknown (it may or may not have"
            + " been applied); retry the same call to find out"),
        Status.INTERNAL.withDescription("http2 exception"),
        Status.FAILED_PRECONDITION.withDescription("lease lost"),
        Status.DEADLINE_EXCEEDED.withCause(new IOException("timeout"))}) {
      assertFalse(IdemdClient.sendAgain(answer, true), answer.toString());
    }
  }

  /**
   * A Claim with an attempt id and a Complete that idemd applied but whose answer was lost with the
   * connection (grpc-java's status for a write on a connection nginx had closed) are sent again by
   * the raw RPCs and answered as the first were; a Claim without an attempt id surfaces the error,
   * since its repeat would meet its own lease. Without the resend, a raw caller sees UNAVAILABLE
   * for a key that is in fact claimed or completed (the proxy matrix's idle1s run met this).
   */
  @Test
  void callsSafeToRepeatAreSentAgainAfterTheConnectionBroke(IdemdServer server) {
    Map<String, AtomicInteger> calls = new ConcurrentHashMap<>();
    ClientInterceptor losingFirstAnswer =
        new ClientInterceptor() {
          @Override
          public <Q, A> ClientCall<Q, A> interceptCall(
              MethodDescriptor<Q, A> method, CallOptions options, Channel next) {
            int n = calls.computeIfAbsent(method.getBareMethodName(), m -> new AtomicInteger())
                .incrementAndGet();
            boolean lose = n == 1 && !"Lookup".equals(method.getBareMethodName());
            return new ForwardingClientCall.SimpleForwardingClientCall<>(
                next.newCall(method, options)) {
              @Override
              public void start(Listener<A> listener, Metadata headers) {
                super.start(
                    !lose ? listener : new ForwardingClientCallListener
                        .SimpleForwardingClientCallListener<>(listener) {
                      @Override
                      public void onMessage(A message) {}

                      @Override
                      public void onClose(Status status, Metadata trailers) {
                        super.onClose(Status.UNAVAILABLE.withDescription("io exception")
                            .withCause(new IOException("synthetic: Broken pipe")), trailers);
                      }
                    },
                    headers);
              }
            };
          }
        };
    ManagedChannel channel =
        Grpc.newChannelBuilder(server.address(), InsecureChannelCredentials.create()).build();
    try (IdemdClient client =
        IdemdClient.builder(ClientInterceptors.intercept(channel, losingFirstAnswer))
            .bearerToken(ProxyMatrixTest.TOKEN)
            .build()) {
      String endpoint = "POST /v1/orders";
      String key = UUID.randomUUID().toString();
      dev.idemd.v1.HttpRequest request = dev.idemd.v1.HttpRequest.newBuilder()
          .setMethod("POST").setPath("/v1/orders").build();
      ClaimResponse claimed = client.claim(ClaimRequest.newBuilder()
          .setEndpoint(endpoint).setKey(key).setAttemptId("attempt-" + key)
          .setLease(ExecuteEngine.toProto(Duration.ofSeconds(10))).setRequest(request).build());
      assertTrue(claimed.hasClaimed(), claimed.toString());
      assertEquals(2, calls.get("Claim").get());
      client.complete(CompleteRequest.newBuilder()
          .setEndpoint(endpoint).setKey(key).setLeaseToken(claimed.getClaimed().getLeaseToken())
          .setResponse(StoredResponse.newBuilder().setStatus(201)).build());
      assertEquals(2, calls.get("Complete").get());
      assertEquals(State.STATE_COMPLETED, client.lookup(
          LookupRequest.newBuilder().setEndpoint(endpoint).setKey(key).build())
          .getRecord().getState());

      // Without an attempt id the lost answer surfaces, and the key is in fact claimed.
      calls.clear();
      String bare = UUID.randomUUID().toString();
      StatusRuntimeException lost = assertThrows(StatusRuntimeException.class,
          () -> client.claim(ClaimRequest.newBuilder()
              .setEndpoint(endpoint).setKey(bare)
              .setLease(ExecuteEngine.toProto(Duration.ofSeconds(10))).setRequest(request)
              .build()));
      assertEquals(Status.Code.UNAVAILABLE, lost.getStatus().getCode());
      assertEquals(1, calls.get("Claim").get());
      assertEquals(State.STATE_IN_PROGRESS, client.lookup(
          LookupRequest.newBuilder().setEndpoint(endpoint).setKey(bare).build())
          .getRecord().getState());
    } finally {
      channel.shutdownNow();
    }
  }

  static Status http2Exception(Http2Exception cause) {
    return Status.INTERNAL.withDescription("http2 exception").withCause(cause);
  }
}
