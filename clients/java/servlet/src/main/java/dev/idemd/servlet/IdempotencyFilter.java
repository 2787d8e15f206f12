package dev.idemd.servlet;

import dev.idemd.client.CompleteFailedException;
import dev.idemd.client.ExecuteOptions;
import dev.idemd.client.ExecuteResult;
import dev.idemd.client.Execution;
import dev.idemd.client.HandlerException;
import dev.idemd.client.HttpHeader;
import dev.idemd.client.HttpRequestSpec;
import dev.idemd.client.HttpResponseSpec;
import dev.idemd.client.IdemdClient;
import dev.idemd.client.InProgressException;
import dev.idemd.client.KeyReuseException;
import dev.idemd.client.NoSideEffectException;
import dev.idemd.client.OutcomePendingException;
import io.grpc.StatusRuntimeException;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Pattern;

/**
 * A Jakarta Servlet filter that gives an application {@code idemd proxy}'s {@code Idempotency-Key}
 * contract in process (docs/proxy.md), on an {@link IdemdClient}:
 *
 * <pre>{@code
 * Filter filter = IdempotencyFilter.builder(client).route(Route.path("/v1/payments/{id}")).build();
 * }</pre>
 *
 * <p>For a request whose method its route marks (default POST and PATCH), the body is read once (up
 * to {@code max_request_bytes}, else 413) and handed to the servlet unchanged; the key is claimed
 * and the servlet runs once per key, its lease extended while it runs; its answer is buffered,
 * stored (status, the route's {@code store_headers}, body) and sent. Retries get the stored answer
 * with {@code Idempotent-Replayed: true}; a duplicate in flight 409 with {@code Retry-After} (or a
 * wait of {@code max_wait}); another body under the key 422; an undecided outcome 409 {@code
 * outcome_pending} (with the stored reason only on a route that sets {@code exposeFailureReason}).
 * A body that something before the filter already read gets 500 {@code middleware_order}, and the
 * key is not claimed. An answer given before the body is read (400 for the key) reads the rest of
 * it first, up to {@code max_request_bytes}, so that the connection stays usable; one that leaves
 * the body unread (413) closes the connection ({@code Connection: close}). An exception from the servlet leaves the key UNKNOWN (released when it is, or
 * is caused by, a {@link NoSideEffectException}) and propagates to the container; a 5xx answer
 * releases the key unless the route stores it. The servlet finds its {@link Execution} (for
 * downstream keys) in the request attribute {@link #EXECUTION_ATTRIBUTE}.
 */
public final class IdempotencyFilter implements Filter {
  /** The request attribute holding the {@link Execution} of a claimed request. */
  public static final String EXECUTION_ATTRIBUTE = "dev.idemd.execution";

  private static final Pattern KEY = Pattern.compile("[A-Za-z0-9_-]{1,255}");

  private static final System.Logger LOG = System.getLogger("dev.idemd.servlet");

  static final String ORDER_DETAIL =
      "the request body was read before the idempotency filter saw it; register the filter before"
          + " any filter that reads the body (getParameter, getReader or getInputStream; in Spring"
          + " Boot, FormContentFilter parses PUT, PATCH and DELETE forms: order the registration"
          + " before it)";

  private final AtomicBoolean orderLogged = new AtomicBoolean();

  private final IdemdClient client;
  private final List<Compiled> routes;
  private final Settings defaults;

  private IdempotencyFilter(IdemdClient client, List<Route> routes, Route defaults) {
    this.client = Objects.requireNonNull(client, "client");
    this.defaults = Settings.of(defaults, BASE);
    this.routes = new ArrayList<>();
    Route base = merged(defaults, BASE);
    for (Route r : routes) {
      this.routes.add(new Compiled(r.path, Settings.of(r, base)));
    }
  }

  /** A builder of the filter for {@code client}. */
  public static Builder builder(IdemdClient client) {
    return new Builder(client);
  }

  /** Routes first (the first whose path matches wins), then the defaults for the rest. */
  public static final class Builder {
    private final IdemdClient client;
    private final List<Route> routes = new ArrayList<>();
    private Route defaults = Route.path("/*");

    private Builder(IdemdClient client) {
      this.client = client;
    }

    /** Adds a route. */
    public Builder route(Route route) {
      routes.add(Objects.requireNonNull(route, "route"));
      return this;
    }

