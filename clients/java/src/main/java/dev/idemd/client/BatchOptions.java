package dev.idemd.client;

/**
 * Options of {@link MessageProcessor#processBatch}: which messages of a poll may run side by side,
 * and how many at once. {@link #defaults()} is {@link Ordering#PER_KEY} with {@link
 * #DEFAULT_PARALLELISM}.
 *
 * @param ordering {@link Ordering#PER_KEY} (the default) or {@link Ordering#PER_PARTITION}
 * @param parallelism the most messages in flight at once (being claimed, running, being
 *     completed), and so the most handlers running at once; 1 is one message at a time in poll
 *     order, with the bookkeeping still in batched RPCs
 */
public record BatchOptions(Ordering ordering, int parallelism) {
  /**
   * How many messages {@link MessageProcessor#processBatch} has in flight unless told otherwise:
   * enough that a fast handler's bookkeeping rides in batches of dozens to hundreds of keys, few
   * enough that a crash parks at most that many messages (only those whose handler ran).
   */
  public static final int DEFAULT_PARALLELISM = 256;

  /** Which messages of a poll {@link MessageProcessor#processBatch} may run side by side. */
  public enum Ordering {
    /**
     * Messages with different keys run side by side, up to the parallelism; two messages with one
     * key run one after the other, in poll order. Side effects of one partition may happen out of
     * offset order; offsets are still committed in order (see {@link
     * MessageProcessor#processBatch}).
     */
    PER_KEY,
    /**
     * Each partition's messages run one at a time in offset order, the partitions of the poll side
     * by side (at most the parallelism of them). Use it when a partition's side effects must happen
     * in order.
     */
    PER_PARTITION
  }

  /** Validates the options. */
  public BatchOptions {
    java.util.Objects.requireNonNull(ordering, "ordering");
    if (parallelism < 1) {
      throw new IllegalArgumentException("parallelism must be at least 1");
    }
  }

  /** {@link Ordering#PER_KEY}, {@link #DEFAULT_PARALLELISM}. */
  public static BatchOptions defaults() {
    return new BatchOptions(Ordering.PER_KEY, DEFAULT_PARALLELISM);
  }

  /** These options with another ordering. */
  public BatchOptions withOrdering(Ordering ordering) {
    return new BatchOptions(ordering, parallelism);
  }

  /** These options with another parallelism (at least 1). */
  public BatchOptions withParallelism(int parallelism) {
    return new BatchOptions(ordering, parallelism);
  }
}
