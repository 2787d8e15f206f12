package dev.idemd.client;

import com.google.protobuf.ByteString;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.Claimed;
import dev.idemd.v1.CompleteRequest;
import dev.idemd.v1.Disposition;
import dev.idemd.v1.FailRequest;
import dev.idemd.v1.HttpRequest;
import dev.idemd.v1.InProgress;
import dev.idemd.v1.OutcomePending;
import dev.idemd.v1.StoredResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.lang.System.Logger.Level;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharsetEncoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.LongSupplier;
import java.util.function.Supplier;

/** The executor behind {@link IdemdClient#executeOnce} (docs/sdk.md, "Executor"). */
final class ExecuteEngine {
  private static final System.Logger LOG = System.getLogger("dev.idemd.client");

  /** Largest body the server fingerprints; larger ones are fingerprinted locally. */
  static final int MAX_SERVER_BODY_BYTES = 1024 * 1024;

  /** Longest Fail reason the server keeps, in UTF-8 bytes. */
  static final int MAX_REASON_BYTES = 1024;

  private static final long IN_PROGRESS_BACKOFF_BASE_NANOS = Duration.ofMillis(50).toNanos();
  private static final long IN_PROGRESS_BACKOFF_CAP_NANOS = Duration.ofSeconds(1).toNanos();
  private static final long TRANSPORT_BACKOFF_BASE_NANOS = Duration.ofMillis(100).toNanos();
  private static final long TRANSPORT_BACKOFF_CAP_NANOS = Duration.ofSeconds(2).toNanos();

  /** Retries of Complete and Fail on transport errors (both are idempotent for one token). */
  private static final int FENCED_CALL_RETRIES = 3;

  private final IdemdClient client;

  ExecuteEngine(IdemdClient client) {
    this.client = client;
  }

  ExecuteResult execute(
      String endpoint,
      String key,
      HttpRequestSpec request,
      Handler handler,
      ExecuteOptions options) {
    long start = System.nanoTime();
    long budget = options.maxWait().toNanos();
    String keyHash = Keys.hash(key);
    ClaimRequest.Builder claim =
        ClaimRequest.newBuilder()
            .setEndpoint(endpoint)
            .setKey(key)
            // Generated once per execute: a Claim retried after a lost response gets the same lease.
            .setAttemptId(Keys.newAttemptId());
    if (options.fingerprint() == ExecuteOptions.FingerprintMode.LOCAL
        || request.bodyLength() > MAX_SERVER_BODY_BYTES) {
      claim.setSha256(ByteString.copyFrom(Fingerprint.v1(request)));
    } else {
      claim.setRequest(toProto(request));
    }
    options.lease().ifPresent(lease -> claim.setLease(toProto(lease)));
    options.ttl().ifPresent(ttl -> claim.setTtl(toProto(ttl)));

    int transportFailures = 0;
    int inProgressRounds = 0;
    while (true) {
      long remaining = budget - (System.nanoTime() - start);
      Duration wait = Duration.ofNanos(Math.max(0, remaining));
      if (wait.isZero()) {
        claim.clearWait();
      } else {
        claim.setWait(toProto(wait));
      }
      ClaimResponse response;
      try {
        response = client.claim(claim.build(), client.deadline().plus(wait));
      } catch (StatusRuntimeException e) {
        if (isTransient(e) && transportFailures < options.claimRetries()) {
          transportFailures++;
          LOG.log(
              Level.DEBUG,
              "claim key_hash={0} failed with {1}; retrying ({2}/{3})",
              keyHash,
              e.getStatus().getCode(),
              transportFailures,
              options.claimRetries());
          sleep(fullJitter(transportFailures, TRANSPORT_BACKOFF_BASE_NANOS, TRANSPORT_BACKOFF_CAP_NANOS));
          continue;
        }
        throw e;
      }
      switch (response.getOutcomeCase()) {
        case CLAIMED:
          return runClaimed(endpoint, key, keyHash, response.getClaimed(), handler, options);
        case REPLAYED:
          return new ExecuteResult(
              HttpResponseSpec.fromProto(response.getReplayed().getResponse()), true, 0);
        case MISMATCH:
          throw new KeyReuseException(
              statusOr(response, KeyReuseException.HTTP_STATUS),
              codeOr(response, KeyReuseException.ERROR_CODE));
        case PENDING:
          OutcomePending pending = response.getPending();
          throw new OutcomePendingException(
              statusOr(response, OutcomePendingException.HTTP_STATUS),
              codeOr(response, OutcomePendingException.ERROR_CODE),
              pending.getState(),
              pending.getReason());
        case IN_PROGRESS:
          InProgress inProgress = response.getInProgress();
          Duration retryAfter = toJava(inProgress.getRetryAfter());
          remaining = budget - (System.nanoTime() - start);
          if (remaining <= 0) {
            throw new InProgressException(
                statusOr(response, InProgressException.HTTP_STATUS),
                codeOr(response, InProgressException.ERROR_CODE),
                retryAfter);
          }
          inProgressRounds++;
          long backoff =
              fullJitter(inProgressRounds, IN_PROGRESS_BACKOFF_BASE_NANOS, IN_PROGRESS_BACKOFF_CAP_NANOS);
          sleep(Math.min(remaining, Math.max(retryAfter.toNanos(), backoff)));
          continue;
        default:
          throw new IdemdException("Claim returned no outcome");
      }
    }
  }

