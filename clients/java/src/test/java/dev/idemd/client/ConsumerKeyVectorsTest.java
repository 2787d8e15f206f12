package dev.idemd.client;

import static dev.idemd.client.testing.Json.array;
import static dev.idemd.client.testing.Json.integer;
import static dev.idemd.client.testing.Json.object;
import static dev.idemd.client.testing.Json.string;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.json.JsonNumber;
import dev.idemd.client.testing.Json;
import dev.idemd.client.testing.RepoPaths;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The consumer helper's key (the key header, the last of a repeated name; or the position) and the
 * fingerprint its claims carry, against clients/conformance/consumer-key-v1.json, which every SDK
 * reads: a message one SDK consumed is a duplicate to the others only if all of them agree.
 */
class ConsumerKeyVectorsTest {
  @TestFactory
  Stream<DynamicTest> vectors() throws Exception {
    Map<String, Object> file =
        object(Json.read(RepoPaths.conformance().resolve("consumer-key-v1.json")), "consumer-key-v1.json");
    assertEquals(1, integer(file, "version"));
    String keyHeader = string(file, "key_header");
    List<Object> vectors = array(file, "vectors");
    assertFalse(vectors.isEmpty());
    return vectors.stream()
        .map(raw -> object(raw, "vector"))
        .map(
            v ->
                DynamicTest.dynamicTest(
                    string(v, "name"),
                    () -> {
                      long offset = ((JsonNumber) v.get("offset")).longValueExact();
                      Message message =
                          Message.of(
                              string(v, "topic"),
                              integer(v, "partition"),
                              offset,
                              HexFormat.of().parseHex(string(v, "value_hex")));
                      for (Object header : array(v, "headers")) {
                        List<Object> pair = array(header, "header");
                        message = message.withHeader((String) pair.get(0), (String) pair.get(1));
                      }
                      Optional<String> fromHeader =
                          message
                              .header(keyHeader)
                              .map(b -> new String(b, StandardCharsets.UTF_8))
                              .filter(s -> !s.isEmpty());
                      Object want = v.get("key_from_header");
                      if (want == null) {
                        assertTrue(fromHeader.isEmpty(), "no key from the header: " + fromHeader);
                      } else {
                        assertEquals(want, fromHeader.orElse(null));
                      }
                      assertEquals(string(v, "key_from_position"), MessageProcessor.positionKey(message));
                      byte[] digest =
                          Fingerprint.v1(
                              HttpRequestSpec.of("CONSUME", string(v, "endpoint"), "", message.valueUnsafe()));
                      assertEquals(string(v, "fingerprint_hex"), HexFormat.of().formatHex(digest));
                    }));
  }
}
