package dev.idemd.client;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * What the README's usage block refers to but leaves to the reader: a payment provider ({@code
 * payments}) and a way to answer the HTTP caller ({@code respond}). {@link ReadmeExampleTest}
 * compiles the block as the body of {@link #run} in a subclass.
 */
public abstract class ReadmeHarness {
  /** A stand-in payment provider that counts charges per downstream key. */
  public static final class Payments {
    private final List<String> keys = new ArrayList<>();
    private final AtomicInteger charges = new AtomicInteger();

    /** Charges once and returns the charge as JSON. */
    public synchronized String charge(String idempotencyKey, String body) {
      keys.add(idempotencyKey);
      return "{\"id\":\"pay_" + charges.incrementAndGet() + "\",\"status\":\"succeeded\"}";
    }

    /** Charges made. */
    public synchronized int charges() {
      return charges.get();
    }

    /** Idempotency keys the charges were made with. */
    public synchronized List<String> keys() {
      return List.copyOf(keys);
    }
  }

  /** A response the snippet answered with. */
  public record Answer(HttpResponseSpec response, boolean replayed) {}

  /** The provider the snippet charges. */
  public Payments payments = new Payments();

  /** What the snippet answered, in order. */
  public final List<Answer> answers = new ArrayList<>();

  /** Answers the HTTP caller (recorded for the test). */
  protected void respond(HttpResponseSpec response, boolean replayed) {
    answers.add(new Answer(response, replayed));
  }

  /** The README block. */
  public abstract void run(String target, String token, String key, String body) throws Exception;
}