  private ExecuteResult runClaimed(
      String endpoint,
      String key,
      String keyHash,
      Claimed claimed,
      Handler handler,
      ExecuteOptions options) {
    String token = claimed.getLeaseToken();
    Duration lease =
        options
            .lease()
            .orElseGet(
                () -> Duration.between(Instant.now(), toJava(claimed.getLeaseExpiresAt())));
    long claimedUntil = System.nanoTime() + lease.toNanos();
    LeaseKeeper keeper = LeaseKeeper.start(client, endpoint, key, keyHash, token, lease);
    LongSupplier leaseEnd = () -> keeper.leaseEnd(claimedUntil);
    HttpResponseSpec response;
    try {
      response = handler.handle(new Execution(endpoint, key, claimed.getAttempt()));
      if (response == null) {
        throw new NullPointerException("the handler returned null");
      }
    } catch (NoSideEffectException e) {
      keeper.stop();
      throw fail(leaseEnd, endpoint, key, keyHash, token, Disposition.DISPOSITION_RELEASE, e);
    } catch (Exception e) {
      keeper.stop();
      if (e instanceof InterruptedException) {
        Thread.currentThread().interrupt();
      }
      throw fail(leaseEnd, endpoint, key, keyHash, token, Disposition.DISPOSITION_UNKNOWN, e);
    } catch (Error e) {
      keeper.stop();
      e.addSuppressed(fail(leaseEnd, endpoint, key, keyHash, token, Disposition.DISPOSITION_UNKNOWN, e));
      throw e;
    } finally {
      keeper.stop();
    }

    StoredResponse stored = response.toProto();
    try {
      retrying(
          leaseEnd,
          () ->
              client.complete(
                  CompleteRequest.newBuilder()
                      .setEndpoint(endpoint)
                      .setKey(key)
                      .setLeaseToken(token)
                      .setResponse(stored)
                      .build()));
    } catch (StatusRuntimeException e) {
      LOG.log(
          Level.WARNING,
          "complete key_hash={0} failed with {1}: the side effect happened but its response is not"
              + " stored",
          keyHash,
          e.getStatus().getCode());
      Status.Code code = e.getStatus().getCode();
      if (code != Status.Code.FAILED_PRECONDITION && code != Status.Code.NOT_FOUND) {
        // Still our claim: record that the outcome is unknown rather than leave it to the lease.
        try {
          retrying(leaseEnd, () -> client.fail(failRequest(endpoint, key, token,
              Disposition.DISPOSITION_UNKNOWN, "the response could not be stored: " + code)));
        } catch (StatusRuntimeException failError) {
          e.addSuppressed(failError);
        }
      }
      throw new CompleteFailedException(response, e);
    }
    return new ExecuteResult(response, false, claimed.getAttempt());
  }

  /** Records the handler's failure and returns the error to surface. */
  HandlerException fail(
      LongSupplier leaseEnd,
      String endpoint,
      String key,
      String keyHash,
      String token,
      Disposition disposition,
      Throwable cause) {
    String reason = truncateUtf8(describe(cause), MAX_REASON_BYTES);
    try {
      retrying(leaseEnd, () -> client.fail(failRequest(endpoint, key, token, disposition, reason)));
      return new HandlerException(cause, disposition, true);
    } catch (StatusRuntimeException e) {
      LOG.log(
          Level.WARNING,
          "fail key_hash={0} ({1}) failed with {2}",
          keyHash,
          disposition,
          e.getStatus().getCode());
      HandlerException error = new HandlerException(cause, disposition, false);
      error.addSuppressed(e);
      return error;
    }
  }

