package dev.idemd.client;

/**
 * The handler succeeded (its side effect happened) but its response could not be stored: the
 * Complete call failed (see the cause), for instance because another caller took the lease over.
 * {@link #response()} is the handler's response, which the caller may still return.
 */
public final class CompleteFailedException extends IdemdException {
  private static final long serialVersionUID = 1L;

  private final transient HttpResponseSpec response;

  CompleteFailedException(HttpResponseSpec response, Throwable cause) {
    super("the handler ran but its response was not stored: " + cause, cause);
    this.response = response;
  }

  /** The response the handler returned. */
  public HttpResponseSpec response() {
    return response;
  }
}
