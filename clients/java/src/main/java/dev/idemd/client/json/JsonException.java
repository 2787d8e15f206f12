package dev.idemd.client.json;

/** A document that {@link StrictJson} refuses, with the class of the problem. */
public final class JsonException extends Exception {
  private static final long serialVersionUID = 1L;

  /** Why a document was refused. */
  public enum Kind {
    /** Not well-formed RFC 8259 JSON. */
    MALFORMED_JSON,
    /** An object repeats a member name (compared after unescaping). */
    DUPLICATE_KEY,
    /** Arrays and objects nested deeper than {@link StrictJson#MAX_DEPTH}. */
    TOO_DEEP
  }

  private final Kind kind;
  private final int offset;

  JsonException(Kind kind, int offset, String reason) {
    super(reason + " at byte " + offset);
    this.kind = kind;
    this.offset = offset;
  }

  /** The class of the problem. */
  public Kind kind() {
    return kind;
  }

  /** Byte offset of the problem in the document. */
  public int offset() {
    return offset;
  }
}
