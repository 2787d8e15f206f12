package dev.idemd.client;

import com.google.common.util.concurrent.ListenableFuture;
import com.google.common.util.concurrent.MoreExecutors;
import com.google.common.util.concurrent.SettableFuture;
import dev.idemd.v1.ClaimBatchRequest;
import dev.idemd.v1.ClaimBatchResponse;
import dev.idemd.v1.ClaimRequest;
import dev.idemd.v1.ClaimResponse;
import dev.idemd.v1.CompleteBatchRequest;
import dev.idemd.v1.CompleteBatchResponse;
import dev.idemd.v1.CompleteRequest;
import dev.idemd.v1.CompleteResponse;
import dev.idemd.v1.ExtendLeaseRequest;
import dev.idemd.v1.ExtendLeaseResponse;
import dev.idemd.v1.FailRequest;
import dev.idemd.v1.FailResponse;
import dev.idemd.v1.IdempotencyGrpc;
import dev.idemd.v1.ListPendingRequest;
import dev.idemd.v1.ListPendingResponse;
import dev.idemd.v1.LookupRequest;
import dev.idemd.v1.LookupResponse;
import dev.idemd.v1.ReconcileRequest;
import dev.idemd.v1.ReconcileResponse;
import io.grpc.CallCredentials;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.MultiThreadIoEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollIoHandler;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.nio.NioIoHandler;
import io.grpc.netty.shaded.io.netty.channel.socket.nio.NioSocketChannel;
import io.grpc.netty.shaded.io.netty.handler.codec.http2.Http2Error;
import io.grpc.netty.shaded.io.netty.handler.codec.http2.Http2Exception;
import io.grpc.netty.shaded.io.netty.util.concurrent.DefaultThreadFactory;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CancellationException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.function.Function;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;

/**
 * Client of the idemd gRPC API: the raw RPCs, and {@link #executeOnce} which runs a handler at most
 * once per idempotency key across retries, processes and machines.
 *
 * <pre>{@code
 * try (IdemdClient idemd = IdemdClient.builder("idemd.internal:50051").bearerToken(token).build()) {
 *   ExecuteResult result = idemd.executeOnce("POST /v1/payments", key, request, handler);
 * }
 * }</pre>
 *
 * <p>Thread-safe; create one per process and share it. Raw RPC errors surface as {@link
 * io.grpc.StatusRuntimeException}; {@link IdemdErrors} reads their details.
 */
public final class IdemdClient implements AutoCloseable {
  /** Default per-call deadline. */
  public static final Duration DEFAULT_DEADLINE = Duration.ofSeconds(10);

  static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
  static final Metadata.Key<String> TENANT_ID =
      Metadata.Key.of("x-tenant-id", Metadata.ASCII_STRING_MARSHALLER);

  private final ManagedChannel ownedChannel;
  private final IdempotencyGrpc.IdempotencyBlockingStub blocking;
  private final IdempotencyGrpc.IdempotencyFutureStub future;
  /** The future stub whose callbacks run on the transport's thread: see {@link #await}. */
  private final IdempotencyGrpc.IdempotencyFutureStub direct;
  /**
   * The event loop of the channel this client created (null on a caller's channel): the raw RPCs
   * start there, see {@link #call}.
   */
  private final EventLoopGroup transport;
  private final Duration deadline;
  private final LeaseTimer leaseTimer = new LeaseTimer();
  private final ExecuteEngine engine;

  private IdemdClient(
      Channel channel, ManagedChannel ownedChannel, EventLoopGroup transport, Builder builder) {
    this.ownedChannel = ownedChannel;
    this.transport = transport;
    this.deadline = builder.deadline;
    IdempotencyGrpc.IdempotencyBlockingStub b = IdempotencyGrpc.newBlockingStub(channel);
    IdempotencyGrpc.IdempotencyFutureStub f = IdempotencyGrpc.newFutureStub(channel);
    Metadata headers = new Metadata();
    if (builder.bearerToken != null) {
      headers.put(AUTHORIZATION, "Bearer " + builder.bearerToken);
    }
    if (builder.tenantId != null) {
      headers.put(TENANT_ID, builder.tenantId);
    }
    if (headers.keys().size() > 0) {
      CallCredentials credentials = new StaticCredentials(headers);
      b = b.withCallCredentials(credentials);
      f = f.withCallCredentials(credentials);
    }
    this.blocking = b;
    this.future = f;
    this.direct = f.withExecutor(MoreExecutors.directExecutor());
    this.engine = new ExecuteEngine(this);
  }

