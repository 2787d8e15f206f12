package dev.idemd.client;

import dev.idemd.v1.State;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.regex.Pattern;

/**
 * Runs a message consumer's side effect once per message key, across redeliveries, rebalances,
 * crashes and consumers, on top of {@link IdemdClient#executeOnce}; broker-agnostic (the caller
 * turns its broker's record into a {@link Message}), and tells the loop whether the offset may be
 * committed.
 *
 * <pre>{@code
 * MessageProcessor processor = MessageProcessor.builder(idemd, "kafka:orders")
 *     .keyFromHeader("idempotency-key")
 *     .deadLetter((message, reason) -> deadLetters.put(message, reason))
 *     .build();
 * MessageProcessor.Outcome outcome = processor.process(message, m -> charge(m.value()));
 * if (outcome.mayCommit()) commit(message); else seekBack(message);
 * }</pre>
 *
 * <p><b>Key.</b> {@link Builder#keyFromHeader}: a header the producer sets (its idempotency key or
 * message id), the same on every copy of the message, so it also catches a producer that sends
 * the same thing twice; a message without it (or with a value that is not 1 to 255 characters of
 * {@code [A-Za-z0-9_-]}) is dead-lettered with a reason naming the header. {@link
 * Builder#keyFromPosition}: the fallback {@code topic/partition/offset}, for producers that set no
 * such header; it catches redeliveries (a rebalance, a consumer dying before its commit) but not a
 * producer's retry, which lands at a new offset and runs again.
 *
 * <p><b>Fingerprint:</b> the message value, so a key that comes back with a different value is
 * refused and dead-lettered rather than answered with the other value's outcome.
 *
 * <p><b>Commit rule:</b> commit the offset once the outcome {@link Outcome#mayCommit() may be
 * committed} (executed, duplicate, dead-lettered); after {@code RETRY} do not, and process the
 * message again before any later message of its partition (seek back).
 *
 * <p><b>Dead-letter rule:</b> a message whose handler throws, whose earlier attempt failed or has an
 * unknown outcome (a consumer died inside the handler, its lease expired), or whose key was used
 * with another value is never run again silently: the {@link DeadLetterHook} gets it with the
 * reason, then it may be committed. The hook runs at least once per such delivery: make it
 * idempotent. The key stays in idemd as failed or unknown until someone reconciles it (ListPending
 * / Reconcile).
 *
 * <p><b>Batches:</b> {@link #processBatch} takes a whole poll, claims and completes its keys in
 * batched RPCs and runs the handlers side by side (per key or per partition), with the same outcomes.
 *
 * <p><b>Leases:</b> a handler slower than its lease keeps the key (the executor extends it every
 * half lease). Immutable and thread-safe.
 */
public final class MessageProcessor {
  private static final Pattern KEY = Pattern.compile("[A-Za-z0-9_-]{1,255}");

  /** What {@link #process} did, and what the loop does next. */
  public enum Kind {
    /** This call ran the handler and recorded its success: commit. */
    EXECUTED,
    /** An earlier delivery already succeeded: the handler did not run; commit. */
    DUPLICATE,
    /** The dead-letter hook was called with {@link Outcome#reason()}: commit. */
    DEAD_LETTERED,
    /**
     * Another consumer still holds the key after the wait, or idemd is unavailable: do not commit;
     * process the message again (seek back) before any later message of its partition.
     */
    RETRY
  }

  /**
   * The result of {@link #process}.
   *
   * @param kind what happened
   * @param reason why a message was dead-lettered or is to be retried; empty otherwise
   * @param error the exception behind a {@code RETRY}, or behind an {@code EXECUTED} whose success
   *     could not be recorded ({@link CompleteFailedException}: the side effect happened once; a
   *     redelivery is dead-lettered as unknown); null otherwise
   */
  public record Outcome(Kind kind, String reason, Throwable error) {
    /** Creates an outcome. */
    public Outcome {
      Objects.requireNonNull(kind, "kind");
      reason = reason == null ? "" : reason;
    }

    /** True for every kind but {@code RETRY}: the message's offset may be committed. */
    public boolean mayCommit() {
      return kind != Kind.RETRY;
    }
  }

  /**
   * The lease a processor asks for unless {@link Builder#lease} says otherwise: 5 s, kept alive at
   * half while the handler runs, so a slow handler keeps its key and a consumer killed inside one
   * holds the redelivered message (its partition) at most this long, not the endpoint policy's
   * default lease (60 s unless configured), which suits HTTP requests that are retried seconds apart (issue 52).
   */
  public static final Duration DEFAULT_LEASE = Duration.ofSeconds(5);

