package dev.idemd.client;

import java.time.Duration;

/**
 * Another execution still held the key when the wait budget ran out (HTTP 409 {@code
 * request_in_progress}). Retry later; HTTP front ends send {@code Retry-After}.
 */
public final class InProgressException extends IdempotencyConflictException {
  private static final long serialVersionUID = 1L;

  /** The HTTP status of an in-flight duplicate. */
  public static final int HTTP_STATUS = 409;

  /** The error code of an in-flight duplicate. */
  public static final String ERROR_CODE = "request_in_progress";

  private final Duration retryAfter;

  InProgressException(int httpStatus, String errorCode, Duration retryAfter) {
    super("another execution of this key is in progress", httpStatus, errorCode);
    this.retryAfter = retryAfter;
  }

  /** The server's hint of when to retry. */
  public Duration retryAfter() {
    return retryAfter;
  }
}
