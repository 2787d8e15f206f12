package dev.idemd.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.net.SocketException;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The answers the filter gives without handing the request on (400 for the key, 413), over one raw
 * keep-alive connection: one that does not say {@code Connection: close} must leave the connection
 * able to carry the next request, even when the body arrives after the headers (as an HTTP client
 * that writes them apart sends it). Before the filter read what was left of the body, the container
 * found it unread after the answer went out as keep-alive and closed the connection silently: the
 * next request on the pooled connection got no answer (HttpScenariosTest, scenario 1, "no answer").
 */
@NeedsIdemd
class EarlyAnswerConnectionTest {
  /** How long a read waits for the container. */
  static final int READ_TIMEOUT_MS = 10_000;

  /** How long the body follows its headers. */
  static final int BODY_DELAY_MS = 300;

  @BeforeAll
  static void start() throws Exception {
    HttpScenariosTest.start();
  }

  @AfterAll
  static void stop() throws Exception {
    HttpScenariosTest.stop();
  }

  record Answer(int status, Map<String, String> headers, String body) {}

  static String head(String method, String path, String key, String framing) {
    return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + (key == null ? "" : "Idempotency-Key: " + key + "\r\n") + framing + "\r\n";
  }

  /** One answer from {@code in}, or null when the server closed the connection before any byte. */
  static Answer read(InputStream in, String waitingFor) throws IOException {
    ByteArrayOutputStream head = new ByteArrayOutputStream();
    long started = System.nanoTime();
    try {
      while (true) {
        int b = in.read();
        if (b < 0) {
          if (head.size() == 0) {
            return null;
          }
          fail(waitingFor + ": the connection closed inside the answer's head: " + head);
        }
        head.write(b);
        byte[] h = head.toByteArray();
        int n = h.length;
        if (n >= 4 && h[n - 4] == '\r' && h[n - 3] == '\n' && h[n - 2] == '\r' && h[n - 1] == '\n') {
          break;
        }
      }
      String[] lines = head.toString(StandardCharsets.ISO_8859_1).split("\r\n");
      int status = Integer.parseInt(lines[0].split(" ")[1]);
      Map<String, String> headers = new HashMap<>();
      for (int i = 1; i < lines.length; i++) {
        int colon = lines[i].indexOf(':');
        headers.put(lines[i].substring(0, colon).trim().toLowerCase(Locale.ROOT),
            lines[i].substring(colon + 1).trim());
      }
      int length = Integer.parseInt(headers.getOrDefault("content-length", "0"));
      byte[] body = in.readNBytes(length);
      assertEquals(length, body.length, waitingFor + ": the answer's body ended early");
      return new Answer(status, headers, new String(body, StandardCharsets.UTF_8));
    } catch (SocketTimeoutException e) {
      fail(waitingFor + ": nothing from the container within " + READ_TIMEOUT_MS + " ms (waited "
          + (System.nanoTime() - started) / 1_000_000 + " ms)", e);
      return null;
    }
  }

  /**
   * Sends {@code head}, then {@code body} {@link #BODY_DELAY_MS} later, and expects {@code status}
   * kept alive: then a second request on the same connection must get its answer.
   */
  static void assertKeptAlive(String head, String body, int status) throws Exception {
    try (HttpScenariosTest.Container container = new HttpScenariosTest.Container();
        Socket socket = new Socket("127.0.0.1", container.port)) {
      socket.setSoTimeout(READ_TIMEOUT_MS);
      OutputStream out = socket.getOutputStream();
      InputStream in = socket.getInputStream();
      out.write(head.getBytes(StandardCharsets.ISO_8859_1));
      out.flush();
      Thread.sleep(BODY_DELAY_MS);
      out.write(body.getBytes(StandardCharsets.UTF_8));
      out.flush();
      Answer first = read(in, "the first answer");
      if (first == null) {
        fail("the first request got no answer");
      }
      assertEquals(status, first.status(), first.body());
      assertNull(first.headers().get("connection"), "the answer closes the connection: " + first.headers());
      String closed = "the connection the " + status + " kept alive (" + first.headers()
          + ") was closed: the next request on it got no answer";
      Answer second = null;
      try {
        out.write(head(
            "GET", "/v1/payments/after", null, "Content-Length: 0\r\n").getBytes(StandardCharsets.ISO_8859_1));
        out.flush();
        second = read(in, "the second request's answer on the kept-alive connection");
      } catch (SocketException e) {
        fail(closed + " (" + e + ")", e);
      }
      if (second == null) {
        fail(closed);
      }
      assertEquals(201, second.status(), second.body());
    }
  }

  @Test
  void aMalformedKeyLeavesTheConnectionUsable() throws Exception {
    assertKeptAlive(head("POST", "/v1/payments/c1", "has space", "Content-Length: 2\r\n"), "{}", 400);
  }

  @Test
  void aMissingKeyLeavesTheConnectionUsable() throws Exception {
    assertKeptAlive(head("POST", "/v1/payments/c2", null, "Content-Length: 2\r\n"), "{}", 400);
  }

  @Test
  void aChunkedBodyUnderAMalformedKeyIsReadToItsEnd() throws Exception {
    assertKeptAlive(head("POST", "/v1/payments/c3", "\"unterminated", "Transfer-Encoding: chunked\r\n"),
        "2\r\n{}\r\n0\r\n\r\n", 400);
  }

  /** A body the filter does not read: the answer says so, and the container closes. */
  static void assertClosed(String head, String body) throws Exception {
    try (HttpScenariosTest.Container container = new HttpScenariosTest.Container();
        Socket socket = new Socket("127.0.0.1", container.port)) {
      socket.setSoTimeout(READ_TIMEOUT_MS);
      OutputStream out = socket.getOutputStream();
      InputStream in = socket.getInputStream();
      out.write(head.getBytes(StandardCharsets.ISO_8859_1));
      out.write(body.getBytes(StandardCharsets.UTF_8));
      out.flush();
      Answer answer = read(in, "the 413");
      if (answer == null) {
        fail("the request got no answer");
      }
      assertEquals(413, answer.status(), answer.body());
      assertEquals("close", answer.headers().get("connection"), "headers " + answer.headers());
    }
  }

  @Test
  void aDeclaredBodyOverTheLimitClosesTheConnection() throws Exception {
    // /small/* takes 64 bytes: 1000 declared, a few sent; the filter reads none of them.
    assertClosed(head("POST", "/small/c4", "c4", "Content-Length: 1000\r\n"), "{\"a\":1}");
  }

  @Test
  void aChunkedBodyOverTheLimitClosesTheConnection() throws Exception {
    String chunk = "{\"pad\":\"" + "x".repeat(100) + "\"}";
    assertClosed(head("POST", "/small/c5", "c5", "Transfer-Encoding: chunked\r\n"),
        Integer.toHexString(chunk.length()) + "\r\n" + chunk + "\r\n0\r\n\r\n");
  }
}
