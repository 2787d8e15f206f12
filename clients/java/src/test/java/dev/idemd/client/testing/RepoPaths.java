package dev.idemd.client.testing;

import java.nio.file.Files;
import java.nio.file.Path;

/** Locations in the idemd repository that the tests read. */
public final class RepoPaths {
  private RepoPaths() {}

  /** The repository root (set by Surefire; found by walking up from the working directory otherwise). */
  public static Path root() {
    String configured = System.getProperty("idemd.repo.root");
    if (configured != null && !configured.isEmpty()) {
      return Path.of(configured).toAbsolutePath().normalize();
    }
    for (Path dir = Path.of("").toAbsolutePath(); dir != null; dir = dir.getParent()) {
      if (Files.isDirectory(dir.resolve("proto/idemd/v1"))
          && Files.isDirectory(dir.resolve("clients/conformance"))) {
        return dir;
      }
    }
    throw new IllegalStateException("cannot find the idemd repository root");
  }

  /** clients/conformance/ */
  public static Path conformance() {
    return root().resolve("clients/conformance");
  }

  /** clients/java/ */
  public static Path sdk() {
    return root().resolve("clients/java");
  }

  /**
   * The directory of the TLS test certificates: $IDEMD_TEST_CERTS. Missing, it fails the caller
   * rather than skipping it, so a TLS test never passes by not running.
   */
  public static Path testCerts() {
    String configured = System.getenv("IDEMD_TEST_CERTS");
    if (configured == null || configured.isEmpty()) {
      throw new IllegalStateException(
          "IDEMD_TEST_CERTS is not set: run `make test-certs` and set IDEMD_TEST_CERTS to the"
              + " directory it writes ($CARGO_TARGET_DIR/test-certs)");
    }
    Path dir = Path.of(configured);
    if (!Files.isRegularFile(dir.resolve("client-tenants.txt"))) {
      throw new IllegalStateException(
          "IDEMD_TEST_CERTS=" + configured + " has no certificates: run `make test-certs`");
    }
    return dir;
  }

  /** The server binary: $IDEMD_BIN, default target/debug/idemd. */
  public static Path idemdBinary() {
    String configured = System.getenv("IDEMD_BIN");
    return configured != null && !configured.isEmpty()
        ? Path.of(configured)
        : root().resolve("target/debug/idemd");
  }
}
