package dev.idemd.client;

import static dev.idemd.client.testing.Json.array;
import static dev.idemd.client.testing.Json.object;
import static dev.idemd.client.testing.Json.onlyFields;
import static dev.idemd.client.testing.Json.string;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.Json;
import dev.idemd.client.testing.RepoPaths;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/** Every vector of proto/testdata/fingerprint-v1.json: digests, canonical bodies, error classes. */
class FingerprintVectorsTest {
  private static final Set<String> VECTOR_FIELDS =
      Set.of(
          "name", "method", "path", "content_type", "body_utf8", "body_hex", "ignore_fields",
          "canonical_body_hex", "sha256_hex", "error");

  @TestFactory
  Stream<DynamicTest> vectors() throws Exception {
    Map<String, Object> file =
        object(
            Json.read(RepoPaths.root().resolve("proto/testdata/fingerprint-v1.json")),
            "fingerprint-v1.json");
    assertEquals("v1", string(file, "version"));
    List<Object> vectors = array(file, "vectors");
    assertTrue(vectors.size() > 30, "expected the full vector set, got " + vectors.size());
    return vectors.stream()
        .map(v -> object(v, "vector"))
        .map(v -> DynamicTest.dynamicTest(string(v, "name"), () -> check(v)));
  }

  private static void check(Map<String, Object> vector) {
    onlyFields(vector, VECTOR_FIELDS, "vector");
    HexFormat hex = HexFormat.of();
    byte[] body =
        vector.containsKey("body_hex")
            ? hex.parseHex(string(vector, "body_hex"))
            : string(vector, "body_utf8").getBytes(StandardCharsets.UTF_8);
    List<String> ignore = new ArrayList<>();
    for (Object pointer : array(vector, "ignore_fields")) {
      ignore.add((String) pointer);
    }
    String method = string(vector, "method");
    String path = string(vector, "path");
    String contentType = string(vector, "content_type");
    HttpRequestSpec request =
        HttpRequestSpec.of(method, path, contentType, body).withIgnoreFields(ignore);
    if (vector.containsKey("error")) {
      FingerprintException e =
          assertThrows(FingerprintException.class, () -> Fingerprint.v1(request));
      assertEquals(string(vector, "error"), e.errorClass().code(), "error class: " + e.getMessage());
      return;
    }
    assertEquals(
        string(vector, "canonical_body_hex"),
        hex.formatHex(Fingerprint.canonicalBody(contentType, body, ignore)),
        "canonical body");
    assertArrayEquals(hex.parseHex(string(vector, "sha256_hex")), Fingerprint.v1(request), "sha256");
  }
}
