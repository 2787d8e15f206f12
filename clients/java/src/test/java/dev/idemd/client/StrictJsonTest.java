package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.idemd.client.json.JsonException;
import dev.idemd.client.json.JsonNumber;
import dev.idemd.client.json.StrictJson;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Edge cases of the strict parser beyond the shared vectors. */
class StrictJsonTest {
  private static JsonException.Kind refused(byte[] document) {
    return assertThrows(JsonException.class, () -> StrictJson.parse(document)).kind();
  }

  private static JsonException.Kind refused(String document) {
    return refused(document.getBytes(java.nio.charset.StandardCharsets.UTF_8));
  }

  @Test
  void numbersKeepTheirExactValue() throws Exception {
    assertEquals("42e2", JsonNumber.of("4200").canonical());
    assertEquals("42e2", JsonNumber.of("4.2e3").canonical());
    assertEquals("5e-1", JsonNumber.of("0.5").canonical());
    assertEquals("-1234e-1", JsonNumber.of("-12.340e+1").canonical());
    assertEquals("9007199254740993", JsonNumber.of("9007199254740993").canonical());
    assertEquals("0", JsonNumber.of("-0.000e5").canonical());
    assertEquals("1e1000000000", JsonNumber.of("1e1000000000").canonical());
    assertEquals("1e-999999999", JsonNumber.of("10e-1000000000").canonical());
    assertEquals(JsonNumber.of("4200"), JsonNumber.of("42e2"));
  }

  @Test
  void exponentsBeyondTheLimitAreMalformed() {
    assertEquals(JsonException.Kind.MALFORMED_JSON, refused("1e1000000001"));
    assertEquals(JsonException.Kind.MALFORMED_JSON, refused("1e-99999999999999999999999"));
  }

  @Test
  void strictGrammar() {
    for (String bad :
        List.of(
            "", " ", "[1,]", "{\"a\":1,}", "[.5]", "[1.]", "[1e]", "[+1]", "[-]", "[Infinity]",
            "[\"a\nb\"]", "[\"\\x\"]", "[\"\\ud800\\u0041\"]", "[\"\\udc00\"]", "tru", "nul",
            "{\"a\" 1}", "{1:2}", "[1 2]", "\"abc")) {
      assertEquals(JsonException.Kind.MALFORMED_JSON, refused(bad), bad);
    }
  }

  @Test
  void utf8IsValidated() {
    byte[] bom = {(byte) 0xEF, (byte) 0xBB, (byte) 0xBF, '[', ']'};
    assertEquals(JsonException.Kind.MALFORMED_JSON, refused(bom));
    byte[] overlong = {'"', (byte) 0xC0, (byte) 0xAF, '"'};
    assertEquals(JsonException.Kind.MALFORMED_JSON, refused(overlong));
    byte[] surrogate = {'"', (byte) 0xED, (byte) 0xA0, (byte) 0x80, '"'};
    assertEquals(JsonException.Kind.MALFORMED_JSON, refused(surrogate));
    byte[] truncated = {'"', (byte) 0xE2, (byte) 0x82, '"'};
    assertEquals(JsonException.Kind.MALFORMED_JSON, refused(truncated));
  }

  @Test
  void depthIsBoundedBeforeTheRestIsRead() {
    String deep = "[".repeat(StrictJson.MAX_DEPTH + 1);
    assertEquals(JsonException.Kind.TOO_DEEP, refused(deep));
  }

  @Test
  void membersSortByCodePointNotUtf16() throws Exception {
    // U+FF21 sorts before U+1F600 by code point (and UTF-8 bytes), after it in UTF-16.
    Object value = StrictJson.parse("{\"\uD83D\uDE00\":1,\"\uFF21\":2}");
    assertEquals("{\"\uFF21\":2,\"\uD83D\uDE00\":1}", StrictJson.canonicalString(value));
  }

  @Test
  void controlCharactersAreEscapedMinimally() throws Exception {
    Object value = StrictJson.parse("\"\\u0000\\u001f\\u007f\\/\"");
    assertEquals("\"\\u0000\\u001f\u007f/\"", StrictJson.canonicalString(value));
  }
}