  private final IdemdClient client;
  private final String endpoint;
  private final String keyHeader; // null: keyFromPosition
  private final DeadLetterHook deadLetter;
  private final ExecuteOptions options;

  private MessageProcessor(Builder b) {
    this.client = b.client;
    this.endpoint = b.endpoint;
    this.keyHeader = b.keyHeader;
    this.deadLetter = Objects.requireNonNull(b.deadLetter, "deadLetter: a DeadLetterHook is required");
    ExecuteOptions o =
        ExecuteOptions.defaults()
            .withFingerprint(ExecuteOptions.FingerprintMode.LOCAL)
            .withMaxWait(b.maxWait);
    o = o.withLease(b.lease);
    if (b.ttl != null) {
      o = o.withTtl(b.ttl);
    }
    this.options = o;
    if (!b.keyChosen) {
      throw new IllegalStateException("choose the key: keyFromHeader(name) or keyFromPosition()");
    }
  }

  /**
   * A processor claiming keys under {@code endpoint} (e.g. {@code kafka:orders}: the idemd policy
   * that applies, and the namespace of the keys).
   */
  public static Builder builder(IdemdClient client, String endpoint) {
    return new Builder(Objects.requireNonNull(client, "client"), Objects.requireNonNull(endpoint, "endpoint"));
  }

  /**
   * Runs {@code handler} for {@code message} unless an earlier delivery of its key already did, and
   * says whether its offset may be committed.
   *
   * @throws StatusRuntimeException an error no redelivery can fix ({@code UNAUTHENTICATED}, {@code
   *     PERMISSION_DENIED}, an invalid endpoint): stop the consumer without committing
   */
  public Outcome process(Message message, MessageHandler handler) {
    Objects.requireNonNull(message, "message");
    Objects.requireNonNull(handler, "handler");
    KeyOf keyOf = keyOf(message);
    if (keyOf.key() == null) {
      return deadLetter(message, keyOf.invalid());
    }
    String key = keyOf.key();
    HttpRequestSpec request = fingerprintRequest(message);
    try {
      ExecuteResult result =
          client.executeOnce(endpoint, key, request, execution -> {
            if (execution.attempt() > 1) {
              // A takeover policy handed us a key whose holder's lease expired: that holder may
              // have run the side effect. Recorded as unknown (the engine's Fail), not run.
              throw OutcomeUnknown.takenOver(execution.attempt());
            }
            handler.handle(message);
            return HttpResponseSpec.of(200, java.util.List.of(), new byte[0]);
          }, options);
      return new Outcome(result.replayed() ? Kind.DUPLICATE : Kind.EXECUTED, "", null);
    } catch (HandlerException e) {
      // The stored Fail reason (<Kind>: <message>, capped), so the hook and idemd say the same.
      return deadLetter(message, handlerReason(e.getCause()));
    } catch (CompleteFailedException e) {
      return new Outcome(Kind.EXECUTED, "", e);
    } catch (OutcomePendingException e) {
      return deadLetter(message, pendingReason(e.state(), e.reason()));
    } catch (KeyReuseException e) {
      return deadLetter(message, KEY_REUSE_REASON);
    } catch (InProgressException e) {
      return new Outcome(Kind.RETRY, "another consumer holds the key (409 request_in_progress)", e);
    } catch (StatusRuntimeException e) {
      return statusOutcome(e);
    }
  }

  /**
   * {@link #process} for a whole poll: one {@link Outcome} per message, in {@code messages}' order,
   * each meaning exactly what {@code process} would have returned for it (the same kinds and
   * reasons, the same dead-letter hook calls), with {@link BatchOptions#defaults()}.
   *
   * @see #processBatch(List, MessageHandler, BatchOptions)
   */
  public List<Outcome> processBatch(List<Message> messages, MessageHandler handler) {
    return processBatch(messages, handler, BatchOptions.defaults());
  }

