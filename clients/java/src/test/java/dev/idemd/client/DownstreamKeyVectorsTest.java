package dev.idemd.client;

import static dev.idemd.client.testing.Json.array;
import static dev.idemd.client.testing.Json.object;
import static dev.idemd.client.testing.Json.onlyFields;
import static dev.idemd.client.testing.Json.string;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.Json;
import dev.idemd.client.testing.RepoPaths;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.IntStream;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/** Every vector of clients/conformance/downstream-key-v1.json. */
class DownstreamKeyVectorsTest {
  @TestFactory
  Stream<DynamicTest> vectors() throws Exception {
    Map<String, Object> file =
        object(
            Json.read(RepoPaths.conformance().resolve("downstream-key-v1.json")),
            "downstream-key-v1.json");
    assertEquals("v1", string(file, "version"));
    List<Object> vectors = array(file, "vectors");
    assertFalse(vectors.isEmpty());
    return IntStream.range(0, vectors.size())
        .mapToObj(
            i -> {
              Map<String, Object> v = object(vectors.get(i), "vector");
              return DynamicTest.dynamicTest(
                  "vector " + i,
                  () -> {
                    onlyFields(v, Set.of("key", "step", "downstream_key"), "vector");
                    String derived = DownstreamKey.derive(string(v, "key"), string(v, "step"));
                    assertEquals(string(v, "downstream_key"), derived);
                    assertEquals(derived, IdemdClient.downstreamKey(string(v, "key"), string(v, "step")));
                    assertEquals(43, derived.length());
                    assertTrue(derived.matches("[A-Za-z0-9_-]{43}"));
                  });
            });
  }
}