  /** A client of the server at {@code target} ({@code host:port} or a gRPC target URI). */
  public static Builder builder(String target) {
    return new Builder(Objects.requireNonNull(target, "target"), null);
  }

  /**
   * A client on a channel the caller owns (custom transport settings, in-process channels). {@link
   * #close()} does not shut it down; TLS options are ignored.
   */
  public static Builder builder(Channel channel) {
    return new Builder(null, Objects.requireNonNull(channel, "channel"));
  }

  // ---------------------------------------------------------------------------------------------
  // Executor

  /**
   * Runs {@code handler} at most once for ({@code endpoint}, {@code key}) with the default options.
   *
   * @see #executeOnce(String, String, HttpRequestSpec, Handler, ExecuteOptions)
   */
  public ExecuteResult executeOnce(
      String endpoint, String key, HttpRequestSpec request, Handler handler) {
    return executeOnce(endpoint, key, request, handler, ExecuteOptions.defaults());
  }

  /**
   * Runs {@code handler} at most once for ({@code endpoint}, {@code key}): claims the key, runs the
   * handler if this call won the claim and stores its response, or returns the response an earlier
   * execution stored ({@link ExecuteResult#replayed()}).
   *
   * @param endpoint logical endpoint, e.g. {@code POST /v1/payments} (selects the server policy)
   * @param key the client's idempotency key: 1 to 255 characters of {@code [A-Za-z0-9_-]}
   * @param request the request, whose fingerprint tells a retry from a reused key
   * @param handler the side effect
   * @param options wait budget, lease, ttl, fingerprint mode
   * @throws KeyReuseException the key was used with a different request (422)
   * @throws OutcomePendingException an earlier execution's outcome needs reconciliation (409)
   * @throws InProgressException another execution held the key for the whole wait budget (409)
   * @throws HandlerException the handler failed; the cause is its exception
   * @throws CompleteFailedException the handler ran but its response could not be stored
   * @throws FingerprintException a local fingerprint could not be computed
   * @throws io.grpc.StatusRuntimeException the Claim was refused ({@code INVALID_ARGUMENT}, {@code
   *     UNAUTHENTICATED}, ...) or transport errors outlasted the retries
   */
  public ExecuteResult executeOnce(
      String endpoint,
      String key,
      HttpRequestSpec request,
      Handler handler,
      ExecuteOptions options) {
    return engine.execute(
        Objects.requireNonNull(endpoint, "endpoint"),
        Objects.requireNonNull(key, "key"),
        Objects.requireNonNull(request, "request"),
        Objects.requireNonNull(handler, "handler"),
        Objects.requireNonNull(options, "options"));
  }

  /** {@link DownstreamKey#derive}: the key to send to a third party for {@code step}. */
  public static String downstreamKey(String key, String step) {
    return DownstreamKey.derive(key, step);
  }

  // ---------------------------------------------------------------------------------------------
  // Raw RPCs, each with the default deadline or an explicit one.

  /** Claim with the default deadline. */
  public ClaimResponse claim(ClaimRequest request) {
    return claim(request, deadline);
  }

  /** Claim with a deadline (add the request's {@code wait} to it when waiting). */
  public ClaimResponse claim(ClaimRequest request, Duration deadline) {
    // Sent again on a broken connection only with an attempt id: the same attempt gets its own
    // claim back, while a repeat without one would meet its own lease as IN_PROGRESS.
    return call(deadline, !request.getAttemptId().isEmpty(), stub -> stub.claim(request));
  }

  /** Complete with the default deadline. */
  public CompleteResponse complete(CompleteRequest request) {
    return complete(request, deadline);
  }

  /** Complete with a deadline. */
  public CompleteResponse complete(CompleteRequest request, Duration deadline) {
    return call(deadline, true, stub -> stub.complete(request));
  }

