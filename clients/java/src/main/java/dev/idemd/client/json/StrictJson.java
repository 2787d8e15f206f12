package dev.idemd.client.json;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A strict RFC 8259 JSON parser and the canonical serializer of fingerprint v1 ({@code
 * docs/fingerprint.md}).
 *
 * <p>Generic JSON libraries accept what the fingerprint must refuse (duplicate member names,
 * unbounded nesting) and turn numbers into binary floating point; this parser keeps every number's
 * exact decimal value, refuses duplicate names and nesting beyond {@link #MAX_DEPTH}, and validates
 * UTF-8.
 *
 * <p>Values are plain Java objects: {@code Map<String, Object>} (members in document order), {@code
 * List<Object>}, {@link String}, {@link JsonNumber}, {@link Boolean} and {@code null}. The returned
 * containers are mutable so that callers (such as the fingerprint's JSON Pointer removal) can edit
 * them.
 */
public final class StrictJson {
  /** Deepest accepted nesting of arrays and objects (the outermost counts as 1). */
  public static final int MAX_DEPTH = 128;

  /** Largest accepted magnitude of a written exponent. */
  static final long MAX_EXPONENT_MAGNITUDE = 1_000_000_000L;

  /** Orders member names by their UTF-8 bytes, which is code point order (not UTF-16 order). */
  public static final Comparator<String> NAME_ORDER = StrictJson::compareCodePoints;

  private StrictJson() {}

  /** Parses a complete document (UTF-8, no byte-order mark, nothing after the value). */
  public static Object parse(byte[] document) throws JsonException {
    Parser parser = new Parser(document);
    parser.skipWhitespace();
    Object value = parser.parseValue(0);
    parser.skipWhitespace();
    if (parser.pos != document.length) {
      throw parser.malformed("unexpected data after the JSON value");
    }
    return value;
  }

  /** Parses a complete document given as text. */
  public static Object parse(String document) throws JsonException {
    return parse(document.getBytes(StandardCharsets.UTF_8));
  }

  /**
   * Serializes a value canonically: no whitespace, object members sorted by the UTF-8 bytes of
   * their names, minimal string escapes, numbers in canonical decimal form.
   *
   * @throws IllegalArgumentException for a value that is not a JSON value of this model (or a
   *     string with an unpaired surrogate)
   */
  public static byte[] canonicalize(Object value) {
    StringBuilder out = new StringBuilder();
    write(out, value);
    return out.toString().getBytes(StandardCharsets.UTF_8);
  }

  /** {@link #canonicalize} as a string. */
  public static String canonicalString(Object value) {
    return new String(canonicalize(value), StandardCharsets.UTF_8);
  }

  private static void write(StringBuilder out, Object value) {
    if (value == null) {
      out.append("null");
    } else if (value instanceof Boolean b) {
      out.append(b ? "true" : "false");
    } else if (value instanceof JsonNumber n) {
      out.append(n.canonical());
    } else if (value instanceof String s) {
      writeString(out, s);
    } else if (value instanceof List<?> list) {
      out.append('[');
      for (int i = 0; i < list.size(); i++) {
        if (i > 0) {
          out.append(',');
        }
        write(out, list.get(i));
      }
      out.append(']');
    } else if (value instanceof Map<?, ?> map) {
      List<String> names = new ArrayList<>(map.size());
      for (Object name : map.keySet()) {
        if (!(name instanceof String s)) {
          throw new IllegalArgumentException("object member names must be strings");
        }
        names.add(s);
      }
      names.sort(NAME_ORDER);
      out.append('{');
      for (int i = 0; i < names.size(); i++) {
        if (i > 0) {
          out.append(',');
        }
        writeString(out, names.get(i));
        out.append(':');
        write(out, map.get(names.get(i)));
      }
      out.append('}');
    } else {
      throw new IllegalArgumentException("not a JSON value: " + value.getClass().getName());
    }
  }

  private static void writeString(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else if (Character.isHighSurrogate(c)
              && i + 1 < s.length()
              && Character.isLowSurrogate(s.charAt(i + 1))) {
            out.append(c).append(s.charAt(++i));
          } else if (Character.isSurrogate(c)) {
            throw new IllegalArgumentException("string contains an unpaired surrogate");
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  static int compareCodePoints(String a, String b) {
    int i = 0;
    int j = 0;
    while (i < a.length() && j < b.length()) {
      int ca = a.codePointAt(i);
      int cb = b.codePointAt(j);
      if (ca != cb) {
        return Integer.compare(ca, cb);
      }
      i += Character.charCount(ca);
      j += Character.charCount(cb);
    }
    return Integer.compare(a.length() - i, b.length() - j);
  }

  /**
   * The canonical text of a number with the given digits: value = digits(int ++ frac) × 10^(exponent
   * - len(frac)).
   */
  static String canonicalNumber(boolean negative, String intDigits, String fracDigits, long exponent) {
    String digits = intDigits + fracDigits;
    long exp = exponent - fracDigits.length();
    int start = 0;
    while (start < digits.length() && digits.charAt(start) == '0') {
      start++;
    }
    if (start == digits.length()) {
      return "0";
    }
    int end = digits.length();
    while (end > start && digits.charAt(end - 1) == '0') {
      end--;
      exp++;
    }
    StringBuilder out = new StringBuilder(end - start + 24);
    if (negative) {
      out.append('-');
    }
    out.append(digits, start, end);
    if (exp != 0) {
      out.append('e').append(exp);
    }
    return out.toString();
  }

  private static final class Parser {
    private final byte[] in;
    private int pos;

    Parser(byte[] in) {
      this.in = in;
    }

    JsonException malformed(String reason) {
      return new JsonException(JsonException.Kind.MALFORMED_JSON, pos, reason);
    }

    int peek() {
      return pos < in.length ? in[pos] & 0xFF : -1;
    }

    void skipWhitespace() {
      while (pos < in.length) {
        byte b = in[pos];
        if (b == ' ' || b == '\t' || b == '\n' || b == '\r') {
          pos++;
        } else {
          return;
        }
      }
    }

    Object parseValue(int depth) throws JsonException {
      int c = peek();
      switch (c) {
        case -1:
          throw malformed("unexpected end of input");
        case '{':
          return parseObject(depth + 1);
        case '[':
          return parseArray(depth + 1);
        case '"':
          return parseString();
        case 't':
          return literal("true", Boolean.TRUE);
        case 'f':
          return literal("false", Boolean.FALSE);
        case 'n':
          return literal("null", null);
        default:
          if (c == '-' || (c >= '0' && c <= '9')) {
            return parseNumber();
          }
          throw malformed("unexpected character");
      }
    }

    private Object literal(String word, Object value) throws JsonException {
      if (pos + word.length() > in.length) {
        throw malformed("invalid literal");
      }
      for (int i = 0; i < word.length(); i++) {
        if (in[pos + i] != word.charAt(i)) {
          throw malformed("invalid literal");
        }
      }
      pos += word.length();
      return value;
    }

    private Map<String, Object> parseObject(int depth) throws JsonException {
      if (depth > MAX_DEPTH) {
        throw new JsonException(
            JsonException.Kind.TOO_DEEP, pos, "nesting deeper than " + MAX_DEPTH + " levels");
      }
      pos++; // '{'
      Map<String, Object> members = new LinkedHashMap<>();
      skipWhitespace();
      if (peek() == '}') {
        pos++;
        return members;
      }
      while (true) {
        skipWhitespace();
        if (peek() != '"') {
          throw malformed("expected a string object key");
        }
        int nameOffset = pos;
        String name = parseString();
        if (members.containsKey(name)) {
          throw new JsonException(JsonException.Kind.DUPLICATE_KEY, nameOffset, "duplicate key");
        }
        skipWhitespace();
        if (peek() != ':') {
          throw malformed("expected ':' after object key");
        }
        pos++;
        skipWhitespace();
        members.put(name, parseValue(depth));
        skipWhitespace();
        int c = peek();
        if (c == ',') {
          pos++;
        } else if (c == '}') {
          pos++;
          return members;
        } else {
          throw malformed("expected ',' or '}' in object");
        }
      }
    }

    private List<Object> parseArray(int depth) throws JsonException {
      if (depth > MAX_DEPTH) {
        throw new JsonException(
            JsonException.Kind.TOO_DEEP, pos, "nesting deeper than " + MAX_DEPTH + " levels");
      }
      pos++; // '['
      List<Object> elements = new ArrayList<>();
      skipWhitespace();
      if (peek() == ']') {
        pos++;
        return elements;
      }
      while (true) {
        skipWhitespace();
        elements.add(parseValue(depth));
        skipWhitespace();
        int c = peek();
        if (c == ',') {
          pos++;
        } else if (c == ']') {
          pos++;
          return elements;
        } else {
          throw malformed("expected ',' or ']' in array");
        }
      }
    }

    private String parseString() throws JsonException {
      pos++; // opening quote
      StringBuilder out = new StringBuilder();
      while (true) {
        int b = peek();
        if (b == -1) {
          throw malformed("unterminated string");
        }
        if (b == '"') {
          pos++;
          return out.toString();
        }
        if (b == '\\') {
          pos++;
          out.appendCodePoint(parseEscape());
        } else if (b < 0x20) {
          throw malformed("unescaped control character in string");
        } else if (b < 0x80) {
          out.append((char) b);
          pos++;
        } else {
          out.appendCodePoint(decodeUtf8(b));
        }
      }
    }

    /** Decodes one multi-byte UTF-8 sequence (RFC 3629: no overlongs, no surrogates). */
    private int decodeUtf8(int lead) throws JsonException {
      int width;
      int min;
      int max;
      int code;
      if (lead >= 0xC2 && lead <= 0xDF) {
        width = 2;
        code = lead & 0x1F;
        min = 0x80;
        max = 0xBF;
      } else if (lead >= 0xE0 && lead <= 0xEF) {
        width = 3;
        code = lead & 0x0F;
        min = lead == 0xE0 ? 0xA0 : 0x80;
        max = lead == 0xED ? 0x9F : 0xBF;
      } else if (lead >= 0xF0 && lead <= 0xF4) {
        width = 4;
        code = lead & 0x07;
        min = lead == 0xF0 ? 0x90 : 0x80;
        max = lead == 0xF4 ? 0x8F : 0xBF;
      } else {
        throw malformed("invalid UTF-8 in string");
      }
      if (pos + width > in.length) {
        throw malformed("invalid UTF-8 in string");
      }
      for (int i = 1; i < width; i++) {
        int cont = in[pos + i] & 0xFF;
        int lo = i == 1 ? min : 0x80;
        int hi = i == 1 ? max : 0xBF;
        if (cont < lo || cont > hi) {
          throw malformed("invalid UTF-8 in string");
        }
        code = (code << 6) | (cont & 0x3F);
      }
      pos += width;
      return code;
    }

    private int parseEscape() throws JsonException {
      int b = peek();
      if (b == -1) {
        throw malformed("unterminated escape");
      }
      pos++;
      switch (b) {
        case '"':
          return '"';
        case '\\':
          return '\\';
        case '/':
          return '/';
        case 'b':
          return '\b';
        case 'f':
          return '\f';
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case 'u':
          int first = parseHex4();
          if (first >= 0xD800 && first <= 0xDBFF) {
            if (pos + 2 > in.length || in[pos] != '\\' || in[pos + 1] != 'u') {
              throw malformed("unpaired surrogate escape");
            }
            pos += 2;
            int second = parseHex4();
            if (second < 0xDC00 || second > 0xDFFF) {
              throw malformed("unpaired surrogate escape");
            }
            return 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
          }
          if (first >= 0xDC00 && first <= 0xDFFF) {
            throw malformed("unpaired surrogate escape");
          }
          return first;
        default:
          throw malformed("invalid escape");
      }
    }

    private int parseHex4() throws JsonException {
      if (pos + 4 > in.length) {
        throw malformed("truncated \\u escape");
      }
      int code = 0;
      for (int i = 0; i < 4; i++) {
        int digit = Character.digit(in[pos + i] & 0xFF, 16);
        if (digit < 0 || (in[pos + i] & 0x80) != 0) {
          throw malformed("invalid \\u escape");
        }
        code = code * 16 + digit;
      }
      pos += 4;
      return code;
    }

    private JsonNumber parseNumber() throws JsonException {
      int start = pos;
      boolean negative = peek() == '-';
      if (negative) {
        pos++;
      }
      int intStart = pos;
      int c = peek();
      if (c == '0') {
        pos++;
      } else if (c >= '1' && c <= '9') {
        while (isDigit(peek())) {
          pos++;
        }
      } else {
        throw malformed("invalid number");
      }
      String intDigits = ascii(intStart, pos);
      String fracDigits = "";
      if (peek() == '.') {
        pos++;
        int fracStart = pos;
        while (isDigit(peek())) {
          pos++;
        }
        if (pos == fracStart) {
          throw malformed("invalid number: no digits after '.'");
        }
        fracDigits = ascii(fracStart, pos);
      }
      long exponent = 0;
      if (peek() == 'e' || peek() == 'E') {
        pos++;
        boolean expNegative = false;
        if (peek() == '-') {
          expNegative = true;
          pos++;
        } else if (peek() == '+') {
          pos++;
        }
        int expStart = pos;
        long magnitude = 0;
        while (isDigit(peek())) {
          magnitude = magnitude * 10 + (peek() - '0');
          if (magnitude > MAX_EXPONENT_MAGNITUDE) {
            throw malformed("number exponent out of range");
          }
          pos++;
        }
        if (pos == expStart) {
          throw malformed("invalid number: no digits in exponent");
        }
        exponent = expNegative ? -magnitude : magnitude;
      }
      return new JsonNumber(
          ascii(start, pos), canonicalNumber(negative, intDigits, fracDigits, exponent));
    }

    private static boolean isDigit(int c) {
      return c >= '0' && c <= '9';
    }

    private String ascii(int from, int to) {
      return new String(in, from, to - from, StandardCharsets.US_ASCII);
    }
  }
}
