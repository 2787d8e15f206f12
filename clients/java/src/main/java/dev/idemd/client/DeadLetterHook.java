package dev.idemd.client;

/**
 * Where {@link MessageProcessor} sends a message it must not run (again): the handler failed, an
 * earlier attempt's outcome is failed or unknown, or the key came with a different value.
 *
 * <p>Called <b>at least once</b> per such delivery: a consumer that dies after the hook and before
 * its offset commit calls it again for the same message on redelivery. Make it idempotent (key the
 * dead-letter record by the message's key or position).
 *
 * <p>{@link MessageProcessor#processBatch} calls it from several threads at once (one per message
 * in flight): make it safe for concurrent use.
 */
@FunctionalInterface
public interface DeadLetterHook {
  /**
   * Records {@code message} as dead with {@code reason} (human-readable; for a failed handler the
   * reason idemd stored, {@code <Kind>: <message>}). A throw makes the outcome {@code RETRY}: the
   * offset is not committed and the next delivery calls the hook again.
   */
  void deadLetter(Message message, String reason) throws Exception;
}
