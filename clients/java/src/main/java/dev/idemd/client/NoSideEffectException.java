package dev.idemd.client;

/**
 * Thrown by a {@link Handler} to say that it failed before any side effect happened (validation
 * failed, a dependency refused the call before doing anything). The executor then releases the
 * claim (Fail RELEASE) so that a retry with the same key executes again, and surfaces this
 * exception as the cause of a {@link HandlerException}.
 *
 * <p>Only throw it when nothing happened: on an ambiguous failure (a timeout) let the original
 * exception propagate, so that the outcome is recorded as unknown instead.
 */
public class NoSideEffectException extends Exception {
  private static final long serialVersionUID = 1L;

  /** Creates the marker with a message. */
  public NoSideEffectException(String message) {
    super(message);
  }

  /** Creates the marker around the failure that happened before any side effect. */
  public NoSideEffectException(String message, Throwable cause) {
    super(message, cause);
  }

  /** Creates the marker around the failure that happened before any side effect. */
  public NoSideEffectException(Throwable cause) {
    super(cause);
  }
}
