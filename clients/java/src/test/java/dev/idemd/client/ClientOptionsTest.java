package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.LookupRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.UUID;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** Client options against the live (plaintext, authenticated) server. */
@ExtendWith(LiveIdemd.class)
class ClientOptionsTest {
  private static final String TOKEN = "conformance-token-alice-3f9a";

  @Test
  void tlsIsTheDefault(IdemdServer server) {
    try (IdemdClient tls = IdemdClient.builder(server.address()).bearerToken(TOKEN).build()) {
      StatusRuntimeException e =
          assertThrows(
              StatusRuntimeException.class,
              () ->
                  tls.lookup(
                      LookupRequest.newBuilder().setEndpoint("POST /x").setKey("k").build(),
                      Duration.ofSeconds(5)));
      // A TLS handshake with a plaintext server fails: nothing is sent in the clear.
      assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
    }
  }

  @Test
  void unreadableCaFileIsReported() {
    assertThrows(
        UncheckedIOException.class,
        () -> IdemdClient.builder("localhost:1").tlsCaFile(Path.of("/nonexistent/ca.pem")).build());
  }

  @Test
  void unreadableClientCertificateIsReported() {
    assertThrows(
        UncheckedIOException.class,
        () ->
            IdemdClient.builder("localhost:1")
                .tlsClientCertificate(Path.of("/nonexistent/client.crt"), Path.of("/nonexistent/client.key"))
                .build());
  }

  @Test
  void clientCertificateConflictsWithPlaintext() {
    Path cert = Path.of("client.crt");
    Path key = Path.of("client.key");
    IllegalStateException certThenPlaintext =
        assertThrows(
            IllegalStateException.class,
            () -> IdemdClient.builder("localhost:1").tlsClientCertificate(cert, key).plaintext().build());
    assertTrue(
        certThenPlaintext.getMessage().contains("tlsClientCertificate() cannot be combined with plaintext()"),
        certThenPlaintext.getMessage());
    // Whatever the order: the last call does not silently win.
    assertThrows(
        IllegalStateException.class,
        () -> IdemdClient.builder("localhost:1").plaintext().tlsClientCertificate(cert, key).build());
  }

  @Test
  void credentialsMustBeHeaderSafe() {
    assertThrows(
        IllegalArgumentException.class, () -> IdemdClient.builder("localhost:1").bearerToken("a\nb"));
    assertThrows(IllegalArgumentException.class, () -> IdemdClient.builder("localhost:1").tenantId(""));
  }

  @Test
  void perCallDeadlineBoundsAWaitingClaim(IdemdServer server) {
    try (IdemdClient client =
        IdemdClient.builder(server.address())
            .plaintext()
            .bearerToken(TOKEN)
            .deadline(Duration.ofMillis(300))
            .build()) {
      ClaimRequest.Builder claim =
          ClaimRequest.newBuilder()
              .setEndpoint("POST /v1/payments")
              .setKey(UUID.randomUUID().toString())
              .setSha256(ByteString.copyFrom(new byte[32]));
      ClaimResponse holder = client.claim(claim.build(), Duration.ofSeconds(10));
      assertEquals(ClaimResponse.OutcomeCase.CLAIMED, holder.getOutcomeCase());

      long start = System.nanoTime();
      StatusRuntimeException e =
          assertThrows(
              StatusRuntimeException.class,
              () -> client.claim(claim.setWait(ExecuteEngine.toProto(Duration.ofSeconds(3))).build()));
      long elapsedMs = (System.nanoTime() - start) / 1_000_000;
      assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getStatus().getCode());
      assertTrue(elapsedMs < 2500, "the default deadline (300 ms) must cut the wait short: " + elapsedMs);
    }
  }
}