  static FailRequest failRequest(
      String endpoint, String key, String token, Disposition disposition, String reason) {
    return FailRequest.newBuilder()
        .setEndpoint(endpoint)
        .setKey(key)
        .setLeaseToken(token)
        .setDisposition(disposition)
        .setReason(reason)
        .build();
  }

  /**
   * Runs an idempotent fenced call (Complete, Fail), retrying transport errors at least {@link
   * #FENCED_CALL_RETRIES} times and beyond that for as long as the lease holds ({@code leaseEnd}, a
   * {@link System#nanoTime()}): grpc-java reconnects in between. Giving up earlier would leave the
   * key IN_PROGRESS until the lease expires (then UNKNOWN) although one more attempt would have
   * recorded the outcome.
   */
  <T> T retrying(LongSupplier leaseEnd, Supplier<T> call) {
    for (int attempt = 0; ; attempt++) {
      try {
        return call.get();
      } catch (StatusRuntimeException e) {
        if (!isTransient(e)) {
          throw e;
        }
        long pause =
            fullJitter(
                Math.min(attempt + 1, 20), TRANSPORT_BACKOFF_BASE_NANOS, TRANSPORT_BACKOFF_CAP_NANOS);
        if (attempt >= FENCED_CALL_RETRIES && System.nanoTime() + pause - leaseEnd.getAsLong() >= 0) {
          throw e;
        }
        sleep(pause);
      }
    }
  }

  static boolean isTransient(StatusRuntimeException e) {
    Status.Code code = e.getStatus().getCode();
    return code == Status.Code.UNAVAILABLE
        || code == Status.Code.DEADLINE_EXCEEDED
        || code == Status.Code.ABORTED;
  }

  /** Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(round-1))]. */
  static long fullJitter(int round, long baseNanos, long capNanos) {
    long ceiling = baseNanos << Math.min(round - 1, 20);
    ceiling = Math.min(capNanos, ceiling <= 0 ? capNanos : ceiling);
    return ThreadLocalRandom.current().nextLong(ceiling + 1);
  }

  private static void sleep(long nanos) {
    if (nanos <= 0) {
      return;
    }
    try {
      Thread.sleep(nanos / 1_000_000, (int) (nanos % 1_000_000));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IdemdException("interrupted while waiting to retry a Claim", e);
    }
  }

  /**
   * The stored Fail reason for a handler's error: {@code <Kind>: <message>}, {@code <Kind>} its
   * unqualified class name (the kind alone when it has no message), the format every SDK stores
   * (clients/conformance/http-scenarios.md, "What an HTTP caller learns about a failed handler").
   * Capped by the caller.
   */
  static String describe(Throwable error) {
    Class<?> type = error.getClass();
    while (type.getSimpleName().isEmpty()) {
      type = type.getSuperclass(); // an anonymous class: named after what it extends
    }
    String kind = type.getSimpleName();
    String message = error.getMessage();
    return message == null || message.isBlank() ? kind : kind + ": " + message;
  }

  static String truncateUtf8(String text, int maxBytes) {
    CharsetEncoder encoder =
        StandardCharsets.UTF_8
            .newEncoder()
            .onMalformedInput(CodingErrorAction.REPLACE)
            .onUnmappableCharacter(CodingErrorAction.REPLACE);
    ByteBuffer out = ByteBuffer.allocate(maxBytes);
    CharBuffer in = CharBuffer.wrap(text);
    encoder.encode(in, out, true);
    out.flip();
    return StandardCharsets.UTF_8.decode(out).toString();
  }

  private static HttpRequest toProto(HttpRequestSpec request) {
    return HttpRequest.newBuilder()
        .setMethod(request.method())
        .setPath(request.path())
        .setContentType(request.contentType())
        .setBody(ByteString.copyFrom(request.body()))
        .addAllIgnoreFields(request.ignoreFields())
        .build();
  }

  static com.google.protobuf.Duration toProto(Duration d) {
    return com.google.protobuf.Duration.newBuilder()
        .setSeconds(d.getSeconds())
        .setNanos(d.getNano())
        .build();
  }

  static Duration toJava(com.google.protobuf.Duration d) {
    return Duration.ofSeconds(d.getSeconds(), d.getNanos());
  }

  static Instant toJava(com.google.protobuf.Timestamp t) {
    return Instant.ofEpochSecond(t.getSeconds(), t.getNanos());
  }

  private static int statusOr(ClaimResponse response, int fallback) {
    return response.getHttpStatus() != 0 ? response.getHttpStatus() : fallback;
  }

  private static String codeOr(ClaimResponse response, String fallback) {
    return response.getErrorCode().isEmpty() ? fallback : response.getErrorCode();
  }
}