    /** The settings of requests no route matches, and what routes inherit. */
    public Builder defaults(Route defaults) {
      this.defaults = Objects.requireNonNull(defaults, "defaults");
      return this;
    }

    /** The filter. */
    public IdempotencyFilter build() {
      return new IdempotencyFilter(client, routes, defaults);
    }
  }

  private static final Route BASE =
      Route.path("/*")
          .methods("POST", "PATCH")
          .keyRequired(true)
          .maxRequestBytes(1 << 20)
          .maxResponseBytes(256 << 10)
          .maxWait(Duration.ZERO)
          .store5xx(false)
          .ignoreFields(List.of())
          .storeHeaders(Route.DEFAULT_STORE_HEADERS)
          .localFingerprint(false)
          .exposeFailureReason(false);

  private static Route merged(Route route, Route base) {
    Route out = Route.path(route.path);
    out.methods = route.methods != null ? route.methods : base.methods;
    out.keyRequired = route.keyRequired != null ? route.keyRequired : base.keyRequired;
    out.maxRequestBytes = route.maxRequestBytes != null ? route.maxRequestBytes : base.maxRequestBytes;
    out.maxResponseBytes =
        route.maxResponseBytes != null ? route.maxResponseBytes : base.maxResponseBytes;
    out.maxWait = route.maxWait != null ? route.maxWait : base.maxWait;
    out.store5xx = route.store5xx != null ? route.store5xx : base.store5xx;
    out.ignoreFields = route.ignoreFields != null ? route.ignoreFields : base.ignoreFields;
    out.storeHeaders = route.storeHeaders != null ? route.storeHeaders : base.storeHeaders;
    out.localFingerprint =
        route.localFingerprint != null ? route.localFingerprint : base.localFingerprint;
    out.ttl = route.ttl != null ? route.ttl : base.ttl;
    out.lease = route.lease != null ? route.lease : base.lease;
    out.exposeFailureReason =
        route.exposeFailureReason != null ? route.exposeFailureReason : base.exposeFailureReason;
    return out;
  }

  /** A route's settings with every default filled in. */
  private record Settings(Route route, ExecuteOptions options) {
    static Settings of(Route route, Route base) {
      Route m = merged(route, base);
      ExecuteOptions options = ExecuteOptions.defaults().withMaxWait(m.maxWait);
      if (m.localFingerprint) {
        options = options.withFingerprint(ExecuteOptions.FingerprintMode.LOCAL);
      }
      if (m.lease != null) {
        options = options.withLease(m.lease);
      }
      if (m.ttl != null) {
        options = options.withTtl(m.ttl);
      }
      return new Settings(m, options);
    }
  }

  /** A compiled route: its template's segments ({@code null}: any one) and whether a rest follows. */
  private static final class Compiled {
    final String template;
    final List<String> segments = new ArrayList<>();
    final boolean rest;
    final Settings settings;

    Compiled(String template, Settings settings) {
      this.template = template;
      this.settings = settings;
      String[] parts = segments(template);
      boolean rest = false;
      for (int i = 0; i < parts.length; i++) {
        String part = parts[i];
        if (part.equals("*")) {
          if (i + 1 != parts.length) {
            throw new IllegalArgumentException(template + ": * may only be the last segment");
          }
          rest = true;
        } else if (part.startsWith("{") && part.endsWith("}") && part.length() > 2) {
          segments.add(null);
        } else if (part.matches(".*[{}*].*")) {
          throw new IllegalArgumentException(
              template + ": segment \"" + part + "\" is neither literal, {name} nor a final *");
        } else {
          segments.add(part);
        }
      }
      this.rest = rest;
    }

    boolean matches(String[] parts) {
      if (parts.length < segments.size() || (!rest && parts.length != segments.size())) {
        return false;
      }
      for (int i = 0; i < segments.size(); i++) {
        String s = segments.get(i);
        if (s != null && !s.equals(parts[i])) {
          return false;
        }
      }
      return true;
    }
  }

  /**
   * A path's segments, leading slashes dropped. Not {@code replaceFirst("^/+", "")}: that compiles
   * its pattern on every call, and this runs on every request.
   */
  private static String[] segments(String path) {
    int start = 0;
    while (start < path.length() && path.charAt(start) == '/') {
      start++;
    }
    return path.substring(start).split("/", -1);
  }

