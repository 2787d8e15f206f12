package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.State;
import java.nio.charset.StandardCharsets;
import java.util.UUID;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * The Fail reason the executor stores when a handler throws: {@code <Kind>: <message>} with the
 * exception's unqualified class name, capped at 1,024 UTF-8 bytes on a character boundary
 * (clients/conformance/http-scenarios.md, "What an HTTP caller learns about a failed handler").
 */
@ExtendWith(LiveIdemd.class)
class FailureReasonTest {
  private static final String TOKEN = "conformance-token-alice-3f9a";

  private static String storedReason(IdemdServer server, Exception thrown) {
    String key = UUID.randomUUID().toString();
    try (IdemdClient idemd =
        IdemdClient.builder(server.address()).bearerToken(TOKEN).plaintext().build()) {
      HandlerException e =
          assertThrows(
              HandlerException.class,
              () ->
                  idemd.executeOnce(
                      "POST /v1/crash",
                      key,
                      HttpRequestSpec.json("POST", "/v1/crash", "{}"),
                      execution -> {
                        throw thrown;
                      }));
      assertTrue(e.recorded());
      var record =
          idemd
              .lookup(LookupRequest.newBuilder().setEndpoint("POST /v1/crash").setKey(key).build())
              .getRecord();
      assertEquals(State.STATE_UNKNOWN, record.getState());
      return record.getReason();
    }
  }

  @Test
  void theReasonIsTheExceptionsKindAndMessage(IdemdServer server) {
    assertEquals(
        "IllegalStateException: boom: secret-4711",
        storedReason(server, new IllegalStateException("boom: secret-4711")));
    assertEquals("IllegalStateException", storedReason(server, new IllegalStateException()));
    // An anonymous subclass is named after what it extends, not "".
    assertEquals(
        "RuntimeException: boom", storedReason(server, new RuntimeException("boom") {}));
  }

  @Test
  void aLongReasonIsCutOnACharacterBoundary(IdemdServer server) {
    // "IllegalStateException: " is 23 bytes; each "é" 2: the 1,024-byte cap falls inside one.
    String reason = storedReason(server, new IllegalStateException("é".repeat(600)));
    assertEquals("IllegalStateException: " + "é".repeat(500), reason);
    assertTrue(reason.getBytes(StandardCharsets.UTF_8).length <= 1024);
  }
}
