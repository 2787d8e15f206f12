package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.v1.LookupRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.UUID;
import org.junit.jupiter.api.Test;

/** x-tenant-id scopes keys on a development server that runs without authentication. */
class TenantHeaderTest {
  @Test
  void tenantHeaderIsolatesKeys() throws Exception {
    try (IdemdServer server = IdemdServer.startWithoutAuth();
        IdemdClient acme =
            IdemdClient.builder(server.address()).plaintext().tenantId("acme").build();
        IdemdClient globex =
            IdemdClient.builder(server.address()).plaintext().tenantId("globex").build()) {
      String key = UUID.randomUUID().toString();
      HttpRequestSpec request = HttpRequestSpec.json("POST", "/v1/orders", "{\"sku\":\"a\"}");
      ExecuteResult first =
          acme.executeOnce("POST /v1/orders", key, request, e -> HttpResponseSpec.json(201, "1"));
      assertFalse(first.replayed());
      assertTrue(
          acme.executeOnce("POST /v1/orders", key, request, e -> HttpResponseSpec.json(201, "2"))
              .replayed());

      StatusRuntimeException notFound =
          assertThrows(
              StatusRuntimeException.class,
              () ->
                  globex.lookup(
                      LookupRequest.newBuilder()
                          .setEndpoint("POST /v1/orders")
                          .setKey(key)
                          .build()));
      assertEquals(Status.Code.NOT_FOUND, notFound.getStatus().getCode());
      ExecuteResult other =
          globex.executeOnce("POST /v1/orders", key, request, e -> HttpResponseSpec.json(201, "3"));
      assertFalse(other.replayed());
      assertEquals("3", other.response().bodyText());
    }
  }
}