  /**
   * ClaimBatch with the default deadline: up to 500 claims in one call, answered one result per
   * claim in order, each as the single Claim would answer it (an item's error in place of the
   * Claim's status error). A server without it answers {@code UNIMPLEMENTED}.
   */
  public ClaimBatchResponse claimBatch(ClaimBatchRequest request) {
    return claimBatch(request, deadline);
  }

  /** ClaimBatch with a deadline. */
  public ClaimBatchResponse claimBatch(ClaimBatchRequest request, Duration deadline) {
    boolean allAttempted = request.getClaimsList().stream().noneMatch(c -> c.getAttemptId().isEmpty());
    return call(deadline, allAttempted, stub -> stub.claimBatch(request));
  }

  /**
   * CompleteBatch with the default deadline: up to 500 completions in one call, answered one
   * result per completion in order, each as the single Complete would answer it.
   */
  public CompleteBatchResponse completeBatch(CompleteBatchRequest request) {
    return completeBatch(request, deadline);
  }

  /** CompleteBatch with a deadline. */
  public CompleteBatchResponse completeBatch(CompleteBatchRequest request, Duration deadline) {
    return call(deadline, true, stub -> stub.completeBatch(request));
  }

  /** Fail with the default deadline. */
  public FailResponse fail(FailRequest request) {
    return fail(request, deadline);
  }

  /** Fail with a deadline. */
  public FailResponse fail(FailRequest request, Duration deadline) {
    return call(deadline, true, stub -> stub.fail(request));
  }

  /** ExtendLease with the default deadline. */
  public ExtendLeaseResponse extendLease(ExtendLeaseRequest request) {
    return extendLease(request, deadline);
  }

  /** ExtendLease with a deadline. */
  public ExtendLeaseResponse extendLease(ExtendLeaseRequest request, Duration deadline) {
    return call(deadline, true, stub -> stub.extendLease(request));
  }

  /** Lookup with the default deadline. */
  public LookupResponse lookup(LookupRequest request) {
    return lookup(request, deadline);
  }

  /** Lookup with a deadline. */
  public LookupResponse lookup(LookupRequest request, Duration deadline) {
    return call(deadline, true, stub -> stub.lookup(request));
  }

  /** ListPending with the default deadline. */
  public ListPendingResponse listPending(ListPendingRequest request) {
    return listPending(request, deadline);
  }

  /** ListPending with a deadline. */
  public ListPendingResponse listPending(ListPendingRequest request, Duration deadline) {
    return call(deadline, true, stub -> stub.listPending(request));
  }

  /** Reconcile with the default deadline. */
  public ReconcileResponse reconcile(ReconcileRequest request) {
    return reconcile(request, deadline);
  }

  /** Reconcile with a deadline. */
  public ReconcileResponse reconcile(ReconcileRequest request, Duration deadline) {
    return call(deadline, false, stub -> stub.reconcile(request));
  }

  /** The generated blocking stub, with this client's credentials and the default deadline. */
  public IdempotencyGrpc.IdempotencyBlockingStub blockingStub() {
    return blockingStub(deadline);
  }

