package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import com.google.protobuf.ByteString;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.HttpRequest;
import java.time.Duration;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** A handler that outlives its lease keeps the key: the executor extends the lease. */
@ExtendWith(LiveIdemd.class)
class LeaseExtensionTest {
  private static final String ENDPOINT = "POST /v1/takeover"; // on_expired_lease = takeover
  private static final String BODY = "{\"amount\":4200}";

  @Test
  void longHandlerKeepsItsLease(IdemdServer server) throws Exception {
    try (IdemdClient client =
        IdemdClient.builder(server.address())
            .plaintext()
            .bearerToken("conformance-token-alice-3f9a")
            .build()) {
      String key = UUID.randomUUID().toString();
      HttpRequestSpec request = HttpRequestSpec.json("POST", "/v1/payments", BODY);
      CompletableFuture<Void> handlerStarted = new CompletableFuture<>();
      CompletableFuture<ExecuteResult> execution =
          CompletableFuture.supplyAsync(
              () ->
                  client.executeOnce(
                      ENDPOINT,
                      key,
                      request,
                      e -> {
                        handlerStarted.complete(null);
                        Thread.sleep(1500); // five leases of 300 ms
                        return HttpResponseSpec.json(201, "{\"id\":\"pay_long\"}");
                      },
                      ExecuteOptions.defaults().withLease(Duration.ofMillis(300))));
      handlerStarted.get(10, TimeUnit.SECONDS);
      Thread.sleep(900);
      // Without extension the lease would have expired and this Claim would take the key over.
      ClaimResponse intruder =
          client.claim(
              ClaimRequest.newBuilder()
                  .setEndpoint(ENDPOINT)
                  .setKey(key)
                  .setRequest(
                      HttpRequest.newBuilder()
                          .setMethod("POST")
                          .setPath("/v1/payments")
                          .setContentType("application/json")
                          .setBody(ByteString.copyFromUtf8(BODY)))
                  .build());
      assertEquals(ClaimResponse.OutcomeCase.IN_PROGRESS, intruder.getOutcomeCase());

      ExecuteResult result = execution.get(20, TimeUnit.SECONDS);
      assertFalse(result.replayed());
      assertEquals(1, result.attempt());
      assertEquals("{\"id\":\"pay_long\"}", result.response().bodyText());

      ExecuteResult replay =
          client.executeOnce(
              ENDPOINT, key, request, e -> HttpResponseSpec.json(500, "{}"));
      assertEquals(result.response(), replay.response());
    }
  }
}
