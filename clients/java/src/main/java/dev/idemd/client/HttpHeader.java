package dev.idemd.client;

import java.util.Objects;

/** One HTTP header line; a response keeps its headers in order, repeats included. */
public record HttpHeader(String name, String value) {
  /** Creates a header. */
  public HttpHeader {
    Objects.requireNonNull(name, "name");
    Objects.requireNonNull(value, "value");
  }
}
