package dev.idemd.client;

import dev.idemd.v1.Disposition;

/**
 * The handler failed. {@link #getCause()} is exactly what the handler threw; {@link #disposition()}
 * says what was recorded: {@code DISPOSITION_RELEASE} when the handler threw {@link
 * NoSideEffectException} (a retry executes again), {@code DISPOSITION_UNKNOWN} otherwise (retries
 * get {@link OutcomePendingException} until the key is reconciled).
 */
public final class HandlerException extends IdemdException {
  private static final long serialVersionUID = 1L;

  private final Disposition disposition;
  private final boolean recorded;

  HandlerException(Throwable cause, Disposition disposition, boolean recorded) {
    super(
        "the handler failed (" + disposition + (recorded ? "" : ", not recorded") + "): " + cause,
        cause);
    this.disposition = disposition;
    this.recorded = recorded;
  }

  /** What the executor asked the server to record. */
  public Disposition disposition() {
    return disposition;
  }

  /**
   * False when the Fail call itself did not succeed (see the suppressed exceptions); the claim then
   * stays held until its lease expires.
   */
  public boolean recorded() {
    return recorded;
  }

  /** True when the handler said no side effect happened. */
  public boolean noSideEffect() {
    return getCause() instanceof NoSideEffectException;
  }
}
