package dev.idemd.client;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.Base64;

/**
 * Idempotency keys for calls a handler makes to third parties (a payment provider) that take their
 * own key: the same on every retry of the operation, different for every step.
 *
 * <pre>
 * downstream_key(key, step) = base64url_nopad(SHA-256(
 *     frame("idemd-downstream-v1") || frame(utf8(key)) || frame(utf8(step))))
 * </pre>
 */
public final class DownstreamKey {
  /** Hashed first, so that these keys never collide with another derivation. */
  public static final String VERSION_TAG = "idemd-downstream-v1";

  private DownstreamKey() {}

  /** The downstream key of {@code step} within the operation identified by {@code key}. */
  public static String derive(String key, String step) {
    MessageDigest sha256 = Fingerprint.sha256();
    for (String part : new String[] {VERSION_TAG, key, step}) {
      byte[] bytes = part.getBytes(StandardCharsets.UTF_8);
      sha256.update(ByteBuffer.allocate(Long.BYTES).putLong(bytes.length).array());
      sha256.update(bytes);
    }
    return Base64.getUrlEncoder().withoutPadding().encodeToString(sha256.digest());
  }
}