  /**
   * {@link #process} for a whole poll ({@code messages} in partition/offset order): one {@link
   * Outcome} per message, in {@code messages}' order, each meaning exactly what {@code process}
   * would have returned for it (the same kinds and reasons, the same dead-letter hook calls). The
   * bookkeeping is batched and pipelined: as slots free up (at most {@link
   * BatchOptions#parallelism()} messages in flight), the next messages' keys are claimed in one
   * ClaimBatch call, each claimed handler starts the moment the answer arrives (its lease extended
   * by heartbeats while it runs), and the handlers' successes are recorded together in
   * CompleteBatch calls that overlap the next claims. A message whose key an earlier message of the
   * poll has in flight waits until that one is decided (and is then a {@code DUPLICATE}); one whose
   * key another consumer holds goes through {@link #process} (it waits up to {@code maxWait}).
   * {@link BatchOptions.Ordering#PER_PARTITION} runs each partition (topic and partition) one
   * message at a time in offset order; once one of its messages is {@code RETRY}, its later
   * messages are {@code RETRY} too, without running.
   *
   * <p><b>Commit offsets in order:</b> for each partition, up to (not including) its first message
   * whose outcome does not {@link Outcome#mayCommit() allow a commit}, and seek back there. With
   * {@link BatchOptions.Ordering#PER_KEY} a later message of that partition may already have run;
   * redelivered, it is a {@code DUPLICATE}.
   *
   * <p><b>Crash bound:</b> a key is claimed only for a free slot, and every claimed handler is
   * started as soon as its ClaimBatch answers (nothing else runs in between). A process killed at
   * any point therefore parks as outcome-unknown at most {@code parallelism} messages, and only
   * those whose handler had been started; the rest of the poll was never claimed and runs normally
   * on redelivery.
   *
   * <p><b>Threads:</b> handlers run on worker threads, up to {@code parallelism} at once, and the
   * {@link DeadLetterHook} is called from several threads at once: make both safe for concurrent
   * use. Against a server without ClaimBatch ({@code UNIMPLEMENTED}, an idemd older than the batch
   * RPCs) every message goes through {@link #process} instead, still up to {@code parallelism} at
   * once.
   *
   * @throws StatusRuntimeException what {@code process} would throw for a message (an error no
   *     redelivery can fix: stop the consumer without committing), once the messages in flight are
   *     decided; the poll's outcomes are then lost, and its redelivery answers the messages already
   *     run as duplicates
   */
  public List<Outcome> processBatch(List<Message> messages, MessageHandler handler, BatchOptions options) {
    Objects.requireNonNull(messages, "messages");
    Objects.requireNonNull(handler, "handler");
    Objects.requireNonNull(options, "options");
    return new BatchRun(this, messages, handler, options).run();
  }

  /** What {@link #process} makes of a status error: {@code RETRY}, or thrown. */
  Outcome statusOutcome(StatusRuntimeException e) {
    if (ExecuteEngine.isTransient(e) || e.getStatus().getCode() == Status.Code.RESOURCE_EXHAUSTED) {
      return new Outcome(Kind.RETRY, "idemd unavailable: " + e.getStatus().getCode(), e);
    }
    throw e;
  }

  /** The key of {@code message}, or why it has none ({@code key} null). */
  record KeyOf(String key, String invalid) {}

  KeyOf keyOf(Message message) {
    if (keyHeader == null) {
      return new KeyOf(positionKey(message), null);
    }
    byte[] raw = message.header(keyHeader).orElse(null);
    if (raw == null) {
      return new KeyOf(null, "no idempotency key: the message has no header \"" + keyHeader + "\"");
    }
    String key = new String(raw, StandardCharsets.UTF_8);
    if (!KEY.matcher(key).matches()) {
      return new KeyOf(null, "invalid idempotency key in header \"" + keyHeader
          + "\": 1 to 255 characters of [A-Za-z0-9_-] expected");
    }
    return new KeyOf(key, null);
  }

  /**
   * The one fingerprint every SDK's helper sends (consumer-scenarios.md): method CONSUME, path the
   * endpoint, the value's bytes, no content type (so no JSON canonicalization).
   */
  HttpRequestSpec fingerprintRequest(Message message) {
    return HttpRequestSpec.of("CONSUME", endpoint, "", message.valueUnsafe());
  }

  static final String KEY_REUSE_REASON =
      "key reuse: the key was used earlier with a different message value (422 idempotency_key_reuse)";

  /** The stored Fail reason (<Kind>: <message>, capped), so the hook and idemd say the same. */
  static String handlerReason(Throwable cause) {
    return ExecuteEngine.truncateUtf8(ExecuteEngine.describe(cause), ExecuteEngine.MAX_REASON_BYTES);
  }

  IdemdClient client() {
    return client;
  }

  String endpoint() {
    return endpoint;
  }

  ExecuteOptions options() {
    return options;
  }

