package dev.idemd.client.testing;

import static org.junit.jupiter.api.Assertions.fail;

import dev.idemd.client.json.JsonException;
import dev.idemd.client.json.JsonNumber;
import dev.idemd.client.json.StrictJson;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/** Typed access to test data parsed by {@link StrictJson}, failing loudly on anything unexpected. */
public final class Json {
  private Json() {}

  /** Parses a JSON file. */
  public static Object read(Path file) throws IOException {
    try {
      return StrictJson.parse(Files.readAllBytes(file));
    } catch (JsonException e) {
      throw new IllegalStateException(file + ": " + e.getMessage(), e);
    }
  }

  /** Fails when {@code object} has a field outside {@code allowed}. */
  public static void onlyFields(Map<String, Object> object, Set<String> allowed, String what) {
    Set<String> unknown = new TreeSet<>(object.keySet());
    unknown.removeAll(allowed);
    if (!unknown.isEmpty()) {
      fail("unknown " + what + " field(s) " + unknown + " (known: " + new TreeSet<>(allowed) + ")");
    }
  }

  /** The value as an object. */
  @SuppressWarnings("unchecked")
  public static Map<String, Object> object(Object value, String what) {
    if (value instanceof Map<?, ?> map) {
      return (Map<String, Object>) map;
    }
    return fail(what + " must be an object, got " + value);
  }

  /** The value as an array. */
  @SuppressWarnings("unchecked")
  public static List<Object> array(Object value, String what) {
    if (value instanceof List<?> list) {
      return (List<Object>) list;
    }
    return fail(what + " must be an array, got " + value);
  }

  /** A required string field. */
  public static String string(Map<String, Object> object, String field) {
    if (object.get(field) instanceof String s) {
      return s;
    }
    return fail("field '" + field + "' must be a string, got " + object.get(field));
  }

  /** A required integer field. */
  public static int integer(Map<String, Object> object, String field) {
    return integer(object.get(field), "field '" + field + "'");
  }

  /** The value as an integer. */
  public static int integer(Object value, String what) {
    if (value instanceof JsonNumber n) {
      try {
        return n.intValueExact();
      } catch (ArithmeticException e) {
        return fail(what + " must be an integer, got " + n);
      }
    }
    return fail(what + " must be a number, got " + value);
  }

  /** A required boolean field. */
  public static boolean bool(Map<String, Object> object, String field) {
    if (object.get(field) instanceof Boolean b) {
      return b;
    }
    return fail("field '" + field + "' must be a boolean, got " + object.get(field));
  }

  /** A required object field. */
  public static Map<String, Object> object(Map<String, Object> object, String field) {
    return object(object.get(field), "field '" + field + "'");
  }

  /** A required array field. */
  public static List<Object> array(Map<String, Object> object, String field) {
    return array(object.get(field), "field '" + field + "'");
  }
}
