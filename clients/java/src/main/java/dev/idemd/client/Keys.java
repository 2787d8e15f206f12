package dev.idemd.client;

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.HexFormat;

/** Key helpers: the log-safe hash of a key and fresh attempt ids. */
final class Keys {
  private static final SecureRandom RANDOM = new SecureRandom();

  private Keys() {}

  /** First 12 hex digits of SHA-256(key): how keys appear in logs (as on the server), never raw. */
  static String hash(String key) {
    byte[] digest = Fingerprint.sha256().digest(key.getBytes(StandardCharsets.UTF_8));
    return HexFormat.of().formatHex(digest, 0, 6);
  }

  /** 128 random bits, base64url: a Claim's attempt_id. */
  static String newAttemptId() {
    byte[] bytes = new byte[16];
    RANDOM.nextBytes(bytes);
    return Base64.getUrlEncoder().withoutPadding().encodeToString(bytes);
  }
}
