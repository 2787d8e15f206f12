package dev.idemd.client.testing;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/** A throwaway nginx of scripts/nginx.sh in front of an idemd (clients/conformance/proxy-matrix.md). */
public final class Nginx implements AutoCloseable {
  private final Path dir;
  private final String address;

  private Nginx(Path dir, String address) {
    this.dir = dir;
    this.address = address;
  }

  /** Starts nginx with {@code profile} in front of {@code upstream}; {@code certs} may be null. */
  public static Nginx start(String upstream, String profile, Path certs) throws IOException {
    Path dir = Files.createTempDirectory("idemd-java-nginx-");
    List<String> args = new ArrayList<>(List.of("start", "--dir", dir.toString(),
        "--upstream", upstream, "--profile", profile));
    if (certs != null) {
      args.addAll(List.of("--certs", certs.toString()));
    }
    return new Nginx(dir, script(args).trim());
  }

  /** 127.0.0.1:PORT nginx listens on. */
  public String address() {
    return address;
  }

  /** The port nginx listens on. */
  public int port() {
    return Integer.parseInt(address.substring(address.lastIndexOf(':') + 1));
  }

  /** How many lines of nginx's error log contain {@code what} (scripts/nginx.sh count). */
  public int count(String what) {
    try {
      return Integer.parseInt(script(List.of("count", "--dir", dir.toString(), what)).trim());
    } catch (IOException | NumberFormatException e) {
      return -1;
    }
  }

  /**
   * What nginx logged that shows a run met the profile's limit: the refused streams (nginx 1.22
   * logs no line at info for the GOAWAYs of keepalive_requests or keepalive_timeout; the access
   * log's request count is given instead).
   */
  public String stats() {
    return "nginx: " + count("concurrent streams exceeded") + " concurrent streams exceeded, "
        + accessLines() + " requests forwarded";
  }

  private long accessLines() {
    try (var lines = Files.lines(dir.resolve("access.log"))) {
      return lines.count();
    } catch (IOException e) {
      return -1;
    }
  }

  @Override
  public void close() {
    try {
      script(List.of("stop", "--dir", dir.toString()));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static String script(List<String> args) throws IOException {
    List<String> command = new ArrayList<>(List.of("bash",
        RepoPaths.root().resolve("scripts/nginx.sh").toString()));
    command.addAll(args);
    Process p = new ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.PIPE).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    String err = new String(p.getErrorStream().readAllBytes(), StandardCharsets.UTF_8);
    try {
      if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
        throw new IOException("scripts/nginx.sh " + String.join(" ", args) + " failed: " + err);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException(e);
    }
    return out;
  }
}
