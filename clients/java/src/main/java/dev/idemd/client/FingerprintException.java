package dev.idemd.client;

/**
 * A request whose fingerprint v1 cannot be computed (the server refuses the same request with
 * {@code INVALID_ARGUMENT}).
 */
public final class FingerprintException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;

  /** The error classes of {@code docs/fingerprint.md}. */
  public enum ErrorClass {
    /** The JSON body is not well-formed. */
    MALFORMED_JSON("malformed_json"),
    /** An object in the JSON body repeats a member name. */
    DUPLICATE_KEY("duplicate_key"),
    /** The JSON body nests deeper than 128 levels. */
    TOO_DEEP("too_deep"),
    /** An {@code ignore_fields} entry is not a usable JSON Pointer, or there are too many. */
    INVALID_POINTER("invalid_pointer");

    private final String code;

    ErrorClass(String code) {
      this.code = code;
    }

    /** The class as the vectors spell it, e.g. {@code malformed_json}. */
    public String code() {
      return code;
    }
  }

  private final ErrorClass errorClass;

  FingerprintException(ErrorClass errorClass, String message, Throwable cause) {
    super(message, cause);
    this.errorClass = errorClass;
  }

  /** Why the fingerprint cannot be computed. */
  public ErrorClass errorClass() {
    return errorClass;
  }
}
