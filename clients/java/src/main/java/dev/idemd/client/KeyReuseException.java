package dev.idemd.client;

/**
 * The key was used earlier with a different request (HTTP 422 {@code idempotency_key_reuse}).
 * Permanent for this key: never retried.
 */
public final class KeyReuseException extends IdempotencyConflictException {
  private static final long serialVersionUID = 1L;

  /** The HTTP status of key reuse. */
  public static final int HTTP_STATUS = 422;

  /** The error code of key reuse. */
  public static final String ERROR_CODE = "idempotency_key_reuse";

  KeyReuseException(int httpStatus, String errorCode) {
    super(
        "the idempotency key was already used with a different request",
        httpStatus,
        errorCode);
  }
}
