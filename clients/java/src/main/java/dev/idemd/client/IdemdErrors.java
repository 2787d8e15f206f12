package dev.idemd.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.ErrorInfo;
import io.grpc.Status;
import io.grpc.protobuf.StatusProto;
import java.util.Optional;

/** Reads the details idemd attaches to its gRPC errors. */
public final class IdemdErrors {
  /** The token is not current: another caller took the lease over. */
  public static final String LEASE_LOST = "LEASE_LOST";

  /** Reconcile on a record that does not need a decision. */
  public static final String NOT_PENDING = "NOT_PENDING";

  /** Complete with the same token but a different response. */
  public static final String ALREADY_COMPLETED = "ALREADY_COMPLETED";

  /** Complete or ExtendLease on an UNKNOWN or FAILED record. */
  public static final String NOT_IN_PROGRESS = "NOT_IN_PROGRESS";

  /** The store could not tell whether a write was applied; retrying the same call is safe. */
  public static final String OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN";

  private IdemdErrors() {}

  /** The status code of a gRPC error, or empty for any other throwable. */
  public static Optional<Status.Code> code(Throwable error) {
    return isGrpc(error)
        ? Optional.of(Status.fromThrowable(error).getCode())
        : Optional.empty();
  }

  /** The {@code google.rpc.ErrorInfo} reason of a gRPC error (e.g. {@link #LEASE_LOST}). */
  public static Optional<String> reason(Throwable error) {
    com.google.rpc.Status status = StatusProto.fromThrowable(error);
    if (status == null) {
      return Optional.empty();
    }
    for (Any detail : status.getDetailsList()) {
      if (detail.is(ErrorInfo.class)) {
        try {
          return Optional.of(detail.unpack(ErrorInfo.class).getReason());
        } catch (InvalidProtocolBufferException e) {
          return Optional.empty();
        }
      }
    }
    return Optional.empty();
  }

  private static boolean isGrpc(Throwable error) {
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (t instanceof io.grpc.StatusRuntimeException || t instanceof io.grpc.StatusException) {
        return true;
      }
    }
    return false;
  }
}
