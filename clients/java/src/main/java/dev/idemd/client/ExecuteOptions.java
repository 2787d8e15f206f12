package dev.idemd.client;

import java.time.Duration;
import java.util.Objects;
import java.util.Optional;

/**
 * Options of one {@link IdemdClient#executeOnce} call. Immutable; each {@code with...} method
 * returns a copy.
 *
 * <pre>{@code
 * ExecuteOptions options = ExecuteOptions.defaults()
 *     .withMaxWait(Duration.ofSeconds(2))
 *     .withFingerprint(ExecuteOptions.FingerprintMode.LOCAL);
 * }</pre>
 */
public final class ExecuteOptions {
  /** How the request's fingerprint reaches the server. */
  public enum FingerprintMode {
    /**
     * Send the request and let the server compute fingerprint v1; a body over 1 MiB is
     * fingerprinted locally instead (the server refuses such bodies).
     */
    SERVER,
    /** Compute fingerprint v1 locally ({@link Fingerprint}) and send only the digest. */
    LOCAL
  }

  /** Default bound on waiting for an in-flight duplicate. */
  public static final Duration DEFAULT_MAX_WAIT = Duration.ofSeconds(5);

  /** Default number of Claim retries on transport errors. */
  public static final int DEFAULT_CLAIM_RETRIES = 3;

  private static final ExecuteOptions DEFAULTS =
      new ExecuteOptions(DEFAULT_MAX_WAIT, null, null, FingerprintMode.SERVER, DEFAULT_CLAIM_RETRIES);

  private final Duration maxWait;
  private final Duration lease;
  private final Duration ttl;
  private final FingerprintMode fingerprint;
  private final int claimRetries;

  private ExecuteOptions(
      Duration maxWait, Duration lease, Duration ttl, FingerprintMode fingerprint, int claimRetries) {
    this.maxWait = maxWait;
    this.lease = lease;
    this.ttl = ttl;
    this.fingerprint = fingerprint;
    this.claimRetries = claimRetries;
  }

  /** Wait budget 5 s, the policy's lease and ttl, server fingerprint, 3 Claim retries. */
  public static ExecuteOptions defaults() {
    return DEFAULTS;
  }

  /**
   * How long to wait in total for an in-flight duplicate to finish (server-side {@code wait}, then
   * retries with backoff) before {@link InProgressException}. Zero: do not wait.
   */
  public ExecuteOptions withMaxWait(Duration maxWait) {
    if (maxWait.isNegative()) {
      throw new IllegalArgumentException("maxWait must not be negative");
    }
    return new ExecuteOptions(maxWait, lease, ttl, fingerprint, claimRetries);
  }

  /** The lease to ask for (default: the endpoint policy's). Extended at half of it while running. */
  public ExecuteOptions withLease(Duration lease) {
    if (lease.isNegative() || lease.isZero()) {
      throw new IllegalArgumentException("lease must be positive");
    }
    return new ExecuteOptions(maxWait, lease, ttl, fingerprint, claimRetries);
  }

  /** The dedup window to ask for (default: the endpoint policy's). */
  public ExecuteOptions withTtl(Duration ttl) {
    if (ttl.isNegative() || ttl.isZero()) {
      throw new IllegalArgumentException("ttl must be positive");
    }
    return new ExecuteOptions(maxWait, lease, ttl, fingerprint, claimRetries);
  }

  /** How the fingerprint is computed. */
  public ExecuteOptions withFingerprint(FingerprintMode mode) {
    return new ExecuteOptions(maxWait, lease, ttl, Objects.requireNonNull(mode), claimRetries);
  }

  /**
   * How many times a Claim that failed with {@code UNAVAILABLE}, {@code DEADLINE_EXCEEDED} or
   * {@code ABORTED} is retried (with the same attempt id, so a lost response yields the same lease).
   */
  public ExecuteOptions withClaimRetries(int retries) {
    if (retries < 0) {
      throw new IllegalArgumentException("retries must not be negative");
    }
    return new ExecuteOptions(maxWait, lease, ttl, fingerprint, retries);
  }

  /** The wait budget. */
  public Duration maxWait() {
    return maxWait;
  }

  /** The requested lease, if any. */
  public Optional<Duration> lease() {
    return Optional.ofNullable(lease);
  }

  /** The requested ttl, if any. */
  public Optional<Duration> ttl() {
    return Optional.ofNullable(ttl);
  }

  /** The fingerprint mode. */
  public FingerprintMode fingerprint() {
    return fingerprint;
  }

  /** Claim retries on transport errors. */
  public int claimRetries() {
    return claimRetries;
  }
}
