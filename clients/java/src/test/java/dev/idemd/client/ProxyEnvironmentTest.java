package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.client.testing.Nginx;
import dev.idemd.client.testing.RepoPaths;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** grpc_proxy / https_proxy / no_proxy, read by the builder as grpcio and grpc-js read them. */
@ExtendWith(LiveIdemd.class)
class ProxyEnvironmentTest {
  /** An HTTP CONNECT proxy on loopback that records its tunnels' targets. */
  static final class ConnectProxy implements AutoCloseable {
    final ServerSocket socket = new ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress());
    final List<String> targets = new CopyOnWriteArrayList<>();

    ConnectProxy() throws IOException {
      Thread accept = new Thread(() -> {
        while (!socket.isClosed()) {
          try {
            Socket client = socket.accept();
            Thread t = new Thread(() -> serve(client));
            t.setDaemon(true);
            t.start();
          } catch (IOException e) {
            return;
          }
        }
      });
      accept.setDaemon(true);
      accept.start();
    }

    String address() {
      return "127.0.0.1:" + socket.getLocalPort();
    }

    private void serve(Socket client) {
      try (client) {
        InputStream in = client.getInputStream();
        // Read the request head byte by byte: nothing after it may be consumed here.
        StringBuilder head = new StringBuilder();
        while (!head.toString().endsWith("\r\n\r\n")) {
          int b = in.read();
          if (b < 0) {
            return;
          }
          head.append((char) b);
        }
        String[] first = head.toString().split("\r\n", 2)[0].split(" ");
        if (!first[0].equals("CONNECT")) {
          return;
        }
        String target = first[1];
        int colon = target.lastIndexOf(':');
        try (Socket upstream =
            new Socket(target.substring(0, colon), Integer.parseInt(target.substring(colon + 1)))) {
          targets.add(target);
          OutputStream out = client.getOutputStream();
          out.write("HTTP/1.1 200 Connection established\r\n\r\n".getBytes(StandardCharsets.US_ASCII));
          out.flush();
          Thread up = new Thread(() -> {
            try {
              in.transferTo(upstream.getOutputStream());
              upstream.shutdownOutput();
            } catch (IOException ignored) {
              // closed
            }
          });
          up.setDaemon(true);
          up.start();
          upstream.getInputStream().transferTo(out);
        }
      } catch (IOException | RuntimeException ignored) {
        // a test proxy: the client sees the connection close
      }
    }

    @Override
    public void close() throws IOException {
      socket.close();
    }
  }

  private static void executeTwice(IdemdClient client) {
    String key = UUID.randomUUID().toString();
    HttpRequestSpec request = HttpRequestSpec.json("POST", "/v1/orders", "{\"sku\":\"book-42\"}");
    ExecuteResult first = client.executeOnce("POST /v1/orders", key, request,
        e -> HttpResponseSpec.json(201, "{\"order\":\"ord_1\"}"));
    ExecuteResult again = client.executeOnce("POST /v1/orders", key, request,
        e -> HttpResponseSpec.json(201, "{\"order\":\"ord_2\"}"));
    assertFalse(first.replayed());
    assertTrue(again.replayed());
    assertEquals(first.response(), again.response());
  }

  @Test
  void httpsProxyIsUsedOverTls(IdemdServer server) throws Exception {
    var certs = RepoPaths.testCerts();
    try (Nginx nginx = Nginx.start(server.address(), "tls", certs);
        ConnectProxy proxy = new ConnectProxy()) {
      String target = "localhost:" + nginx.port();
      try (IdemdClient client = IdemdClient.builder(target)
          .tlsCaFile(certs.resolve("ca.pem"))
          .bearerToken(ProxyMatrixTest.TOKEN)
          .environment(Map.of("https_proxy", "http://" + proxy.address()))
          .build()) {
        executeTwice(client);
      }
      assertEquals(List.of(target), proxy.targets.subList(0, 1));
      int tunnels = proxy.targets.size();
      // no_proxy lists the target: direct.
      try (IdemdClient client = IdemdClient.builder(target)
          .tlsCaFile(certs.resolve("ca.pem"))
          .bearerToken(ProxyMatrixTest.TOKEN)
          .environment(Map.of("grpc_proxy", proxy.address(), "no_proxy", "example.com,localhost"))
          .build()) {
        executeTwice(client);
      }
      assertEquals(tunnels, proxy.targets.size(), "no_proxy was not honoured");
    }
  }

  @Test
  void variables() {
    assertNull(EnvProxyDetector.fromEnvironment(Map.of()));
    EnvProxyDetector d = EnvProxyDetector.fromEnvironment(
        Map.of("https_proxy", "http://u:p@proxy:3128", "no_proxy", " .internal, 10.0.0.0/8,::1"));
    assertTrue(d.bypassed("idemd.internal"));
    assertTrue(d.bypassed("internal"));
    assertFalse(d.bypassed("notinternal"));
    assertTrue(d.bypassed("10.1.2.3"));
    assertFalse(d.bypassed("11.1.2.3"));
    assertTrue(d.bypassed("::1"));
    assertFalse(d.bypassed("idemd.example.com"));
    assertTrue(EnvProxyDetector.fromEnvironment(Map.of("grpc_proxy", "p:1", "no_grpc_proxy", "*"))
        .bypassed("anything"));
    assertThrows(IllegalArgumentException.class,
        () -> EnvProxyDetector.fromEnvironment(Map.of("grpc_proxy", "https://proxy:443")));
    assertThrows(IllegalArgumentException.class,
        () -> IdemdClient.builder("x:1").environment(Map.of("https_proxy", "socks5://p:1")).build());
  }
}
