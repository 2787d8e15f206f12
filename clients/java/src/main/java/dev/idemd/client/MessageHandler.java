package dev.idemd.client;

/**
 * The side effect {@link MessageProcessor#process} runs at most once per message key. Throwing
 * sends the message to the dead-letter hook with the reason {@code <Kind>: <message>}; throw
 * {@link NoSideEffectException} when nothing happened, so that the key is released and a later
 * redelivery (from the dead-letter queue, say) may run again. {@link MessageProcessor#processBatch}
 * runs it on several threads at once.
 */
@FunctionalInterface
public interface MessageHandler {
  /** Runs the side effect of {@code message}. */
  void handle(Message message) throws Exception;
}
