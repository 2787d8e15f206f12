package dev.idemd.client;

/**
 * Base class of the SDK's own errors. Errors of the gRPC calls themselves surface as {@link
 * io.grpc.StatusRuntimeException} (see {@link IdemdErrors} for their details).
 */
public class IdemdException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** Creates an error with a message. */
  public IdemdException(String message) {
    super(message);
  }

  /** Creates an error with a message and a cause. */
  public IdemdException(String message, Throwable cause) {
    super(message, cause);
  }
}
