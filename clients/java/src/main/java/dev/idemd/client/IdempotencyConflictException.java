package dev.idemd.client;

/**
 * A Claim that may not run the handler: key reuse (422), an undecided outcome (409) or an execution
 * still in flight (409). Carries what an HTTP front end should answer.
 */
public abstract class IdempotencyConflictException extends IdemdException {
  private static final long serialVersionUID = 1L;

  private final int httpStatus;
  private final String errorCode;

  IdempotencyConflictException(String message, int httpStatus, String errorCode) {
    super(message);
    this.httpStatus = httpStatus;
    this.errorCode = errorCode;
  }

  /** The HTTP status to answer: 422 or 409. */
  public int httpStatus() {
    return httpStatus;
  }

  /**
   * The error code to answer: {@code idempotency_key_reuse}, {@code outcome_pending} or {@code
   * request_in_progress}.
   */
  public String errorCode() {
    return errorCode;
  }
}
