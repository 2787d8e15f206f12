package dev.idemd.examples.payments;

/** A third-party payment API that takes its own idempotency key (as Stripe's does). */
public interface PaymentProvider {
  /** A successful charge. */
  record Charge(String id, long amount, String currency, String customer) {}

  /**
   * Charges a customer. Calls with the same {@code idempotencyKey} charge once and return the same
   * charge.
   */
  Charge charge(String idempotencyKey, long amount, String currency, String customer)
      throws Exception;
}
