package dev.idemd.client;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;

/**
 * The request an execution is about: what the fingerprint is computed from. The server (or {@link
 * Fingerprint} locally) hashes the method, the path and the body, canonicalized when the content
 * type is JSON.
 *
 * @param method HTTP method (letters only; compared case-insensitively)
 * @param path request path, hashed byte for byte (include the query string or not, but the same way
 *     on every retry)
 * @param contentType media type; {@code application/json} and {@code +json} types select JSON
 *     canonicalization
 * @param body request body
 * @param ignoreFields JSON Pointers of volatile fields dropped before hashing
 */
public record HttpRequestSpec(
    String method, String path, String contentType, byte[] body, List<String> ignoreFields) {

  /** Creates a request; the body and the list are copied. */
  public HttpRequestSpec {
    Objects.requireNonNull(method, "method");
    Objects.requireNonNull(path, "path");
    Objects.requireNonNull(contentType, "contentType");
    body = Objects.requireNonNull(body, "body").clone();
    ignoreFields = List.copyOf(ignoreFields);
  }

  /** A request with the given body and content type. */
  public static HttpRequestSpec of(String method, String path, String contentType, byte[] body) {
    return new HttpRequestSpec(method, path, contentType, body, List.of());
  }

  /** A request with a JSON body ({@code application/json}). */
  public static HttpRequestSpec json(String method, String path, String body) {
    return of(method, path, "application/json", body.getBytes(StandardCharsets.UTF_8));
  }

  /** This request with JSON Pointers of volatile fields that the fingerprint drops. */
  public HttpRequestSpec withIgnoreFields(List<String> pointers) {
    return new HttpRequestSpec(method, path, contentType, body, pointers);
  }

  /** A copy of the body. */
  @Override
  public byte[] body() {
    return body.clone();
  }

  /** The body length, without copying it. */
  public int bodyLength() {
    return body.length;
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof HttpRequestSpec r
        && method.equals(r.method)
        && path.equals(r.path)
        && contentType.equals(r.contentType)
        && Arrays.equals(body, r.body)
        && ignoreFields.equals(r.ignoreFields);
  }

  @Override
  public int hashCode() {
    return Objects.hash(method, path, contentType, Arrays.hashCode(body), ignoreFields);
  }

  /** Never includes the body (request bodies are not logged). */
  @Override
  public String toString() {
    return "HttpRequestSpec[" + method + " " + path + ", " + contentType + ", "
        + body.length + " bytes]";
  }
}
