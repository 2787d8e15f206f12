package dev.idemd.servlet;

import dev.idemd.client.json.JsonException;
import dev.idemd.client.json.StrictJson;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * A real idemd process for the filter's tests, started as clients/conformance/README.md says: port
 * 0, a fresh data directory, the conformance policies and tokens, JSON logs (the bound address is
 * read from the "idemd serving" line); stopped with SIGTERM.
 */
final class Idemd implements AutoCloseable {
  /** Tenant alice's token in clients/conformance/tokens.txt. */
  static final String ALICE = "conformance-token-alice-3f9a";

  final String address;
  private final Process process;

  Idemd() throws Exception {
    Path conformance = root().resolve("clients/conformance");
    String bin = System.getenv("IDEMD_BIN"); // set: the classes that start one are @NeedsIdemd
    Path data = Files.createTempDirectory("idemd-servlet-");
    process =
        new ProcessBuilder(
                List.of(bin, "--listen", "127.0.0.1:0", "--data-dir", data.toString(),
                    "--config", conformance.resolve("idemd.toml").toString(),
                    "--auth-tokens", conformance.resolve("tokens.txt").toString(),
                    "--log-format", "json"))
            .redirectOutput(ProcessBuilder.Redirect.DISCARD)
            .start();
    CompletableFuture<String> serving = new CompletableFuture<>();
    Thread reader = new Thread(() -> {
      try (BufferedReader lines = new BufferedReader(
          new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = lines.readLine()) != null) {
          try {
            if (StrictJson.parse(line) instanceof Map<?, ?> entry
                && "idemd serving".equals(entry.get("message"))
                && entry.get("address") instanceof String bound) {
              serving.complete(bound);
            }
          } catch (JsonException notJson) {
            // keep reading
          }
        }
      } catch (IOException gone) {
        // the process went away
      } finally {
        serving.completeExceptionally(new IllegalStateException("idemd exited"));
      }
    }, "idemd-log");
    reader.setDaemon(true);
    reader.start();
    address = serving.get(30, TimeUnit.SECONDS);
  }

  static Path root() {
    return Path.of(System.getProperty("idemd.repo.root", "../../..")).toAbsolutePath().normalize();
  }

  @Override
  public void close() throws InterruptedException {
    process.destroy();
    if (!process.waitFor(10, TimeUnit.SECONDS)) {
      process.destroyForcibly();
    }
  }
}
