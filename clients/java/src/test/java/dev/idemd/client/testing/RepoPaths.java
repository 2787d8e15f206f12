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

  /** The server binary: $IDEMD_BIN, default target/debug/idemd. */
  public static Path idemdBinary() {
    String configured = System.getenv("IDEMD_BIN");
    return configured != null && !configured.isEmpty()
        ? Path.of(configured)
        : root().resolve("target/debug/idemd");
  }
}