  /** The generated blocking stub, with this client's credentials and a deadline from now. */
  public IdempotencyGrpc.IdempotencyBlockingStub blockingStub(Duration deadline) {
    return blocking.withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS);
  }

  /** The generated future stub, with this client's credentials and a deadline from now. */
  public IdempotencyGrpc.IdempotencyFutureStub futureStub(Duration deadline) {
    return future.withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS);
  }

  /**
   * Runs a raw RPC, sent again (within {@code deadline}) when the transport reports that the server
   * never took it ({@link #unprocessed}) or, for a call idemd answers the same when it is repeated
   * ({@code sameCallIsSafe}), that the connection failed under it ({@link #connectionFailed}). On a
   * channel of its own the client starts the call on the channel's transport thread: started
   * elsewhere, its deadline timer, its first request for the response and its write each hand a
   * task to that thread, and on a busy core each can cost a wake-up of it; started there, they are
   * queued in place, and the call costs one wake-up of the transport thread and one of the caller
   * ({@link #await}): the servlet filter's fresh key in Jetty went from ~12 context switches of the
   * app's threads to ~9 (Jetty alone, without the filter: ~5).
   */
  private <T> T call(
      Duration deadline,
      boolean sameCallIsSafe,
      Function<IdempotencyGrpc.IdempotencyFutureStub, ListenableFuture<T>> rpc) {
    long end = System.nanoTime() + deadline.toNanos();
    for (int attempt = 1; ; attempt++) {
      try {
        return callOnce(deadline, rpc);
      } catch (StatusRuntimeException e) {
        if (attempt >= MAX_UNPROCESSED_ATTEMPTS || !sendAgain(e.getStatus(), sameCallIsSafe)) {
          throw e;
        }
        if (attempt > 2) {
          // The connections keep refusing it: leave the channel a moment to bring up a new one.
          try {
            Thread.sleep(attempt * 5L);
          } catch (InterruptedException interrupted) {
            Thread.currentThread().interrupt();
            throw e;
          }
        }
        long left = end - System.nanoTime();
        if (left <= 0) {
          throw e;
        }
        deadline = Duration.ofNanos(left);
      }
    }
  }

  /** How many times {@link #call} sends a call that the server (or a proxy) never took. */
  static final int MAX_UNPROCESSED_ATTEMPTS = 20;

  /**
   * Whether {@link #call} sends a call again after {@code status}: always when the server never
   * took it, and when the connection failed under it if repeating it is safe ({@code
   * sameCallIsSafe}: docs/design.md, "Retrying the same call is always safe": a Claim with the same
   * attempt id gets the same lease, Complete and Fail with the same token are idempotent, ExtendLease
   * extends again, the reads read again). An answer from idemd is never sent again here (the
   * executor's retries decide that, with backoff).
   */
  static boolean sendAgain(Status status, boolean sameCallIsSafe) {
    return unprocessed(status) || (sameCallIsSafe && connectionFailed(status));
  }

  /**
   * Whether grpc-java's Netty transport reports {@code status} for a call the server never took: a
   * stream above the last-stream-id of a GOAWAY with NO_ERROR ("Abrupt GOAWAY closed sent
   * stream", which grpc-java itself treats as refused), one never sent ("... unsent stream",
   * "GOAWAY closed buffered stream"), or one reset with REFUSED_STREAM. grpc-java retries such a
   * call transparently once (gRFC A6); a second one surfaces as UNAVAILABLE, which a proxy that
   * sends a GOAWAY every few requests (nginx's keepalive_requests) defeats at a few dozen calls in
   * flight. Nothing reached idemd, so {@link #call} sends it again, within its deadline and below
   * the executor's retries; an error the server may have seen (a connection that broke with the
   * request on it) stays an error unless the call is safe to repeat ({@link #sendAgain}).
   *
   * <p>Also INTERNAL "http2 exception" for a stream Netty itself failed before its request was
   * written: "Stream closed before write could take place" (the stream closed, by a GOAWAY or the
   * connection's close, while its DATA frame still waited in Netty's flow controller), or a stream
   * Netty refused to open ("Cannot create stream ... greater than Last-Stream-ID ... from GOAWAY",
   * "Maximum active streams violated"). grpc-java sends a unary call's message and its END_STREAM
   * in one DATA write, so a write that never took place left the server without the whole message,
   * and no gRPC server runs a handler on part of one. Seen in `make test`'s proxy matrix (h2c, 300
   * calls in flight across nginx's GOAWAY after 1,000 requests, on a loaded machine): Claims left
   * ABSENT and Completes left IN_PROGRESS surfaced as INTERNAL.
   */
  static boolean unprocessed(Status status) {
    if (status.getCode() == Status.Code.INTERNAL) {
      return status.getCause() instanceof Http2Exception.StreamException stream
          && stream.getMessage() != null
          && (stream.getMessage().startsWith("Stream closed before write could take place")
              || (stream.error() == Http2Error.REFUSED_STREAM
                  && (stream.getMessage().startsWith("Cannot create stream")
                      || stream.getMessage().startsWith("Maximum active streams violated"))));
    }
    if (status.getCode() != Status.Code.UNAVAILABLE || status.getDescription() == null) {
      return false;
    }
    String d = status.getDescription();
    return d.startsWith("Abrupt GOAWAY closed sent stream. HTTP/2 error code: NO_ERROR")
        || d.startsWith("Abrupt GOAWAY closed unsent stream")
        || d.startsWith("GOAWAY closed buffered stream")
        || d.startsWith("RST_STREAM closed stream. HTTP/2 error code: REFUSED_STREAM");
  }

  /**
   * Whether grpc-java reports {@code status} because the connection failed under the call, not as
   * an answer: the server may or may not have taken it. UNAVAILABLE with an I/O error as its cause
   * ("io exception": a write on a connection the peer had closed, EPIPE, which nginx's idle close
   * races), or the connection's close after a GOAWAY or for no reason given; INTERNAL caused by
   * Netty's HTTP/2 codec ("http2 exception"). A status idemd sends has no cause and none of these
   * descriptions, so its own UNAVAILABLE (store down, outcome unknown) is not one.
   */
  static boolean connectionFailed(Status status) {
    Throwable cause = status.getCause();
    if (status.getCode() == Status.Code.INTERNAL) {
      return cause instanceof Http2Exception;
    }
    if (status.getCode() != Status.Code.UNAVAILABLE) {
      return false;
    }
    if (cause instanceof IOException) {
      return true;
    }
    String d = status.getDescription();
    return d != null
        && (d.startsWith("Connection closed after GOAWAY")
            || d.startsWith("Network closed for unknown reason"));
  }

  private <T> T callOnce(
      Duration deadline, Function<IdempotencyGrpc.IdempotencyFutureStub, ListenableFuture<T>> rpc) {
    IdempotencyGrpc.IdempotencyFutureStub stub = direct(deadline);
    if (transport == null) {
      return await(rpc.apply(stub));
    }
    SettableFuture<T> result = SettableFuture.create();
    try {
      transport.execute(() -> {
        try {
          result.setFuture(rpc.apply(stub));
        } catch (RuntimeException | Error e) {
          result.setException(e);
        }
      });
    } catch (RejectedExecutionException closed) {
      // The client is closed: the channel answers the call as it answers one after shutdown.
      return await(rpc.apply(stub));
    }
    return await(result);
  }

  private IdempotencyGrpc.IdempotencyFutureStub direct(Duration deadline) {
    return direct.withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS);
  }

  /**
   * Waits for a call of {@link #direct} as the blocking stub would (the same exceptions, the
   * trailers kept for {@link IdemdErrors}), with one thread hand-off per call instead of several.
   * The blocking stub runs the call's callbacks on the waiting thread: the transport thread hands it
   * the headers, each message and the close one at a time, waking it for each, and the deframer
   * there asks the transport thread for more, waking that one too. Here the transport thread runs
   * them (a response is a few hundred bytes to parse) and wakes the caller once, when the call is
   * done: at one request in flight on a busy core, each wake-up is a context switch on the
   * request's path (the servlet filter's fresh key in Jetty went from ~24 context switches to ~18).
   */
  static <T> T await(ListenableFuture<T> call) {
    boolean interrupted = false;
    try {
      while (true) {
        try {
          return call.get();
        } catch (InterruptedException e) {
          // As the blocking stub: cancel the call, wait for it to close, keep the interrupt.
          interrupted = true;
          call.cancel(true);
        } catch (CancellationException e) {
          throw Status.CANCELLED.withDescription("Thread interrupted").withCause(e)
              .asRuntimeException();
        } catch (ExecutionException e) {
          Throwable cause = e.getCause();
          throw new StatusRuntimeException(
              Status.fromThrowable(cause), Status.trailersFromThrowable(cause));
        }
      }
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /** The default per-call deadline. */
  public Duration deadline() {
    return deadline;
  }

  LeaseTimer leaseTimer() {
    return leaseTimer;
  }

  /** Stops the lease keepers and, if this client created it, shuts the channel down. */
  @Override
  public void close() {
    leaseTimer.close();
    if (ownedChannel != null) {
      ownedChannel.shutdown();
      try {
        if (!ownedChannel.awaitTermination(5, TimeUnit.SECONDS)) {
          ownedChannel.shutdownNow();
        }
      } catch (InterruptedException e) {
        ownedChannel.shutdownNow();
        Thread.currentThread().interrupt();
      }
    }
    if (transport != null) {
      transport.shutdownGracefully(0, 1, TimeUnit.SECONDS);
    }
  }

  /** Options of an {@link IdemdClient}. */
  public static final class Builder {
    private final String target;
    private final Channel channel;
    private String bearerToken;
    private String tenantId;
    private boolean plaintext;
    private Path caFile;
    private Path clientCertFile;
    private Path clientKeyFile;
    private Duration deadline = DEFAULT_DEADLINE;
    private Duration keepAliveTime;
    private Duration keepAliveTimeout;
    private boolean keepAliveWithoutCalls;
    private Map<String, String> environment = System.getenv();

    private Builder(String target, Channel channel) {
      this.target = target;
      this.channel = channel;
    }

    /** Sends {@code authorization: Bearer <token>} on every call. */
    public Builder bearerToken(String token) {
      this.bearerToken = requireHeaderValue(token, "bearer token");
      return this;
    }

    /**
     * Sends {@code x-tenant-id} on every call: the tenant of a development server that runs without
     * authentication (a server with authentication takes the tenant from the token).
     */
    public Builder tenantId(String tenant) {
      this.tenantId = requireHeaderValue(tenant, "tenant id");
      return this;
    }

    /** Uses TLS with the system's trusted roots (the default). */
    public Builder tls() {
      this.plaintext = false;
      this.caFile = null;
      return this;
    }

    /** Uses TLS, trusting the certificate authorities in a PEM file. */
    public Builder tlsCaFile(Path caPem) {
      this.plaintext = false;
      this.caFile = Objects.requireNonNull(caPem, "caPem");
      return this;
    }

    /**
     * Presents a client certificate (mutual TLS): for a server started with {@code
     * --tls-client-ca}, which takes the tenant from the certificate, so no bearer token is needed.
     * Combines with {@link #tlsCaFile} (or the system roots of {@link #tls()}); {@link #build()}
     * refuses it together with {@link #plaintext()}.
     *
     * @param certPem the client certificate chain, PEM, leaf first
     * @param keyPem the certificate's private key, unencrypted PKCS#8 PEM ({@code BEGIN PRIVATE
     *     KEY})
     */
    public Builder tlsClientCertificate(Path certPem, Path keyPem) {
      this.clientCertFile = Objects.requireNonNull(certPem, "certPem");
      this.clientKeyFile = Objects.requireNonNull(keyPem, "keyPem");
      return this;
    }

    /** Uses plaintext HTTP/2 (local development, or behind a TLS-terminating sidecar). */
    public Builder plaintext() {
      this.plaintext = true;
      this.caFile = null;
      return this;
    }

    /** The default per-call deadline (10 s unless set). */
    public Builder deadline(Duration deadline) {
      if (deadline.isNegative() || deadline.isZero()) {
        throw new IllegalArgumentException("deadline must be positive");
      }
      this.deadline = deadline;
      return this;
    }

    /**
     * Sends HTTP/2 PINGs on a connection idle for {@code time} and drops it (the calls on it fail
     * over to a new one) when a PING is not answered within {@code timeout}: it finds a connection
     * a proxy or NAT dropped silently before a call is sent on it. Off unless set (grpc-java's
     * default). A gRPC server may close a connection whose PINGs come more often than it permits
     * (grpc-java's and grpc-go's servers default to every 5 minutes at most), so keep {@code time}
     * at what the other side allows; grpc-java raises a {@code time} under 10 s to 10 s.
     */
    public Builder keepAlive(Duration time, Duration timeout) {
      if (time.isNegative() || time.isZero() || timeout.isNegative() || timeout.isZero()) {
        throw new IllegalArgumentException("keepalive time and timeout must be positive");
      }
      this.keepAliveTime = time;
      this.keepAliveTimeout = timeout;
      return this;
    }

    /** Whether {@link #keepAlive} PINGs also go out while no call is in flight (default false). */
    public Builder keepAliveWithoutCalls(boolean enable) {
      this.keepAliveWithoutCalls = enable;
      return this;
    }

    /** The environment the proxy variables are read from (tests). */
    Builder environment(Map<String, String> environment) {
      this.environment = Objects.requireNonNull(environment, "environment");
      return this;
    }

    /**
     * Creates the client.
     *
     * <p>A target that is resolved by DNS (the default {@code host:port}) goes through the HTTP
     * CONNECT proxy of {@code grpc_proxy}, {@code https_proxy} ({@code HTTPS_PROXY}) or {@code
     * http_proxy}, the first one set, unless {@code no_grpc_proxy} / {@code no_proxy} lists it, as
     * in grpcio and grpc-js. Without them, grpc-java's own detection applies: the {@code
     * https.proxyHost} / {@code https.proxyPort} system properties (through {@link
     * java.net.ProxySelector}, with {@code http.nonProxyHosts}).
     *
     * @throws UncheckedIOException if the CA file, client certificate or key cannot be read
     * @throws IllegalStateException if a client certificate is combined with {@link #plaintext()}
     */
    public IdemdClient build() {
      if (channel != null) {
        return new IdemdClient(channel, null, null, this);
      }
      ChannelCredentials credentials;
      if (plaintext) {
        // The caller asked for mutual TLS: dropping the certificate would send the calls in the
        // clear and unauthenticated instead.
        if (clientCertFile != null) {
          throw new IllegalStateException(
              "a client certificate needs TLS: tlsClientCertificate() cannot be combined with"
                  + " plaintext()");
        }
        credentials = InsecureChannelCredentials.create();
      } else {
        // Without a trustManager the builder trusts the system roots (like
        // TlsChannelCredentials.create()), so a client certificate also works with tls().
        TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder();
        if (caFile != null) {
          try {
            tls.trustManager(caFile.toFile());
          } catch (IOException e) {
            throw new UncheckedIOException("cannot read the CA file " + caFile, e);
          }
        }
        if (clientCertFile != null) {
          try {
            tls.keyManager(clientCertFile.toFile(), clientKeyFile.toFile());
          } catch (IOException e) {
            throw new UncheckedIOException(
                "cannot read the client certificate "
                    + clientCertFile
                    + " or its key "
                    + clientKeyFile,
                e);
          }
        }
        credentials = tls.build();
      }
      EnvProxyDetector proxy = EnvProxyDetector.fromEnvironment(environment);
      // A transport thread of its own, which the raw RPCs start on (IdemdClient.call).
      boolean epoll = Epoll.isAvailable();
      EventLoopGroup transport = new MultiThreadIoEventLoopGroup(1,
          new DefaultThreadFactory("idemd-transport", true),
          epoll ? EpollIoHandler.newFactory() : NioIoHandler.newFactory());
      NettyChannelBuilder netty = NettyChannelBuilder.forTarget(target, credentials)
          .eventLoopGroup(transport)
          .channelType(epoll ? EpollSocketChannel.class : NioSocketChannel.class);
      if (proxy != null) {
        netty.proxyDetector(proxy);
      }
      if (keepAliveTime != null) {
        netty.keepAliveTime(keepAliveTime.toNanos(), TimeUnit.NANOSECONDS)
            .keepAliveTimeout(keepAliveTimeout.toNanos(), TimeUnit.NANOSECONDS)
            .keepAliveWithoutCalls(keepAliveWithoutCalls);
      }
      ManagedChannel managed;
      try {
        managed = netty.build();
      } catch (RuntimeException e) {
        transport.shutdownGracefully(0, 0, TimeUnit.SECONDS);
        throw e;
      }
      return new IdemdClient(managed, managed, transport, this);
    }

    private static String requireHeaderValue(String value, String what) {
      Objects.requireNonNull(value, what);
      if (value.isEmpty() || !value.chars().allMatch(c -> c >= 0x20 && c < 0x7F)) {
        throw new IllegalArgumentException(what + " must be non-empty printable ASCII");
      }
      return value;
    }
  }

  /** Adds fixed metadata (authorization, tenant) to every call. */
  private static final class StaticCredentials extends CallCredentials {
    private final Metadata headers;

    StaticCredentials(Metadata headers) {
      this.headers = headers;
    }

    @Override
    public void applyRequestMetadata(
        RequestInfo requestInfo, Executor appExecutor, MetadataApplier applier) {
      Metadata copy = new Metadata();
      copy.merge(headers);
      applier.apply(copy);
    }
  }
}
