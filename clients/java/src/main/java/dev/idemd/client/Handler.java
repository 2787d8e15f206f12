package dev.idemd.client;

/**
 * The side effect that {@link IdemdClient#executeOnce} runs at most once per key.
 *
 * <p>Return the response to store. Throw {@link NoSideEffectException} when the failure happened
 * before any side effect (the claim is released and a retry executes again); any other exception
 * records the outcome as unknown, and retries get {@link OutcomePendingException} until someone
 * reconciles the key.
 */
@FunctionalInterface
public interface Handler {
  /** Runs the side effect once. */
  HttpResponseSpec handle(Execution execution) throws Exception;
}
