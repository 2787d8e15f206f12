package dev.idemd.client;

import dev.idemd.client.json.JsonException;
import dev.idemd.client.json.JsonPointer;
import dev.idemd.client.json.StrictJson;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Fingerprint v1, computed locally exactly as the server computes it ({@code docs/fingerprint.md}).
 *
 * <pre>
 * fingerprint = SHA-256( frame("idemd-fingerprint-v1") || frame(ASCII-uppercase(method))
 *                     || frame(path) || frame(canonical_body) )
 * frame(x)    = 8-byte big-endian length of x || x
 * </pre>
 *
 * <p>Send it as {@code ClaimRequest.sha256} instead of the request (required for bodies over 1
 * MiB, which the server does not accept). The endpoint policy's {@code ignore_fields} are not
 * known locally: include them in the request's {@code ignoreFields} so that both sides drop the
 * same fields.
 */
public final class Fingerprint {
  /** Hashed first, so that a future v2 never collides with v1. */
  public static final String VERSION_TAG = "idemd-fingerprint-v1";

  /** Length of a fingerprint in bytes. */
  public static final int LENGTH = 32;

  /** Most {@code ignore_fields} entries accepted. */
  public static final int MAX_IGNORE_FIELDS = 64;

  /** Longest accepted {@code ignore_fields} entry, in UTF-8 bytes. */
  public static final int MAX_POINTER_BYTES = 1024;

  private Fingerprint() {}

  /** Fingerprint v1 of a request. */
  public static byte[] v1(HttpRequestSpec request) {
    return v1(
        request.method(),
        request.path(),
        request.contentType(),
        request.body(),
        request.ignoreFields());
  }

  /**
   * Fingerprint v1 of a request given by its parts.
   *
   * @throws FingerprintException if the JSON body or an ignore_fields entry is refused
   */
  public static byte[] v1(
      String method, String path, String contentType, byte[] body, List<String> ignoreFields) {
    byte[] canonical = canonicalBody(contentType, body, ignoreFields);
    MessageDigest sha256 = sha256();
    for (byte[] part :
        new byte[][] {
          VERSION_TAG.getBytes(StandardCharsets.UTF_8),
          asciiUppercase(method).getBytes(StandardCharsets.UTF_8),
          path.getBytes(StandardCharsets.UTF_8),
          canonical
        }) {
      sha256.update(ByteBuffer.allocate(Long.BYTES).putLong(part.length).array());
      sha256.update(part);
    }
    return sha256.digest();
  }

  /**
   * The body as fingerprint v1 hashes it: canonical JSON for a non-empty body of a JSON media type
   * ({@code application/json} or any {@code +json} type), the body as sent otherwise.
   *
   * @throws FingerprintException if the JSON body or an ignore_fields entry is refused
   */
  public static byte[] canonicalBody(String contentType, byte[] body, List<String> ignoreFields) {
    List<List<String>> pointers = parsePointers(ignoreFields);
    if (body.length == 0 || !isJsonContentType(contentType)) {
      return body.clone();
    }
    Object document;
    try {
      document = StrictJson.parse(body);
    } catch (JsonException e) {
      FingerprintException.ErrorClass errorClass =
          switch (e.kind()) {
            case MALFORMED_JSON -> FingerprintException.ErrorClass.MALFORMED_JSON;
            case DUPLICATE_KEY -> FingerprintException.ErrorClass.DUPLICATE_KEY;
            case TOO_DEEP -> FingerprintException.ErrorClass.TOO_DEEP;
          };
      throw new FingerprintException(errorClass, "request body: " + e.getMessage(), e);
    }
    JsonPointer.removeAll(document, pointers);
    return StrictJson.canonicalize(document);
  }

  /**
   * True for {@code application/json} and {@code type/subtype+json} media types, parameters such
   * as {@code ; charset=utf-8} ignored, case-insensitive.
   */
  public static boolean isJsonContentType(String contentType) {
    int semicolon = contentType.indexOf(';');
    String essence =
        (semicolon < 0 ? contentType : contentType.substring(0, semicolon))
            .strip()
            .toLowerCase(Locale.ROOT);
    return essence.equals("application/json")
        || (essence.contains("/") && essence.endsWith("+json"));
  }

  private static List<List<String>> parsePointers(List<String> ignoreFields) {
    if (ignoreFields.size() > MAX_IGNORE_FIELDS) {
      throw new FingerprintException(
          FingerprintException.ErrorClass.INVALID_POINTER,
          "ignore_fields: " + ignoreFields.size() + " entries; the limit is " + MAX_IGNORE_FIELDS,
          null);
    }
    List<List<String>> pointers = new ArrayList<>(ignoreFields.size());
    for (int i = 0; i < ignoreFields.size(); i++) {
      String pointer = ignoreFields.get(i);
      if (pointer.getBytes(StandardCharsets.UTF_8).length > MAX_POINTER_BYTES) {
        throw new FingerprintException(
            FingerprintException.ErrorClass.INVALID_POINTER,
            "ignore_fields[" + i + "] is longer than " + MAX_POINTER_BYTES + " bytes",
            null);
      }
      try {
        pointers.add(JsonPointer.parse(pointer));
      } catch (JsonPointer.InvalidPointerException e) {
        throw new FingerprintException(
            FingerprintException.ErrorClass.INVALID_POINTER,
            "ignore_fields[" + i + "] " + e.getMessage(),
            e);
      }
    }
    return pointers;
  }

  static String asciiUppercase(String s) {
    StringBuilder out = new StringBuilder(s.length());
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      out.append(c >= 'a' && c <= 'z' ? (char) (c - ('a' - 'A')) : c);
    }
    return out.toString();
  }

  static MessageDigest sha256() {
    try {
      return MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("SHA-256 is required of every Java platform", e);
    }
  }
}
