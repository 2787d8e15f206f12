package dev.idemd.client;

/** What a {@link Handler} knows about the execution it runs. */
public final class Execution {
  private final String endpoint;
  private final String key;
  private final int attempt;

  Execution(String endpoint, String key, int attempt) {
    this.endpoint = endpoint;
    this.key = key;
    this.attempt = attempt;
  }

  /** The logical endpoint, e.g. {@code POST /v1/payments}. */
  public String endpoint() {
    return endpoint;
  }

  /** The client's idempotency key. */
  public String key() {
    return key;
  }

  /** 1 for the first execution of the key, incremented on every takeover. */
  public int attempt() {
    return attempt;
  }

  /**
   * The idempotency key to send to a third party for {@code step}: the same on every retry of this
   * operation, different for every step. See {@link DownstreamKey}.
   */
  public String downstreamKey(String step) {
    return DownstreamKey.derive(key, step);
  }

  @Override
  public String toString() {
    return "Execution[" + endpoint + ", key_hash=" + Keys.hash(key) + ", attempt=" + attempt + "]";
  }
}