  @Override
  public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain)
      throws IOException, ServletException {
    if (!(req instanceof HttpServletRequest request) || !(res instanceof HttpServletResponse response)) {
      chain.doFilter(req, res);
      return;
    }
    String method = request.getMethod().toUpperCase(Locale.ROOT);
    String path = request.getRequestURI();
    String[] parts = segments(path);
    String endpoint = method + " " + path;
    Settings settings = defaults;
    for (Compiled route : routes) {
      if (route.matches(parts)) {
        settings = route.settings;
        endpoint = method + " " + (route.rest ? path : route.template);
        break;
      }
    }
    Route s = settings.route();
    if (!s.methods.contains(method)) {
      chain.doFilter(req, res);
      return;
    }
    String value = request.getHeader("Idempotency-Key");
    if (value == null) {
      if (!s.keyRequired) {
        chain.doFilter(req, res);
        return;
      }
      discardBody(request, response, s.maxRequestBytes);
      send(response, problem(400, "idempotency_key_missing",
          method + " " + path + " requires an Idempotency-Key header", Map.of(), null));
      return;
    }
    String key;
    try {
      key = parseKey(value);
    } catch (IllegalArgumentException e) {
      discardBody(request, response, s.maxRequestBytes);
      send(response, problem(400, "idempotency_key_malformed", "Idempotency-Key " + e.getMessage(),
          Map.of("field", "Idempotency-Key"), null));
      return;
    }
    long declared = request.getContentLengthLong();
    if (declared > s.maxRequestBytes) {
      // Not read: the caller said it is too large. The connection closes after the answer.
      closeAfter(response);
      send(response, tooLarge(s));
      return;
    }
    ServletInputStream input;
    try {
      input = request.getInputStream();
    } catch (IllegalStateException readerTaken) {
      // getReader() was called before this filter: the body is (being) read as characters, and
      // what the reader left unread cannot be drained from here.
      closeAfter(response);
      orderMistake(response);
      return;
    }
    if (declared < 0 && chunked(request) && input.isFinished()) {
      // A chunked body ends with its last chunk, which the container has not seen before anything
      // read: finished before this filter read a byte means something else read it. (A request
      // with neither Content-Length nor chunking has no body and is finished from the start.)
      orderMistake(response);
      return;
    }
    byte[] body = readAtMost(input, s.maxRequestBytes);
    if (body == null) {
      // The rest of the body is not read: the connection closes after the answer.
      closeAfter(response);
      send(response, tooLarge(s));
      return;
    }
    if (declared > 0 && body.length < declared) {
      // Something before this filter read the body (getParameter on a form, getInputStream): what
      // is left ends early, at once. Fingerprinting and handing on the rest would store a key for
      // a body nobody sent, so nothing is claimed.
      orderMistake(response);
      return;
    }
    String target = path + (request.getQueryString() == null ? "" : "?" + request.getQueryString());
    String contentType = request.getContentType() == null ? "" : request.getContentType();
    HttpRequestSpec spec = new HttpRequestSpec(method, target, contentType, body, s.ignoreFields);
    Answer[] fresh = new Answer[1];
    Exception[] thrown = new Exception[1];
    Route route = s;
    ExecuteResult result;
    try {
      result =
          client.executeOnce(endpoint, key, spec, execution -> {
            Buffered inner = new Buffered(request, body);
            inner.setAttribute(EXECUTION_ATTRIBUTE, execution);
            Capture capture = new Capture(response);
            try {
              chain.doFilter(inner, capture);
            } catch (Exception e) {
              thrown[0] = e;
              NoSideEffectException marker = causeOf(e);
              if (marker != null) {
                throw marker;
              }
              // The executor stores what it is given as the Fail reason: give it the servlet's own
              // exception, not the wrapper; the container still gets thrown[0].
              throw handlerCause(e) instanceof Exception cause ? cause : e;
            }
            Answer got = capture.answer();
            if (got.status >= 500 && !route.store5xx) {
              throw new Released(got);
            }
            if (got.body.length > route.maxResponseBytes) {
              throw new Unstorable(got, "answer exceeds max_response_bytes ("
                  + route.maxResponseBytes + " bytes); returned to the caller, not stored");
            }
            fresh[0] = got;
            List<HttpHeader> stored = new ArrayList<>();
            for (HttpHeader h : got.headers) {
              if (route.storeHeaders.contains(h.name().toLowerCase(Locale.ROOT))) {
                stored.add(new HttpHeader(h.name().toLowerCase(Locale.ROOT), h.value()));
              }
            }
            return HttpResponseSpec.of(got.status, stored, got.body);
          }, settings.options());
    } catch (HandlerException e) {
      if (e.getCause() instanceof Released r) {
        send(response, r.answer);
        return;
      }
      if (e.getCause() instanceof Unstorable u) {
        send(response, u.answer);
        return;
      }
      rethrow(thrown[0] != null ? thrown[0] : e);
      return;
    } catch (CompleteFailedException e) {
      // The servlet ran (its side effect happened) but its answer could not be recorded: the
      // caller still gets it; the executor left the key to its lease or marked it UNKNOWN.
      send(response, fresh[0]);
      return;
    } catch (InProgressException e) {
      send(response, problem(409, "request_in_progress",
          "a request with this Idempotency-Key is in progress; retry after Retry-After", Map.of(),
          e.retryAfter()));
      return;
    } catch (KeyReuseException e) {
      send(response, problem(422, "idempotency_key_reuse",
          "this Idempotency-Key was used for a different request (method, path or body); use a new"
              + " key for a new operation", Map.of(), null));
      return;
    } catch (OutcomePendingException e) {
      send(response, problem(409, "outcome_pending",
          "the outcome of the first request with this Idempotency-Key is not known; it is waiting"
              + " for an operator's decision",
          pending(e, route.exposeFailureReason), null));
      return;
    } catch (StatusRuntimeException e) {
      String code = e.getStatus().getCode().name();
      send(response, problem(httpOf(code), code.toLowerCase(Locale.ROOT),
          String.valueOf(e.getStatus().getDescription()), Map.of("grpc_code", code), null));
      return;
    }
    if (result.replayed()) {
      List<HttpHeader> headers = new ArrayList<>(result.response().headers());
      headers.removeIf(h -> h.name().equalsIgnoreCase("idempotent-replayed"));
      headers.add(new HttpHeader("idempotent-replayed", "true"));
      send(response, new Answer(result.response().status(), headers, result.response().body()));
    } else {
      send(response, fresh[0]);
    }
  }

  /** The key of an {@code Idempotency-Key} value: a Structured Field string or a bare token. */
  static String parseKey(String value) {
    String text = value.replaceAll("^ +| +$", "");
    if (text.startsWith("\"")) {
      StringBuilder key = new StringBuilder();
      int i = 1;
      while (true) {
        if (i >= text.length()) {
          throw new IllegalArgumentException("is a Structured Field string without its closing quote");
        }
        char c = text.charAt(i++);
        if (c == '"') {
          break;
        }
        if (c == '\\') {
          if (i >= text.length() || (text.charAt(i) != '"' && text.charAt(i) != '\\')) {
            throw new IllegalArgumentException(
                "has an escape other than \\\" or \\\\ in its Structured Field string");
          }
          key.append(text.charAt(i++));
        } else if (c >= ' ' && c <= '~') {
          key.append(c);
        } else {
          throw new IllegalArgumentException("has a character a Structured Field string cannot hold");
        }
      }
      if (i != text.length()) {
        throw new IllegalArgumentException("has characters after its Structured Field string");
      }
      text = key.toString();
    }
    if (text.isEmpty()) {
      throw new IllegalArgumentException("must not be empty");
    }
    if (!KEY.matcher(text).matches()) {
      throw new IllegalArgumentException("must be 1-255 characters of [A-Za-z0-9_-]");
    }
    return text;
  }

  private static Answer tooLarge(Route route) {
    return problem(413, "request_too_large",
        "request body exceeds " + route.maxRequestBytes + " bytes", Map.of(), null);
  }

  /**
   * Answers a request whose body was read before this filter saw it (500 {@code middleware_order})
   * and logs that once per filter: it is a wiring mistake, the same on every request.
   */
  private void orderMistake(HttpServletResponse response) throws IOException {
    if (orderLogged.compareAndSet(false, true)) {
      LOG.log(System.Logger.Level.ERROR, ORDER_DETAIL);
    }
    send(response, problem(500, "middleware_order", ORDER_DETAIL, Map.of(), null));
  }

  private static boolean chunked(HttpServletRequest request) {
    String coding = request.getHeader("Transfer-Encoding");
    return coding != null && coding.toLowerCase(Locale.ROOT).contains("chunked");
  }

  /**
   * Before an answer given without reading the request body (400 for a missing or malformed key):
   * reads what is left of the body and drops it, up to {@code limit} bytes (the route's {@code
   * max_request_bytes}, what the filter would have read anyway), so that the connection can carry
   * the caller's next request. When the body is longer, or cannot be read, the answer closes the
   * connection instead ({@link #closeAfter}).
   *
   * <p>Without this, the container finds the body unread only once the answer is on its way (Jetty
   * 12 looks when the request completes, after the answer went out as keep-alive) and closes the
   * connection without saying so: a client that reuses its pooled connection for the next request
   * (a POST, which HTTP clients do not resend by themselves) gets no answer at all.
   */
  private static void discardBody(
      HttpServletRequest request, HttpServletResponse response, long limit) {
    if (request.getContentLengthLong() > limit || !drained(request, limit)) {
      closeAfter(response);
    }
  }

  /** Whether the request's body was read to its end within {@code limit} bytes. */
  private static boolean drained(HttpServletRequest request, long limit) {
    try {
      ServletInputStream input = request.getInputStream();
      byte[] scratch = new byte[8192];
      long left = limit + 1;
      while (left > 0) {
        int n = input.read(scratch, 0, (int) Math.min(scratch.length, left));
        if (n < 0) {
          return true;
        }
        left -= n;
      }
      return false;
    } catch (IllegalStateException | IOException readerTakenOrGone) {
      return false;
    }
  }

  /**
   * Makes the answer close the connection ({@code Connection: close}): for an answer given with
   * part of the request body unread, which the container would otherwise close the connection over
   * after an answer that did not say so (see {@link #discardBody}).
   */
  private static void closeAfter(HttpServletResponse response) {
    response.setHeader("Connection", "close");
  }

  private static byte[] readAtMost(ServletInputStream input, long limit) throws IOException {
    byte[] data = input.readNBytes((int) Math.min(limit + 1, Integer.MAX_VALUE));
    return data.length > limit ? null : data;
  }

  /** The members a 409 outcome_pending adds: the state, and the stored reason only when exposed. */
  private static Map<String, String> pending(OutcomePendingException e, boolean exposeReason) {
    Map<String, String> members = new LinkedHashMap<>();
    members.put("state", e.state().name());
    if (exposeReason) {
      members.put("reason", e.reason());
    }
    return members;
  }

  /**
   * What the servlet threw, out of the ServletExceptions around it (Spring's DispatcherServlet
   * wraps every controller exception in one, "Request processing failed: ..."), so that the stored
   * reason names the handler's exception (http-scenarios.md, "What an HTTP caller learns about a
   * failed handler").
   */
  static Throwable handlerCause(Throwable e) {
    Throwable t = e;
    while (t instanceof ServletException && t.getCause() != null && t.getCause() != t) {
      t = t.getCause();
    }
    return t;
  }

  private static NoSideEffectException causeOf(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof NoSideEffectException n) {
        return n;
      }
    }
    return null;
  }

  private static void rethrow(Exception e) throws IOException, ServletException {
    if (e instanceof IOException io) {
      throw io;
    }
    if (e instanceof ServletException se) {
      throw se;
    }
    if (e instanceof RuntimeException re) {
      throw re;
    }
    throw new ServletException(e);
  }

  private static int httpOf(String code) {
    return switch (code) {
      case "INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE" -> 400;
      case "NOT_FOUND" -> 404;
      case "ALREADY_EXISTS", "ABORTED" -> 409;
      case "PERMISSION_DENIED" -> 403;
      case "UNAUTHENTICATED" -> 401;
      case "RESOURCE_EXHAUSTED" -> 429;
      case "UNIMPLEMENTED" -> 501;
      case "UNAVAILABLE" -> 503;
      case "DEADLINE_EXCEEDED" -> 504;
      default -> 500;
    };
  }

  /** A whole HTTP answer. */
  private record Answer(int status, List<HttpHeader> headers, byte[] body) {}

  /** A 5xx on a route that releases the key: released, then returned as it is. */
  private static final class Released extends NoSideEffectException {
    private static final long serialVersionUID = 1L;
    final transient Answer answer;

    Released(Answer answer) {
      super("handler answered " + answer.status());
      this.answer = answer;
    }
  }

  /** An answer that is not stored: the key is left UNKNOWN, the answer returned in full. */
  private static final class Unstorable extends Exception {
    private static final long serialVersionUID = 1L;
    final transient Answer answer;

    Unstorable(Answer answer, String reason) {
      super(reason);
      this.answer = answer;
    }
  }

  private static Answer problem(
      int status, String name, String detail, Map<String, String> extra, Duration retryAfter) {
    Map<String, Object> members = new LinkedHashMap<>();
    members.put("type", "https://idemd.dev/problems/" + name);
    members.put("title", title(status));
    members.put("status", status);
    members.put("detail", detail);
    members.putAll(extra);
    StringBuilder json = new StringBuilder("{");
    for (Map.Entry<String, Object> e : members.entrySet()) {
      if (json.length() > 1) {
        json.append(',');
      }
      json.append(quote(e.getKey())).append(':');
      json.append(e.getValue() instanceof Integer n ? n.toString() : quote(String.valueOf(e.getValue())));
    }
    json.append('}');
    List<HttpHeader> headers = new ArrayList<>();
    headers.add(new HttpHeader("content-type", "application/problem+json"));
    if (retryAfter != null) {
      long seconds = Math.max(1, (retryAfter.toMillis() + 999) / 1000);
      headers.add(new HttpHeader("retry-after", Long.toString(seconds)));
    }
    return new Answer(status, headers, json.toString().getBytes(StandardCharsets.UTF_8));
  }

  private static String title(int status) {
    return switch (status) {
      case 400 -> "Bad Request";
      case 401 -> "Unauthorized";
      case 403 -> "Forbidden";
      case 404 -> "Not Found";
      case 409 -> "Conflict";
      case 413 -> "Payload Too Large";
      case 422 -> "Unprocessable Entity";
      case 429 -> "Too Many Requests";
      case 500 -> "Internal Server Error";
      case 503 -> "Service Unavailable";
      case 504 -> "Gateway Timeout";
      default -> "Error";
    };
  }

  private static String quote(String text) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : text.toCharArray()) {
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    return out.append('"').toString();
  }

  /**
   * Sends an answer. Headers that filters before this one set (CORS, security headers) stay, unless
   * the answer has a header of the same name, which replaces them.
   */
  private static void send(HttpServletResponse response, Answer answer) throws IOException {
    response.setStatus(answer.status());
    java.util.Set<String> seen = new java.util.HashSet<>();
    for (HttpHeader h : answer.headers()) {
      String lower = h.name().toLowerCase(Locale.ROOT);
      if (lower.equals("content-length") || lower.equals("transfer-encoding") || lower.equals("connection")) {
        continue;
      }
      if (seen.add(lower)) {
        response.setHeader(h.name(), h.value());
      } else {
        response.addHeader(h.name(), h.value());
      }
    }
    response.setContentLength(answer.body().length);
    response.getOutputStream().write(answer.body());
    response.flushBuffer();
  }

  /** The request with its body buffered: the servlet reads the same bytes. */
  private static final class Buffered extends HttpServletRequestWrapper {
    private final byte[] body;

    Buffered(HttpServletRequest request, byte[] body) {
      super(request);
      this.body = body;
    }

    @Override
    public ServletInputStream getInputStream() {
      ByteArrayInputStream in = new ByteArrayInputStream(body);
      return new ServletInputStream() {
        @Override
        public int read() {
          return in.read();
        }

        @Override
        public int read(byte[] b, int off, int len) {
          return in.read(b, off, len);
        }

        @Override
        public boolean isFinished() {
          return in.available() == 0;
        }

        @Override
        public boolean isReady() {
          return true;
        }

        @Override
        public void setReadListener(ReadListener listener) {
          throw new UnsupportedOperationException("the body is already buffered");
        }
      };
    }

    @Override
    public BufferedReader getReader() {
      String encoding = getCharacterEncoding();
      Charset charset = encoding == null ? StandardCharsets.UTF_8 : Charset.forName(encoding);
      return new BufferedReader(new InputStreamReader(new ByteArrayInputStream(body), charset));
    }

    @Override
    public int getContentLength() {
      return body.length;
    }

    @Override
    public long getContentLengthLong() {
      return body.length;
    }
  }

  /** The response, buffered: nothing reaches the client until the filter sends it. */
  private static final class Capture extends HttpServletResponseWrapper {
    private final ByteArrayOutputStream body = new ByteArrayOutputStream();
    private final Map<String, List<String>> headers = new LinkedHashMap<>();
    private int status = 200;
    private PrintWriter writer;
    private String characterEncoding = "UTF-8";
    private String contentType;

    Capture(HttpServletResponse response) {
      super(response);
    }

    Answer answer() {
      if (writer != null) {
        writer.flush();
      }
      List<HttpHeader> list = new ArrayList<>();
      if (contentType != null && !headers.containsKey("content-type")) {
        list.add(new HttpHeader("content-type", contentType));
      }
      for (Map.Entry<String, List<String>> e : headers.entrySet()) {
        for (String v : e.getValue()) {
          list.add(new HttpHeader(e.getKey(), v));
        }
      }
      return new Answer(status, list, body.toByteArray());
    }

    private void put(String name, String value, boolean add) {
      String lower = name.toLowerCase(Locale.ROOT);
      if (lower.equals("content-type")) {
        contentType = value;
        headers.remove(lower);
        return;
      }
      List<String> values = add ? headers.getOrDefault(lower, new ArrayList<>()) : new ArrayList<>();
      values.add(value);
      headers.put(lower, values);
    }

    @Override
    public void setHeader(String name, String value) {
      put(name, value, false);
    }

    @Override
    public void addHeader(String name, String value) {
      put(name, value, true);
    }

    @Override
    public void setIntHeader(String name, int value) {
      put(name, Integer.toString(value), false);
    }

    @Override
    public void addIntHeader(String name, int value) {
      put(name, Integer.toString(value), true);
    }

    @Override
    public void setDateHeader(String name, long date) {
      put(name, java.time.format.DateTimeFormatter.RFC_1123_DATE_TIME.format(
          java.time.Instant.ofEpochMilli(date).atZone(java.time.ZoneOffset.UTC)), false);
    }

    @Override
    public void addDateHeader(String name, long date) {
      put(name, java.time.format.DateTimeFormatter.RFC_1123_DATE_TIME.format(
          java.time.Instant.ofEpochMilli(date).atZone(java.time.ZoneOffset.UTC)), true);
    }

    @Override
    public boolean containsHeader(String name) {
      return headers.containsKey(name.toLowerCase(Locale.ROOT))
          || (name.equalsIgnoreCase("content-type") && contentType != null);
    }

    @Override
    public String getHeader(String name) {
      if (name.equalsIgnoreCase("content-type")) {
        return contentType;
      }
      List<String> values = headers.get(name.toLowerCase(Locale.ROOT));
      return values == null || values.isEmpty() ? null : values.get(0);
    }

    @Override
    public Collection<String> getHeaders(String name) {
      List<String> values = headers.get(name.toLowerCase(Locale.ROOT));
      return values == null ? List.of() : List.copyOf(values);
    }

    @Override
    public Collection<String> getHeaderNames() {
      return List.copyOf(headers.keySet());
    }

    @Override
    public void setContentType(String type) {
      contentType = type;
    }

    @Override
    public String getContentType() {
      return contentType;
    }

    @Override
    public void setCharacterEncoding(String charset) {
      characterEncoding = charset;
    }

    @Override
    public String getCharacterEncoding() {
      return characterEncoding;
    }

    @Override
    public void setContentLength(int len) {}

    @Override
    public void setContentLengthLong(long len) {}

    @Override
    public void setStatus(int sc) {
      status = sc;
    }

    @Override
    public int getStatus() {
      return status;
    }

    @Override
    public void sendError(int sc) {
      status = sc;
    }

    @Override
    public void sendError(int sc, String msg) {
      status = sc;
    }

    @Override
    public void sendRedirect(String location) {
      status = 302;
      put("location", location, false);
    }

    @Override
    public ServletOutputStream getOutputStream() {
      return new ServletOutputStream() {
        @Override
        public void write(int b) {
          body.write(b);
        }

        @Override
        public void write(byte[] b, int off, int len) {
          body.write(b, off, len);
        }

        @Override
        public boolean isReady() {
          return true;
        }

        @Override
        public void setWriteListener(WriteListener listener) {
          throw new UnsupportedOperationException("the answer is buffered");
        }
      };
    }

    @Override
    public PrintWriter getWriter() {
      if (writer == null) {
        writer = new PrintWriter(new OutputStreamWriter(body, Charset.forName(characterEncoding)));
      }
      return writer;
    }

    @Override
    public void flushBuffer() {
      if (writer != null) {
        writer.flush();
      }
    }

    @Override
    public boolean isCommitted() {
      return false;
    }

    @Override
    public void reset() {
      resetBuffer();
      headers.clear();
      contentType = null;
      status = 200;
    }

    @Override
    public void resetBuffer() {
      body.reset();
    }
  }
}
