package dev.idemd.client;

import com.google.common.util.concurrent.ListenableFuture;
import dev.idemd.v1.ExtendLeaseRequest;
import dev.idemd.v1.ExtendLeaseResponse;
import io.grpc.Status;
import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.concurrent.ExecutionException;

/**
 * Keeps a claim alive while a long handler runs: ExtendLease by the full lease every half lease,
 * until stopped. Calls are asynchronous, so one timer thread ({@link LeaseTimer}) serves every
 * execution of a client.
 */
final class LeaseKeeper {
  private static final System.Logger LOG = System.getLogger("dev.idemd.client");
  private static final LeaseKeeper NONE = new LeaseKeeper(null, null, null, null, 0);

  private final IdemdClient client;
  private final ExtendLeaseRequest request;
  private final String keyHash;
  private final Duration callDeadline;
  private final long period;
  /** {@link System#nanoTime()} of the next extension; written by the timer thread once started. */
  private volatile long due;
  private volatile boolean stopped;
  /** {@link System#nanoTime()} until which the last successful extension holds the lease, or 0. */
  private volatile long extendedUntil;

  private LeaseKeeper(
      IdemdClient client,
      ExtendLeaseRequest request,
      String keyHash,
      Duration callDeadline,
      long period) {
    this.client = client;
    this.request = request;
    this.keyHash = keyHash;
    this.callDeadline = callDeadline;
    this.period = period;
    this.due = System.nanoTime() + period;
  }

  static LeaseKeeper start(
      IdemdClient client,
      String endpoint,
      String key,
      String keyHash,
      String token,
      Duration lease) {
    long period = lease.toNanos() / 2;
    if (period <= 0) {
      return NONE;
    }
    ExtendLeaseRequest request =
        ExtendLeaseRequest.newBuilder()
            .setEndpoint(endpoint)
            .setKey(key)
            .setLeaseToken(token)
            .setLease(ExecuteEngine.toProto(lease))
            .build();
    Duration callDeadline = Duration.ofNanos(Math.min(period, client.deadline().toNanos()));
    LeaseKeeper keeper = new LeaseKeeper(client, request, keyHash, callDeadline, period);
    if (!client.leaseTimer().add(keeper)) {
      // The client is closing; the handler runs on its initial lease.
      return NONE;
    }
    return keeper;
  }

  long periodNanos() {
    return period;
  }

  long due() {
    return due;
  }

  /** Called by the timer thread when due: sends ExtendLease and sets the next due time. */
  void extend(long now) {
    due = now + period;
    if (stopped) {
      return;
    }
    try {
      long sent = System.nanoTime();
      ListenableFuture<ExtendLeaseResponse> call =
          client.futureStub(callDeadline).extendLease(request);
      call.addListener(() -> onDone(call, sent), Runnable::run);
    } catch (RuntimeException e) {
      // The channel is shutting down: the timer thread must survive it for the other keepers.
      LOG.log(Level.DEBUG, "extending the lease of key_hash={0} failed: {1}", keyHash, e.toString());
    }
  }

  private void onDone(ListenableFuture<ExtendLeaseResponse> call, long sent) {
    try {
      call.get();
      // Counted from when the request left: a lower bound of the server's lease_expires_at.
      extendedUntil = sent + 2 * period;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (ExecutionException e) {
      if (stopped) {
        return;
      }
      Status status = Status.fromThrowable(e.getCause());
      if (status.getCode() == Status.Code.FAILED_PRECONDITION
          || status.getCode() == Status.Code.NOT_FOUND) {
        LOG.log(
            Level.WARNING,
            "lease of key_hash={0} lost ({1} {2}); the response will not be stored",
            keyHash,
            status.getCode(),
            IdemdErrors.reason(e.getCause()).orElse(""));
        stop();
      } else {
        LOG.log(
            Level.DEBUG,
            "extending the lease of key_hash={0} failed with {1}; retrying",
            keyHash,
            status.getCode());
      }
    }
  }

  /**
   * {@link System#nanoTime()} until which the lease holds: {@code initial} (the claim's), or later
   * when an extension succeeded.
   */
  long leaseEnd(long initial) {
    long extended = extendedUntil;
    return extended == 0 ? initial : Math.max(initial, extended);
  }

  void stop() {
    if (client == null) {
      return; // NONE
    }
    stopped = true;
    client.leaseTimer().remove(this);
  }
}
