package dev.idemd.client;

import com.google.protobuf.ByteString;
import com.google.protobuf.InvalidProtocolBufferException;
import dev.idemd.client.MessageProcessor.Kind;
import dev.idemd.client.MessageProcessor.Outcome;
import dev.idemd.v1.ClaimBatchRequest;
import dev.idemd.v1.ClaimBatchResponse;
import dev.idemd.v1.ClaimBatchResult;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.Claimed;
import dev.idemd.v1.CompleteBatchRequest;
import dev.idemd.v1.CompleteBatchResponse;
import dev.idemd.v1.CompleteRequest;
import dev.idemd.v1.Disposition;
import dev.idemd.v1.ItemError;
import dev.idemd.v1.OutcomePending;
import dev.idemd.v1.StoredResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.LongSupplier;

/**
 * One {@link MessageProcessor#processBatch} call (issue 52; the algorithm of the Go SDK's
 * consume_batch.go). Its state is read and written only by the caller's thread, in {@link #loop};
 * the worker threads it starts (claims, handlers, completions, single-message fallbacks) report
 * back through {@link #events}, which that thread runs.
 */
final class BatchRun {
  /** The server's limit per ClaimBatch or CompleteBatch. */
  static final int MAX_BATCH_ITEMS = 500;

  private static final long TRANSPORT_BACKOFF_BASE_NANOS = Duration.ofMillis(100).toNanos();
  private static final long TRANSPORT_BACKOFF_CAP_NANOS = Duration.ofSeconds(2).toNanos();
  private static final HttpResponseSpec STORED = HttpResponseSpec.of(200, List.of(), new byte[0]);

