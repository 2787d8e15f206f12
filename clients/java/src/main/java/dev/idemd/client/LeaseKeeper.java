package dev.idemd.client;

import com.google.common.util.concurrent.ListenableFuture;
import dev.idemd.v1.ExtendLeaseRequest;
import dev.idemd.v1.ExtendLeaseResponse;
import io.grpc.Status;
import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * Keeps a claim alive while a long handler runs: ExtendLease by the full lease every half lease,
 * until stopped. Calls are asynchronous, so one scheduler thread serves every execution of a
 * client.
 */
final class LeaseKeeper {
  private static final System.Logger LOG = System.getLogger("dev.idemd.client");
  private static final LeaseKeeper NONE = new LeaseKeeper(null, null, null, null);

  private final IdemdClient client;
  private final ExtendLeaseRequest request;
  private final String keyHash;
  private final Duration callDeadline;
  private volatile ScheduledFuture<?> task;
  private volatile boolean stopped;

  private LeaseKeeper(
      IdemdClient client, ExtendLeaseRequest request, String keyHash, Duration callDeadline) {
    this.client = client;
    this.request = request;
    this.keyHash = keyHash;
    this.callDeadline = callDeadline;
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
    LeaseKeeper keeper = new LeaseKeeper(client, request, keyHash, callDeadline);
    try {
      keeper.task =
          client
              .scheduler()
              .scheduleAtFixedRate(keeper::extend, period, period, TimeUnit.NANOSECONDS);
    } catch (RejectedExecutionException e) {
      // The client is closing; the handler runs on its initial lease.
      return NONE;
    }
    return keeper;
  }

  private void extend() {
    if (stopped) {
      return;
    }
    ListenableFuture<ExtendLeaseResponse> call = client.futureStub(callDeadline).extendLease(request);
    call.addListener(() -> onDone(call), Runnable::run);
  }

  private void onDone(ListenableFuture<ExtendLeaseResponse> call) {
    try {
      call.get();
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

  void stop() {
    stopped = true;
    ScheduledFuture<?> t = task;
    if (t != null) {
      t.cancel(false);
    }
  }
}
