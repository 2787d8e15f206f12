package dev.idemd.client.testing;

import dev.idemd.client.json.JsonException;
import dev.idemd.client.json.StrictJson;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.stream.Stream;

/**
 * A real idemd process, started as clients/conformance/README.md says: port 0, a fresh data
 * directory, the conformance config and tokens (or other arguments), JSON logs; the bound address
 * is read from the "idemd serving" log line. {@link #close()} stops it with SIGTERM.
 */
public final class IdemdServer implements AutoCloseable {
  private static final int LOG_LINES_KEPT = 200;

  private final Process process;
  private final Path dataDir;
  private final String address;
  private final Deque<String> log = new ArrayDeque<>();

  private IdemdServer(List<String> extraArgs) throws IOException {
    this(RepoPaths.idemdBinary(), extraArgs);
  }

  private IdemdServer(Path binary, List<String> extraArgs) throws IOException {
    if (!Files.isExecutable(binary)) {
      throw new IllegalStateException(
          "idemd binary not found at " + binary + " (set IDEMD_BIN to the server binary)");
    }
    dataDir = Files.createTempDirectory("idemd-java-sdk-");
    List<String> command = new ArrayList<>();
    command.add(binary.toString());
    command.addAll(List.of("--listen", "127.0.0.1:0", "--data-dir", dataDir.toString()));
    command.addAll(extraArgs);
    command.addAll(List.of("--log-format", "json"));
    process =
        new ProcessBuilder(command)
            .redirectOutput(ProcessBuilder.Redirect.DISCARD)
            .redirectError(ProcessBuilder.Redirect.PIPE)
            .start();
    CompletableFuture<String> serving = new CompletableFuture<>();
    Thread reader =
        new Thread(() -> readLog(serving), "idemd-log-" + process.pid());
    reader.setDaemon(true);
    reader.start();
    try {
      address = serving.get(30, TimeUnit.SECONDS);
    } catch (InterruptedException | ExecutionException | TimeoutException e) {
      close();
      throw new IllegalStateException(
          "idemd did not report 'idemd serving' (" + e + "); last log lines:\n" + logTail(), e);
    }
  }

  /** Starts a server with authentication (clients/conformance/tokens.txt). */
  public static IdemdServer startConformance() throws IOException {
    Path conformance = RepoPaths.conformance();
    return new IdemdServer(
        List.of(
            "--config", conformance.resolve("idemd.toml").toString(),
            "--auth-tokens", conformance.resolve("tokens.txt").toString()));
  }

  /**
   * Starts {@code binary} (another idemd build, e.g. the previous release) as {@link
   * #startConformance()} starts $IDEMD_BIN.
   */
  public static IdemdServer startConformance(Path binary) throws IOException {
    Path conformance = RepoPaths.conformance();
    return new IdemdServer(
        binary,
        List.of(
            "--config", conformance.resolve("idemd.toml").toString(),
            "--auth-tokens", conformance.resolve("tokens.txt").toString()));
  }

  /** Starts a server without authentication: the tenant comes from x-tenant-id. */
  public static IdemdServer startWithoutAuth() throws IOException {
    return startWithArgs(List.of());
  }

  /**
   * Starts a server with the conformance config, no tokens file and {@code extraArgs} (e.g. the TLS
   * flags of an mTLS server, which takes the tenant from the client certificate).
   */
  public static IdemdServer startWithArgs(List<String> extraArgs) throws IOException {
    List<String> args = new ArrayList<>();
    args.addAll(List.of("--config", RepoPaths.conformance().resolve("idemd.toml").toString()));
    args.addAll(extraArgs);
    return new IdemdServer(args);
  }

  /** host:port of the gRPC listener. */
  /** The server process's pid (benchmarks read its CPU time from /proc). */
  public long pid() {
    return process.pid();
  }

  public String address() {
    return address;
  }

  private void readLog(CompletableFuture<String> serving) {
    try (BufferedReader lines =
        new BufferedReader(
            new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
      String line;
      while ((line = lines.readLine()) != null) {
        synchronized (log) {
          log.addLast(line);
          if (log.size() > LOG_LINES_KEPT) {
            log.removeFirst();
          }
        }
        if (!serving.isDone()) {
          try {
            if (StrictJson.parse(line) instanceof Map<?, ?> entry
                && "idemd serving".equals(entry.get("message"))
                && entry.get("address") instanceof String bound) {
              serving.complete(bound);
            }
          } catch (JsonException notJson) {
            // Not a JSON log line; keep reading.
          }
        }
      }
    } catch (IOException e) {
      // The process went away.
    } finally {
      serving.completeExceptionally(new IllegalStateException("idemd exited"));
    }
  }

  /** The last lines the server logged (for failure messages). */
  public String logTail() {
    synchronized (log) {
      return String.join("\n", log);
    }
  }

  /** Stops the server with SIGTERM (SIGKILL after 10 s) and deletes its data directory. */
  @Override
  public void close() {
    process.destroy(); // SIGTERM
    try {
      if (!process.waitFor(10, TimeUnit.SECONDS)) {
        process.destroyForcibly();
        process.waitFor(5, TimeUnit.SECONDS);
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
    try (Stream<Path> files = Files.walk(dataDir)) {
      for (Path p : files.sorted(Comparator.reverseOrder()).toList()) {
        Files.deleteIfExists(p);
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
