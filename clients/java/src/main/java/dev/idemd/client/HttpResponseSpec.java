package dev.idemd.client;

import com.google.protobuf.ByteString;
import dev.idemd.v1.Header;
import dev.idemd.v1.StoredResponse;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import java.util.Optional;

/**
 * A response as an HTTP front end sends it: what a handler returns, what idemd stores, and what it
 * replays byte for byte.
 *
 * @param status HTTP status (100..599)
 * @param headers headers in order, repeats kept
 * @param body body bytes
 * @param bodyRef optional pointer to a body kept elsewhere (empty when unused)
 */
public record HttpResponseSpec(int status, List<HttpHeader> headers, byte[] body, String bodyRef) {

  /** Creates a response; the body and the list are copied. */
  public HttpResponseSpec {
    if (status < 100 || status > 599) {
      throw new IllegalArgumentException("status must be in 100..599, got " + status);
    }
    headers = List.copyOf(headers);
    body = Objects.requireNonNull(body, "body").clone();
    Objects.requireNonNull(bodyRef, "bodyRef");
  }

  /** A response with the given headers and body. */
  public static HttpResponseSpec of(int status, List<HttpHeader> headers, byte[] body) {
    return new HttpResponseSpec(status, headers, body, "");
  }

  /** A JSON response ({@code Content-Type: application/json}). */
  public static HttpResponseSpec json(int status, String body) {
    return of(
        status,
        List.of(new HttpHeader("Content-Type", "application/json")),
        body.getBytes(StandardCharsets.UTF_8));
  }

  /** The first value of a header, by case-insensitive name. */
  public Optional<String> header(String name) {
    return headers.stream()
        .filter(h -> h.name().equalsIgnoreCase(name))
        .map(HttpHeader::value)
        .findFirst();
  }

  /** A copy of the body. */
  @Override
  public byte[] body() {
    return body.clone();
  }

  /** The body decoded as UTF-8. */
  public String bodyText() {
    return new String(body, StandardCharsets.UTF_8);
  }

  StoredResponse toProto() {
    StoredResponse.Builder b =
        StoredResponse.newBuilder()
            .setStatus(status)
            .setBody(ByteString.copyFrom(body))
            .setBodyRef(bodyRef);
    for (HttpHeader h : headers) {
      b.addHeaders(Header.newBuilder().setName(h.name()).setValue(h.value()));
    }
    return b.build();
  }

  static HttpResponseSpec fromProto(StoredResponse stored) {
    List<HttpHeader> headers = new ArrayList<>(stored.getHeadersCount());
    for (Header h : stored.getHeadersList()) {
      headers.add(new HttpHeader(h.getName(), h.getValue()));
    }
    return new HttpResponseSpec(
        stored.getStatus(), headers, stored.getBody().toByteArray(), stored.getBodyRef());
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof HttpResponseSpec r
        && status == r.status
        && headers.equals(r.headers)
        && Arrays.equals(body, r.body)
        && bodyRef.equals(r.bodyRef);
  }

  @Override
  public int hashCode() {
    return Objects.hash(status, headers, Arrays.hashCode(body), bodyRef);
  }

  /** Never includes the body. */
  @Override
  public String toString() {
    return "HttpResponseSpec[" + status + ", " + headers.size() + " headers, "
        + body.length + " bytes]";
  }
}
