package dev.idemd.examples.payments;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/** A stand-in payment provider for the example: deduplicates by idempotency key, counts charges. */
public final class InMemoryPaymentProvider implements PaymentProvider {
  private final Map<String, Charge> charges = new ConcurrentHashMap<>();
  private final AtomicInteger sequence = new AtomicInteger();

  @Override
  public Charge charge(String idempotencyKey, long amount, String currency, String customer) {
    return charges.computeIfAbsent(
        idempotencyKey,
        k -> new Charge("pay_" + sequence.incrementAndGet(), amount, currency, customer));
  }

  /** How many distinct charges were made. */
  public int chargeCount() {
    return charges.size();
  }
}
