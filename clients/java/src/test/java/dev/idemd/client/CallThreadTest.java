package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.google.protobuf.ByteString;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.CompleteRequest;
import dev.idemd.v1.HttpRequest;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.StoredResponse;
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
import org.junit.jupiter.api.Test;

/**
 * The raw RPCs (and so executeOnce's Claim and Complete) wake the calling thread once per call:
 * the response's headers, message and close are handled on the transport's thread, not handed to
 * the caller one at a time as the blocking stub does (IdemdClient.await says what that cost).
 */
class CallThreadTest {
  @Test
  void responsesAreHandledOffTheCallingThread() throws Exception {
    List<String> handledOn = new CopyOnWriteArrayList<>();
    ClientInterceptor recorder = new ClientInterceptor() {
      @Override
      public <Q, R> ClientCall<Q, R> interceptCall(
          MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
        return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
          @Override
          public void start(Listener<R> listener, Metadata headers) {
            super.start(new ForwardingClientCallListener.SimpleForwardingClientCallListener<>(listener) {
              @Override
              public void onMessage(R message) {
                handledOn.add(Thread.currentThread().getName());
                super.onMessage(message);
              }

              @Override
              public void onClose(Status status, Metadata trailers) {
                handledOn.add(Thread.currentThread().getName());
                super.onClose(status, trailers);
              }
            }, headers);
          }
        };
      }
    };
    try (IdemdServer server = IdemdServer.startWithoutAuth()) {
      ManagedChannel channel =
          Grpc.newChannelBuilder(server.address(), InsecureChannelCredentials.create()).build();
      try (IdemdClient client = IdemdClient.builder(ClientInterceptors.intercept(channel, recorder))
          .tenantId("call-thread").build()) {
        String key = UUID.randomUUID().toString();
        ClaimResponse claimed = client.claim(ClaimRequest.newBuilder()
            .setEndpoint("POST /v1/orders").setKey(key).setAttemptId(key)
            .setRequest(HttpRequest.newBuilder().setMethod("POST").setPath("/v1/orders")
                .setContentType("application/json").setBody(ByteString.copyFromUtf8("{}")))
            .build());
        client.complete(CompleteRequest.newBuilder()
            .setEndpoint("POST /v1/orders").setKey(key)
            .setLeaseToken(claimed.getClaimed().getLeaseToken())
            .setResponse(StoredResponse.newBuilder().setStatus(201)).build());
        // An error keeps its status (and trailers: ConformanceTest reads their reasons).
        StatusRuntimeException missing = assertThrows(StatusRuntimeException.class,
            () -> client.lookup(LookupRequest.newBuilder()
                .setEndpoint("POST /v1/orders").setKey(key + "-none").build()));
        assertEquals(Status.Code.NOT_FOUND, missing.getStatus().getCode());

        // Claim, Complete and Lookup: a message and a close each, but the Lookup's error: a close.
        assertEquals(5, handledOn.size(), handledOn.toString());
        String caller = Thread.currentThread().getName();
        assertFalse(handledOn.contains(caller), "handled on the calling thread: " + handledOn);
      } finally {
        channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
      }
    }
  }
}