  Outcome deadLetter(Message message, String reason) {
    try {
      deadLetter.deadLetter(message, reason);
    } catch (Exception e) {
      if (e instanceof InterruptedException) {
        Thread.currentThread().interrupt();
      }
      return new Outcome(Kind.RETRY, "the dead-letter hook failed: " + ExecuteEngine.describe(e), e);
    }
    return new Outcome(Kind.DEAD_LETTERED, reason, null);
  }

  static String pendingReason(State state, String stored) {
    String detail = stored == null || stored.isBlank() ? "" : " (" + stored + ")";
    return switch (state) {
      case STATE_FAILED -> "an earlier attempt failed" + detail;
      case STATE_IN_PROGRESS ->
          "outcome unknown: an earlier attempt's lease expired before it recorded an outcome" + detail;
      default -> "outcome unknown: an earlier attempt ended without a known outcome" + detail;
    };
  }

  /**
   * {@code <topic>-<partition>-<offset>} in the key alphabet: {@code _} becomes {@code __} and
   * {@code .} becomes {@code _d}, so distinct topics never share keys; partition and offset are the
   * last two fields, so a {@code -} in the topic is not ambiguous. A topic too long for the 255
   * characters is replaced by the first 32 hex digits of its SHA-256.
   */
  static String positionKey(Message message) {
    String suffix = "-" + message.partition() + "-" + message.offset();
    String topic = message.topic().replace("_", "__").replace(".", "_d");
    if (!KEY.matcher(topic + suffix).matches()) {
      byte[] digest = Fingerprint.sha256().digest(message.topic().getBytes(StandardCharsets.UTF_8));
      topic = "h_" + java.util.HexFormat.of().formatHex(digest, 0, 16);
    }
    return topic + suffix;
  }

  /** Thrown in place of the handler on a takeover; its name and message are the stored reason. */
  static final class OutcomeUnknown extends Exception {
    private static final long serialVersionUID = 1L;

    OutcomeUnknown(String message) {
      super(message);
    }

    static OutcomeUnknown takenOver(int attempt) {
      return new OutcomeUnknown("an earlier attempt's lease expired before it recorded an"
          + " outcome; taken over as attempt " + attempt + ", not run again");
    }
  }

  /** Options of a {@link MessageProcessor}. */
  public static final class Builder {
    private final IdemdClient client;
    private final String endpoint;
    private String keyHeader;
    private boolean keyChosen;
    private DeadLetterHook deadLetter;
    private Duration lease = DEFAULT_LEASE;
    private Duration ttl;
    private Duration maxWait = ExecuteOptions.DEFAULT_MAX_WAIT;

    private Builder(IdemdClient client, String endpoint) {
      this.client = client;
      this.endpoint = endpoint;
    }

    /** The key is the value of header {@code name} (UTF-8), required on every message. */
    public Builder keyFromHeader(String name) {
      this.keyHeader = Objects.requireNonNull(name, "name");
      this.keyChosen = true;
      return this;
    }

    /**
     * The key is the message's {@code topic/partition/offset}: catches redeliveries only, not a
     * producer that sends the same message twice (see the class comment).
     */
    public Builder keyFromPosition() {
      this.keyHeader = null;
      this.keyChosen = true;
      return this;
    }

    /** Required: where messages that must not run (again) go. */
    public Builder deadLetter(DeadLetterHook hook) {
      this.deadLetter = Objects.requireNonNull(hook, "hook");
      return this;
    }

    /**
     * The lease asked for each claim (default {@link #DEFAULT_LEASE}); extended at half while the
     * handler runs.
     */
    public Builder lease(Duration lease) {
      this.lease = Objects.requireNonNull(lease, "lease");
      return this;
    }

    /** How long keys are remembered (default: the endpoint policy's ttl). */
    public Builder ttl(Duration ttl) {
      this.ttl = Objects.requireNonNull(ttl, "ttl");
      return this;
    }

    /**
     * How long a delivery whose key another consumer holds waits for that consumer to finish
     * before {@code RETRY} (default 5 s). Keep it well under the broker's poll timeout ({@code
     * max.poll.interval.ms} for Kafka).
     */
    public Builder maxWait(Duration maxWait) {
      this.maxWait = Objects.requireNonNull(maxWait, "maxWait");
      return this;
    }

    /**
     * The processor.
     *
     * @throws IllegalStateException no key source chosen
     * @throws NullPointerException no dead-letter hook
     */
    public MessageProcessor build() {
      return new MessageProcessor(this);
    }
  }
}