  private static final AtomicInteger THREADS = new AtomicInteger();
  /**
   * The threads of every batch: claims, handlers (one each while it runs), completions. Cached:
   * a thread idle for a minute ends; daemon, so that it never keeps the JVM alive.
   */
  private static final ExecutorService WORKERS =
      Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "idemd-batch-" + THREADS.incrementAndGet());
        t.setDaemon(true);
        return t;
      });

  private final MessageProcessor processor;
  private final IdemdClient client;
  private final ExecuteEngine engine;
  private final String endpoint;
  private final ExecuteOptions exec;
  private final List<Message> msgs;
  private final MessageHandler handler;
  private final BatchOptions opts;
  private final StoredResponse stored = STORED.toProto();

  private final Outcome[] outs;
  private final boolean[] decided;
  /** In flight: being claimed, running, being completed, or in the single-message fallback. */
  private final boolean[] active;
  private final String[] keys;
  /** The poll's previous message with the same key, or -1. */
  private final int[] prevSameKey;
  /** How many in-flight messages have each key (0 or 1). */
  private final Map<String, Integer> activeKeys = new HashMap<>();
  /** PER_PARTITION: partitions with a RETRY outcome, whose later messages must not run. */
  private final Set<String> blocked = new HashSet<>();
  /** Partitions in order of first appearance, and each one's undecided messages in poll order. */
  private final List<String> partitions = new ArrayList<>();
  private final Map<String, ArrayDeque<Integer>> byPartition = new HashMap<>();
  private final LinkedBlockingQueue<Runnable> events = new LinkedBlockingQueue<>();
  /** Claimed handlers not yet started ({@link #runReady}). */
  private final ConcurrentLinkedQueue<Runnable> ready = new ConcurrentLinkedQueue<>();
  /** A thread was asked to join {@link #runReady} and has not started yet. */
  private final AtomicBoolean joining = new AtomicBoolean();

  private int undecided;
  private int inFlight;
  /** Every message before it is decided (the PER_KEY pick starts there). */
  private int lo;
  /** Handlers started and not yet returned; ClaimBatch and CompleteBatch calls under way. */
  private int running;
  private int claiming;
  private int completing;
  /** The server has no ClaimBatch: messages go through {@link MessageProcessor#process}. */
  private boolean fallback;
  /** What a message's single process() would have thrown: rethrown once nothing is in flight. */
  private Throwable fatal;
  /** Handler successes waiting for a CompleteBatch. */
  private List<Ran> finished = new ArrayList<>();

  BatchRun(MessageProcessor processor, List<Message> msgs, MessageHandler handler, BatchOptions opts) {
    this.processor = processor;
    this.client = processor.client();
    this.engine = new ExecuteEngine(client);
    this.endpoint = processor.endpoint();
    this.exec = processor.options();
    this.msgs = List.copyOf(msgs);
    this.handler = handler;
    this.opts = opts;
    int n = this.msgs.size();
    outs = new Outcome[n];
    decided = new boolean[n];
    active = new boolean[n];
    keys = new String[n];
    prevSameKey = new int[n];
  }

  List<Outcome> run() {
    int n = msgs.size();
    undecided = n;
    for (int i = 0; i < n; i++) {
      MessageProcessor.KeyOf key = processor.keyOf(msgs.get(i));
      if (key.key() == null) {
        decide(i, processor.deadLetter(msgs.get(i), key.invalid()));
      } else {
        keys[i] = key.key();
      }
    }
    Map<String, Integer> last = new HashMap<>();
    for (int i = 0; i < n; i++) {
      prevSameKey[i] = -1;
      if (decided[i]) {
        continue;
      }
      Integer p = last.put(keys[i], i);
      if (p != null) {
        prevSameKey[i] = p;
      }
      String partition = partition(i);
      ArrayDeque<Integer> queue = byPartition.get(partition);
      if (queue == null) {
        queue = new ArrayDeque<>();
        byPartition.put(partition, queue);
        partitions.add(partition);
      }
      queue.add(i);
    }
    loop();
    if (fatal instanceof RuntimeException e) {
      throw e;
    }
    if (fatal instanceof Error e) {
      throw e;
    }
    if (fatal != null) {
      throw new IdemdException("processBatch failed", fatal);
    }
    return List.of(outs);
  }

  private String partition(int i) {
    Message m = msgs.get(i);
    return m.topic() + "\u0000" + m.partition();
  }

  private void deactivate(int i) {
    if (active[i]) {
      active[i] = false;
      inFlight--;
      activeKeys.merge(keys[i], -1, (a, b) -> a + b == 0 ? null : a + b);
    }
  }

  private void decide(int i, Outcome out) {
    if (!decided[i]) {
      undecided--;
    }
    outs[i] = out;
    decided[i] = true;
    deactivate(i);
    if (out.kind() == Kind.RETRY && opts.ordering() == BatchOptions.Ordering.PER_PARTITION) {
      blocked.add(partition(i));
    }
  }

  /** Message i will get no outcome: processBatch throws {@code error} once nothing is in flight. */
  private void abort(int i, Throwable error) {
    deactivate(i);
    if (fatal == null) {
      fatal = error;
    } else if (fatal != error) {
      fatal.addSuppressed(error);
    }
  }

  /**
   * Starts claims for free slots and CompleteBatch calls for finished handlers, and applies what
   * comes back, until every message is decided (or, after a fatal error, nothing is in flight).
   */
  private void loop() {
    // Claims wait for a few free slots rather than one, so that they ride in batches. Completions
    // go out at once when no CompleteBatch is under way, and otherwise wait until they are an
    // eighth of what is in flight (at most a chunk) or the call under way returns (its answer is
    // an event, so they never wait longer than that): fast handlers' successes pile up behind
    // one call instead of each taking a call of its own, while a few partitions side by side
    // (pipelined) do not wait for each other. (Flushing whenever no handler ran sent a
    // CompleteBatch per message with 0 ms handlers: 97,195 calls for 120,000 messages, and the
    // client's transport thread spent 85% of its samples on per-call HTTP/2 work.)
    int chunk = Math.max(1, opts.parallelism() / 8);
    boolean interrupted = false;
    while (undecided > 0) {
      int free = opts.parallelism() - inFlight;
      if (fatal == null && (free >= chunk || (free > 0 && claiming == 0 && running == 0))) {
        List<Integer> next = pick(free);
        if (!next.isEmpty()) {
          start(next);
        }
      }
      if (!finished.isEmpty()
          && (completing == 0 || finished.size() >= Math.max(1, Math.min(chunk, inFlight / 8)))) {
        for (int from = 0; from < finished.size(); from += MAX_BATCH_ITEMS) {
          complete(List.copyOf(finished.subList(from, Math.min(finished.size(), from + MAX_BATCH_ITEMS))));
        }
        finished = new ArrayList<>();
      }
      if (inFlight == 0) {
        if (fatal != null) {
          break;
        }
        // Unreachable (pick always finds the first undecided message of a key), but never return
        // a message without an outcome.
        for (int i = 0; i < msgs.size(); i++) {
          if (!decided[i]) {
            decide(i, new Outcome(Kind.RETRY, "idemd: processBatch could not start this message", null));
          }
        }
        break;
      }
      Runnable event;
      while (true) {
        try {
          event = events.take();
          break;
        } catch (InterruptedException e) {
          // Handlers are running: their outcomes must still be recorded.
          interrupted = true;
        }
      }
      event.run();
      // Apply whatever else has come back before deciding what to send: a claim's handlers
      // finish together, and their successes then ride in one CompleteBatch.
      while ((event = events.poll()) != null) {
        event.run();
      }
    }
    if (interrupted) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * Up to {@code limit} messages to start, in poll order: undecided, not in flight, no message with
   * its key in flight or undecided before it, and with PER_PARTITION the first undecided message
   * of its partition.
   */
  private List<Integer> pick(int limit) {
    List<Integer> next = new ArrayList<>();
    if (opts.ordering() == BatchOptions.Ordering.PER_PARTITION) {
      for (String p : partitions) {
        ArrayDeque<Integer> queue = byPartition.get(p);
        while (!queue.isEmpty() && decided[queue.peekFirst()]) {
          queue.pollFirst();
        }
        if (blocked.contains(p)) {
          for (int i : queue) {
            decide(i, new Outcome(Kind.RETRY,
                "an earlier message of its partition must be retried first", null));
          }
          queue.clear();
        }
        if (!queue.isEmpty() && next.size() < limit && eligible(queue.peekFirst())) {
          next.add(queue.peekFirst());
        }
      }
      return next;
    }
    while (lo < msgs.size() && decided[lo]) {
      lo++;
    }
    Set<String> picked = new HashSet<>();
    for (int i = lo; i < msgs.size() && next.size() < limit; i++) {
      if (eligible(i) && picked.add(keys[i])) {
        next.add(i);
      }
    }
    return next;
  }

  private boolean eligible(int i) {
    if (decided[i] || active[i] || activeKeys.containsKey(keys[i])) {
      return false;
    }
    int p = prevSameKey[i];
    return p < 0 || decided[p];
  }

  /** Claims next's keys in ClaimBatch calls of up to 500; each claimed handler starts on arrival. */
  private void start(List<Integer> next) {
    for (int i : next) {
      active[i] = true;
      activeKeys.merge(keys[i], 1, Integer::sum);
    }
    inFlight += next.size();
    if (fallback) {
      for (int i : next) {
        answerAsync(i, () -> processor.process(msgs.get(i), handler));
      }
      return;
    }
    for (int from = 0; from < next.size(); from += MAX_BATCH_ITEMS) {
      claim(next.subList(from, Math.min(next.size(), from + MAX_BATCH_ITEMS)).stream()
          .mapToInt(Integer::intValue).toArray());
    }
  }

  private void claim(int[] idx) {
    claiming++;
    WORKERS.execute(() -> {
      ClaimRequest[] claims = new ClaimRequest[idx.length];
      ClaimBatchResponse response = null;
      Throwable error = null;
      try {
        ClaimBatchRequest.Builder request = ClaimBatchRequest.newBuilder().setEndpoint(endpoint);
        for (int k = 0; k < idx.length; k++) {
          claims[k] = claimRequest(idx[k]);
          request.addClaims(claims[k]);
        }
        response = claimBatch(request.build());
        if (response.getResultsCount() != idx.length) {
          error = Status.INTERNAL.withDescription("idemd: ClaimBatch answered "
              + response.getResultsCount() + " results for " + idx.length + " claims").asRuntimeException();
        }
      } catch (RuntimeException e) {
        error = e;
      }
      // The handlers start here, not on the loop's thread: nothing may come between a granted
      // claim and its handler but the wait for a thread (the crash bound).
      List<Runnable> jobs = new ArrayList<>();
      if (error == null) {
        for (int k = 0; k < idx.length; k++) {
          ClaimBatchResult result = response.getResults(k);
          if (result.hasResponse()
              && result.getResponse().getOutcomeCase() == ClaimResponse.OutcomeCase.CLAIMED) {
            int i = idx[k];
            Claimed claimed = result.getResponse().getClaimed();
            jobs.add(() -> {
              Ran ran = runOne(i, claimed);
              events.add(() -> handlerDone(ran));
            });
          }
        }
      }
      int startedHandlers = jobs.size();
      ClaimBatchResponse answered = response;
      Throwable failed = error;
      events.add(() -> {
        claiming--;
        running += startedHandlers;
        if (failed instanceof StatusRuntimeException e
            && e.getStatus().getCode() == Status.Code.UNIMPLEMENTED) {
          // A server older than ClaimBatch: every message through the single helper from now on.
          fallback = true;
          for (int i : idx) {
            answerAsync(i, () -> processor.process(msgs.get(i), handler));
          }
        } else if (failed != null) {
          String code = Status.fromThrowable(failed).getCode().toString();
          for (int i : idx) {
            decide(i, new Outcome(Kind.RETRY, "idemd unavailable: " + code, failed));
          }
        } else {
          for (int k = 0; k < idx.length; k++) {
            ClaimBatchResult result = answered.getResults(k);
            if (!(result.hasResponse()
                && result.getResponse().getOutcomeCase() == ClaimResponse.OutcomeCase.CLAIMED)) {
              int i = idx[k];
              answerAsync(i, () -> answer(i, result));
            }
          }
        }
      });
      // After the event above, so that the loop counts these handlers as running before any of
      // them reports back.
      ready.addAll(jobs);
      runReady();
    });
  }

  /**
   * Runs claimed handlers until none waits, on the calling thread. Before each, when others wait
   * and no thread is already on its way, one more thread joins. Slow handlers so spread over
   * threads (each join starts the next, so a chunk's last handler starts after a chain of thread
   * wake-ups, tens of microseconds each), while fast ones run one after the other on the thread
   * that claimed them. (A thread handed each handler was a third of the client's CPU with 0 ms
   * handlers: the cached pool's handoff parks and unparks a thread per message.)
   */
  private void runReady() {
    Runnable job;
    while ((job = ready.poll()) != null) {
      if (!ready.isEmpty() && joining.compareAndSet(false, true)) {
        WORKERS.execute(() -> {
          joining.set(false);
          runReady();
        });
      }
      job.run();
    }
  }

  /** What {@link MessageProcessor#process} would claim for message i (under the batch's endpoint). */
  private ClaimRequest claimRequest(int i) {
    ClaimRequest.Builder claim = ClaimRequest.newBuilder()
        .setKey(keys[i])
        .setAttemptId(Keys.newAttemptId())
        .setSha256(ByteString.copyFrom(Fingerprint.v1(processor.fingerprintRequest(msgs.get(i)))));
    exec.lease().ifPresent(lease -> claim.setLease(ExecuteEngine.toProto(lease)));
    exec.ttl().ifPresent(ttl -> claim.setTtl(ExecuteEngine.toProto(ttl)));
    return claim.build();
  }

  /** ClaimBatch, retried after transport errors as often as a single Claim is. */
  private ClaimBatchResponse claimBatch(ClaimBatchRequest request) {
    for (int failures = 0; ; failures++) {
      try {
        return client.claimBatch(request);
      } catch (StatusRuntimeException e) {
        if (!ExecuteEngine.isTransient(e) || failures >= exec.claimRetries()) {
          throw e;
        }
        sleep(ExecuteEngine.fullJitter(failures + 1, TRANSPORT_BACKOFF_BASE_NANOS,
            TRANSPORT_BACKOFF_CAP_NANOS));
      }
    }
  }

  /** Decides message i with what {@code out} returns, computed on a worker thread. */
  private void answerAsync(int i, Callable<Outcome> out) {
    WORKERS.execute(() -> {
      Outcome o;
      try {
        o = out.call();
      } catch (Throwable t) {
        events.add(() -> abort(i, t));
        return;
      }
      events.add(() -> decide(i, o));
    });
  }

  /** A claimed message's handler, run: what to record. */
  private static final class Ran {
    final int index;
    final String key;
    final String token;
    LongSupplier leaseEnd;
    Throwable error;
    Disposition disposition = Disposition.DISPOSITION_UNKNOWN;

    Ran(int index, String key, String token) {
      this.index = index;
      this.key = key;
      this.token = token;
    }
  }

  /** Runs message i's handler with its lease kept alive (as the executor does). */
  private Ran runOne(int i, Claimed claimed) {
    Ran ran = new Ran(i, keys[i], claimed.getLeaseToken());
    Duration lease = exec.lease().orElseGet(
        () -> Duration.between(Instant.now(), ExecuteEngine.toJava(claimed.getLeaseExpiresAt())));
    long claimedUntil = System.nanoTime() + lease.toNanos();
    if (claimed.getAttempt() > 1) {
      // As process(): an earlier consumer's lease expired mid-handler; recorded unknown, not run.
      ran.leaseEnd = () -> claimedUntil;
      ran.error = MessageProcessor.OutcomeUnknown.takenOver(claimed.getAttempt());
      return ran;
    }
    LeaseKeeper keeper =
        LeaseKeeper.start(client, endpoint, ran.key, Keys.hash(ran.key), ran.token, lease);
    ran.leaseEnd = () -> keeper.leaseEnd(claimedUntil);
    try {
      handler.handle(msgs.get(i));
    } catch (NoSideEffectException e) {
      ran.error = e;
      ran.disposition = Disposition.DISPOSITION_RELEASE;
    } catch (Exception | Error e) {
      if (e instanceof InterruptedException) {
        Thread.interrupted(); // a pool thread: do not carry it into the next task
      }
      ran.error = e;
    } finally {
      keeper.stop();
    }
    return ran;
  }

  /** A success waits for the next CompleteBatch; a failure is recorded (Fail) and dead-lettered. */
  private void handlerDone(Ran ran) {
    running--;
    if (ran.error == null) {
      finished.add(ran);
      return;
    }
    Message message = msgs.get(ran.index);
    answerAsync(ran.index, () -> {
      HandlerException recorded = engine.fail(ran.leaseEnd, endpoint, ran.key, Keys.hash(ran.key),
          ran.token, ran.disposition, ran.error);
      if (ran.error instanceof Error e) {
        e.addSuppressed(recorded);
        throw e; // as process(): an Error is not a message's outcome
      }
      return processor.deadLetter(message, MessageProcessor.handlerReason(ran.error));
    });
  }

  /** Records finished successes with one CompleteBatch, then decides them. */
  private void complete(List<Ran> batch) {
    completing++;
    WORKERS.execute(() -> {
      Outcome[] answered;
      try {
        answered = completeBatch(batch);
      } catch (Throwable t) {
        events.add(() -> {
          completing--;
          batch.forEach(ran -> abort(ran.index, t));
        });
        return;
      }
      Outcome[] results = answered;
      events.add(() -> {
        completing--;
        for (int k = 0; k < batch.size(); k++) {
          decide(batch.get(k).index, results[k]);
        }
      });
    });
  }

  /**
   * EXECUTED for each recorded success; as process() reports a Complete that failed otherwise
   * (EXECUTED with a {@link CompleteFailedException}), after marking the outcome unknown (Fail)
   * where the claim is still ours. A whole-call transport error is retried while the leases hold
   * (a Complete is safe to repeat).
   */
  private Outcome[] completeBatch(List<Ran> batch) {
    CompleteBatchRequest.Builder request = CompleteBatchRequest.newBuilder().setEndpoint(endpoint);
    for (Ran ran : batch) {
      request.addCompletions(CompleteRequest.newBuilder()
          .setKey(ran.key).setLeaseToken(ran.token).setResponse(stored));
    }
    CompleteBatchRequest built = request.build();
    StatusRuntimeException whole = null;
    CompleteBatchResponse response = null;
    try {
      response = engine.retrying(batch.get(0).leaseEnd, () -> client.completeBatch(built));
      if (response.getResultsCount() != batch.size()) {
        whole = Status.INTERNAL.withDescription("idemd: CompleteBatch answered "
            + response.getResultsCount() + " results for " + batch.size() + " items").asRuntimeException();
      }
    } catch (StatusRuntimeException e) {
      whole = e;
    }
    Outcome[] results = new Outcome[batch.size()];
    for (int k = 0; k < batch.size(); k++) {
      StatusRuntimeException error = whole;
      if (error == null && response.getResults(k).hasError()) {
        error = itemStatus(response.getResults(k).getError());
      }
      if (error == null) {
        results[k] = new Outcome(Kind.EXECUTED, "", null);
        continue;
      }
      Status.Code code = error.getStatus().getCode();
      if (code != Status.Code.FAILED_PRECONDITION && code != Status.Code.NOT_FOUND) {
        // Still our claim: record that the outcome is unknown rather than leave it to the lease.
        Ran ran = batch.get(k);
        try {
          engine.retrying(ran.leaseEnd, () -> client.fail(ExecuteEngine.failRequest(endpoint, ran.key,
              ran.token, Disposition.DISPOSITION_UNKNOWN, "the response could not be stored: " + code)));
        } catch (StatusRuntimeException failError) {
          error.addSuppressed(failError);
        }
      }
      results[k] = new Outcome(Kind.EXECUTED, "", new CompleteFailedException(STORED, error));
    }
    return results;
  }

  /** Message i's outcome for a claim item that did not grant the key: as process() decides it. */
  private Outcome answer(int i, ClaimBatchResult result) {
    Message message = msgs.get(i);
    if (result.hasError()) {
      return processor.statusOutcome(itemStatus(result.getError()));
    }
    ClaimResponse response = result.getResponse();
    switch (response.getOutcomeCase()) {
      case REPLAYED:
        return new Outcome(Kind.DUPLICATE, "", null);
      case IN_PROGRESS:
        // Another consumer holds it: the single helper waits for it, up to maxWait.
        return processor.process(message, handler);
      case MISMATCH:
        return processor.deadLetter(message, MessageProcessor.KEY_REUSE_REASON);
      case PENDING:
        OutcomePending pending = response.getPending();
        return processor.deadLetter(message,
            MessageProcessor.pendingReason(pending.getState(), pending.getReason()));
      default:
        return new Outcome(Kind.RETRY, "idemd answered a claim with no outcome", null);
    }
  }

  /**
   * A batch item's error as the status error the single RPC would have thrown, details included
   * ({@link IdemdErrors} reads them).
   */
  static StatusRuntimeException itemStatus(ItemError e) {
    if (!e.getStatusDetails().isEmpty()) {
      try {
        com.google.rpc.Status s = com.google.rpc.Status.parseFrom(e.getStatusDetails());
        if (s.getCode() == e.getCode()) {
          return StatusProto.toStatusRuntimeException(s);
        }
      } catch (InvalidProtocolBufferException ignored) {
        // fall through to the code and message
      }
    }
    return Status.fromCodeValue(e.getCode()).withDescription(e.getMessage()).asRuntimeException();
  }

  private static void sleep(long nanos) {
    try {
      Thread.sleep(nanos / 1_000_000, (int) (nanos % 1_000_000));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw Status.CANCELLED.withDescription("interrupted while waiting to retry a ClaimBatch")
          .withCause(e).asRuntimeException();
    }
  }
}
