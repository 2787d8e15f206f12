package dev.idemd.client.json;

import java.math.BigDecimal;
import java.util.Objects;

/**
 * A JSON number with its exact decimal value. Two numbers are equal when their values are equal
 * ({@code 4200}, {@code 4200.0} and {@code 4.2e3} are one number); no binary floating point is
 * involved anywhere.
 */
public final class JsonNumber {
  private final String text;
  private final String canonical;

  JsonNumber(String text, String canonical) {
    this.text = text;
    this.canonical = canonical;
  }

  /**
   * Parses one JSON number (RFC 8259 grammar, exponent magnitude at most 10^9).
   *
   * @throws IllegalArgumentException if {@code text} is not exactly one JSON number
   */
  public static JsonNumber of(String text) {
    try {
      Object value = StrictJson.parse(text);
      if (value instanceof JsonNumber number) {
        return number;
      }
    } catch (JsonException e) {
      throw new IllegalArgumentException("not a JSON number: " + e.getMessage(), e);
    }
    throw new IllegalArgumentException("not a JSON number");
  }

  /** The number as it was written in the document. */
  public String text() {
    return text;
  }

  /**
   * The canonical form of fingerprint v1: an optional {@code -}, the significant digits without
   * leading or trailing zeros, and {@code e<exponent>} when the exponent is not zero; zero is
   * {@code 0}. Example: {@code 4200} → {@code 42e2}, {@code 0.5} → {@code 5e-1}.
   */
  public String canonical() {
    return canonical;
  }

  /** The exact value. */
  public BigDecimal toBigDecimal() {
    return new BigDecimal(text);
  }

  /**
   * The value as a {@code long}.
   *
   * @throws ArithmeticException if it has a fractional part or does not fit
   */
  public long longValueExact() {
    return toBigDecimal().longValueExact();
  }

  /**
   * The value as an {@code int}.
   *
   * @throws ArithmeticException if it has a fractional part or does not fit
   */
  public int intValueExact() {
    return toBigDecimal().intValueExact();
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof JsonNumber number && canonical.equals(number.canonical);
  }

  @Override
  public int hashCode() {
    return Objects.hash(canonical);
  }

  @Override
  public String toString() {
    return text;
  }
}
