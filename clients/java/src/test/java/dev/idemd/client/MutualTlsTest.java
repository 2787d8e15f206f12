package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.RepoPaths;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.State;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The SDK's own TLS options against an idemd that serves TLS and requires client certificates
 * (clients/conformance/README.md, "TLS and mTLS"). The server has no tokens file: the tenant comes
 * from the client certificate alone.
 */
class MutualTlsTest {
  private static final String ENDPOINT = "POST /v1/payments";
  // Generous: the first TLS handshakes of the JVM are slow on a busy CI machine.
  private static final Duration DEADLINE = Duration.ofSeconds(30);
  // A refused handshake fails at once; the bound only keeps a wrong expectation from hanging.
  private static final Duration REFUSED_DEADLINE = Duration.ofSeconds(10);

  private static Path certs;
  private static IdemdServer server;
  private static String target;

  @BeforeAll
  static void startMutualTlsServer() throws IOException {
    certs = RepoPaths.testCerts();
    server =
        IdemdServer.startWithArgs(
            List.of(
                "--tls-cert", certs.resolve("server.crt").toString(),
                "--tls-key", certs.resolve("server.key").toString(),
                "--tls-client-ca", certs.resolve("ca.pem").toString(),
                "--tls-client-tenants", certs.resolve("client-tenants.txt").toString()));
    // The certificate names localhost: the host must be the name the client verifies, whatever
    // address idemd reports.
    String address = server.address();
    target = "localhost:" + address.substring(address.lastIndexOf(':') + 1);
  }

  @AfterAll
  static void stopServer() {
    if (server != null) {
      server.close();
    }
  }

  @Test
  void aliceCertificateRunsTheExecutorOnceThenReplays() {
    try (IdemdClient alice = clientAs("alice")) {
      String key = UUID.randomUUID().toString();
      AtomicInteger calls = new AtomicInteger();
      Handler handler =
          execution -> {
            calls.incrementAndGet();
            return HttpResponseSpec.json(201, "{\"id\":\"pay_tls\"}");
          };

      ExecuteResult first = alice.executeOnce(ENDPOINT, key, payment(), handler);
      assertFalse(first.replayed(), "a fresh key executes");
      assertEquals(1, calls.get());
      assertEquals(201, first.response().status());
      assertEquals("{\"id\":\"pay_tls\"}", first.response().bodyText());

      ExecuteResult second = alice.executeOnce(ENDPOINT, key, payment(), handler);
      assertTrue(second.replayed(), "the same key replays");
      assertEquals(1, calls.get(), "a replay must not run the handler");
      assertEquals(201, second.response().status());
      assertEquals("{\"id\":\"pay_tls\"}", second.response().bodyText());
    }
  }

  @Test
  void bobCertificateDoesNotSeeAlicesKey() {
    try (IdemdClient alice = clientAs("alice");
        IdemdClient bob = clientAs("bob")) {
      String key = UUID.randomUUID().toString();
      alice.executeOnce(ENDPOINT, key, payment(), e -> HttpResponseSpec.json(201, "{}"));
      // The key exists for Alice, so Bob's NOT_FOUND can only come from the tenant his
      // certificate maps to.
      assertEquals(State.STATE_COMPLETED, alice.lookup(lookup(key)).getRecord().getState());

      StatusRuntimeException e =
          assertThrows(StatusRuntimeException.class, () -> bob.lookup(lookup(key)));
      assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode(), e.toString());
    }
  }

  @Test
  void caFileWithoutClientCertificateGetsNoAnswer() {
    try (IdemdClient anonymous =
        IdemdClient.builder(target).tlsCaFile(certs.resolve("ca.pem")).build()) {
      // With TLS 1.3 the client may finish its side of the handshake before the server refuses
      // it, so the refusal can surface on this call rather than at connect: either way, a
      // transport error and never an answer from the service.
      StatusRuntimeException e =
          assertThrows(
              StatusRuntimeException.class,
              () -> anonymous.lookup(lookup(UUID.randomUUID().toString()), REFUSED_DEADLINE));
      assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode(), e.toString());
    }
  }

  @Test
  void plaintextClientGetsNoAnswer() {
    try (IdemdClient plaintext = IdemdClient.builder(target).plaintext().build()) {
      StatusRuntimeException e =
          assertThrows(
              StatusRuntimeException.class,
              () -> plaintext.lookup(lookup(UUID.randomUUID().toString()), REFUSED_DEADLINE));
      // The server answers the HTTP/2 preface with a TLS alert, which the client reads as a
      // malformed first frame: INTERNAL made by the client's own transport, hence with a cause
      // (a status received from a server has none). Should the connection reset reach the client
      // before the alert, it is UNAVAILABLE instead.
      Status.Code code = e.getStatus().getCode();
      assertTrue(
          code == Status.Code.UNAVAILABLE || (code == Status.Code.INTERNAL && e.getCause() != null),
          "expected a transport error, got " + e + " caused by " + e.getCause());
    }
  }

  /** A client that trusts the test CA and presents {@code name}'s certificate. */
  private static IdemdClient clientAs(String name) {
    return IdemdClient.builder(target)
        .tlsCaFile(certs.resolve("ca.pem"))
        .tlsClientCertificate(certs.resolve(name + ".crt"), certs.resolve(name + ".key"))
        .deadline(DEADLINE)
        .build();
  }

  private static HttpRequestSpec payment() {
    return HttpRequestSpec.json("POST", "/v1/payments", "{\"amount\":4200,\"currency\":\"usd\"}");
  }

  private static LookupRequest lookup(String key) {
    return LookupRequest.newBuilder().setEndpoint(ENDPOINT).setKey(key).build();
  }
}
