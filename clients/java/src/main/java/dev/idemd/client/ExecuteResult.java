package dev.idemd.client;

import java.util.Objects;

/**
 * What {@link IdemdClient#executeOnce} returns.
 *
 * @param response the handler's response, or the stored one on replay
 * @param replayed true when the response was stored by an earlier execution (HTTP front ends add
 *     {@code Idempotent-Replayed: true})
 * @param attempt the attempt number of the claim that ran the handler (1 for the first execution,
 *     higher after a takeover); 0 on replay
 */
public record ExecuteResult(HttpResponseSpec response, boolean replayed, int attempt) {
  /** Creates a result. */
  public ExecuteResult {
    Objects.requireNonNull(response, "response");
  }
}
