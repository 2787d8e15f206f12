package dev.idemd.examples.kafka;

import dev.idemd.client.Message;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * What the README's consumer block refers to but leaves to the reader: a payment provider, the
 * dead-letter store and the loop's stop condition. {@link ReadmeConsumerTest} compiles the block
 * as the body of {@link #run} in a subclass.
 */
public abstract class ConsumerReadmeHarness {
  /** A stand-in payment provider that counts charges. */
  public static final class Payments {
    private final AtomicInteger charges = new AtomicInteger();

    /** Charges once. */
    public void charge(byte[] order) {
      charges.incrementAndGet();
    }

    /** Charges made. */
    public int charges() {
      return charges.get();
    }
  }

  /** The provider the block charges. */
  public final Payments payments = new Payments();

  /** The block's dead letters. */
  public final Map<Message, String> deadLetters = new ConcurrentHashMap<>();

  private volatile boolean running = true;

  /** The block's loop condition. */
  protected boolean running() {
    return running;
  }

  /** Ends the block's loop after its current poll. */
  public void stop() {
    running = false;
  }

  /** The README block. */
  public abstract void run(String target, String token, String brokers) throws Exception;
}
