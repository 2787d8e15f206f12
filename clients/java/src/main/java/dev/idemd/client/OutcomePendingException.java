package dev.idemd.client;

import dev.idemd.v1.State;

/**
 * An earlier execution of the key has an undecided outcome (HTTP 409 {@code outcome_pending}): it
 * failed ambiguously, failed definitively, or its holder's lease expired. Never re-executed
 * automatically: reconcile the key (ListPending / Reconcile) after checking the business system.
 */
public final class OutcomePendingException extends IdempotencyConflictException {
  private static final long serialVersionUID = 1L;

  /** The HTTP status of a pending outcome. */
  public static final int HTTP_STATUS = 409;

  /** The error code of a pending outcome. */
  public static final String ERROR_CODE = "outcome_pending";

  private final State state;
  private final String reason;

  OutcomePendingException(int httpStatus, String errorCode, State state, String reason) {
    super("the outcome of an earlier execution is pending (" + state + ")", httpStatus, errorCode);
    this.state = state;
    this.reason = reason;
  }

  /** {@code STATE_IN_PROGRESS} (lease expired), {@code STATE_UNKNOWN} or {@code STATE_FAILED}. */
  public State state() {
    return state;
  }

  /** Why the record is pending (the Fail reason, or that the lease expired). */
  public String reason() {
    return reason;
  }
}
