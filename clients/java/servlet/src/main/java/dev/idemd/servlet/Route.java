package dev.idemd.servlet;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One route of the {@link IdempotencyFilter}, as in {@code idemd proxy}'s routes file
 * (docs/proxy.md). The path is a template: {@code {name}} matches one segment and names the
 * endpoint ({@code POST /v1/payments/{id}}: every payment shares one endpoint); a final {@code /*}
 * matches any rest and the endpoint is the request's own path. Settings left unset (null) inherit
 * the defaults. Mutable while the filter is being built; the filter copies what it needs.
 */
public final class Route {
  /** Default {@code store_headers}: what describes a body and the resource it created. */
  public static final List<String> DEFAULT_STORE_HEADERS =
      List.of(
          "content-type",
          "content-encoding",
          "content-language",
          "content-location",
          "location",
          "etag",
          "last-modified",
          "link");

  final String path;
  List<String> methods;
  Boolean keyRequired;
  Long maxRequestBytes;
  Long maxResponseBytes;
  Duration maxWait;
  Boolean store5xx;
  List<String> ignoreFields;
  List<String> storeHeaders;
  Boolean localFingerprint;
  Duration ttl;
  Duration lease;
  Boolean exposeFailureReason;

  private Route(String path) {
    if (!path.startsWith("/")) {
      throw new IllegalArgumentException("path: \"" + path + "\" must start with /");
    }
    this.path = path;
  }

  /** A route for a path template. */
  public static Route path(String path) {
    return new Route(path);
  }

  /** Methods made idempotent (default POST and PATCH); others pass through untouched. */
  public Route methods(String... methods) {
    List<String> upper = new ArrayList<>();
    for (String m : methods) {
      upper.add(m.toUpperCase(Locale.ROOT));
    }
    this.methods = List.copyOf(upper);
    return this;
  }

  /** Whether a request without a key is refused (400, default) or passed through. */
  public Route keyRequired(boolean required) {
    this.keyRequired = required;
    return this;
  }

  /** Larger bodies get 413 before any claim (default 1 MiB). */
  public Route maxRequestBytes(long bytes) {
    this.maxRequestBytes = requireNonNegative(bytes, "max_request_bytes");
    return this;
  }

  /** Larger answers are returned, not stored; the key is left UNKNOWN (default 256 KiB). */
  public Route maxResponseBytes(long bytes) {
    this.maxResponseBytes = requireNonNegative(bytes, "max_response_bytes");
    return this;
  }

  /** How long a duplicate waits for the first request (default 0: 409 at once). */
  public Route maxWait(Duration wait) {
    this.maxWait = wait;
    return this;
  }

  /** {@code true}: a 5xx answer is stored and replayed; {@code false} (default): it frees the key. */
  public Route store5xx(boolean store) {
    this.store5xx = store;
    return this;
  }

  /** JSON Pointers left out of the fingerprint (timestamps, nonces). */
  public Route ignoreFields(List<String> pointers) {
    this.ignoreFields = List.copyOf(pointers);
    return this;
  }

  /** Response headers stored and replayed; {@code set-cookie} only if listed. */
  public Route storeHeaders(List<String> names) {
    List<String> lower = new ArrayList<>();
    for (String n : names) {
      lower.add(n.toLowerCase(Locale.ROOT));
    }
    this.storeHeaders = List.copyOf(lower);
    return this;
  }

  /** {@code true}: only the body's SHA-256 leaves the process (local fingerprint). */
  public Route localFingerprint(boolean local) {
    this.localFingerprint = local;
    return this;
  }

  /** Record TTL (default: the endpoint policy's). */
  public Route ttl(Duration ttl) {
    this.ttl = ttl;
    return this;
  }

  /** Lease (default: the endpoint policy's); extended while the handler runs. */
  public Route lease(Duration lease) {
    this.lease = lease;
    return this;
  }

  /**
   * {@code true}: a 409 {@code outcome_pending} carries the key's stored reason (the handler's
   * exception text) as {@code reason}. Off by default, for development only: the reason is written
   * for operators, and exception messages carry internal names, SQL and sometimes secrets.
   */
  public Route exposeFailureReason(boolean expose) {
    this.exposeFailureReason = expose;
    return this;
  }

  /**
   * A route from a table of the proxy's routes file as parsed JSON ({@code path}, {@code methods},
   * {@code key}, {@code max_request_bytes}, {@code max_response_bytes}, {@code max_wait}, {@code
   * on_5xx}, {@code ignore_fields}, {@code store_headers}, {@code fingerprint}, {@code ttl}, {@code
   * lease}, {@code expose_failure_reason}). Names in {@code ignore} (such as the proxy's {@code
   * upstream_timeout}) are dropped; any other unknown name is an error naming it.
   */
  public static Route fromTable(Map<String, ?> table, Set<String> ignore) {
    Object p = table.get("path");
    Route route = new Route(p == null ? "/*" : p.toString());
    for (Map.Entry<String, ?> e : table.entrySet()) {
      String name = e.getKey();
      Object v = e.getValue();
      if (ignore.contains(name) || name.equals("path")) {
        continue;
      }
      String where = route.path + "." + name;
      switch (name) {
        case "methods" -> route.methods(strings(v, where).toArray(String[]::new));
        case "key" -> route.keyRequired(oneOf(v, where, "require", "optional").equals("require"));
        case "max_request_bytes" -> route.maxRequestBytes(number(v, where));
        case "max_response_bytes" -> route.maxResponseBytes(number(v, where));
        case "max_wait" -> route.maxWait(duration(v, where));
        case "on_5xx" -> route.store5xx(oneOf(v, where, "release", "store").equals("store"));
        case "ignore_fields" -> route.ignoreFields(strings(v, where));
        case "store_headers" -> route.storeHeaders(strings(v, where));
        case "fingerprint" ->
            route.localFingerprint(oneOf(v, where, "server", "local").equals("local"));
        case "ttl" -> route.ttl(duration(v, where));
        case "lease" -> route.lease(duration(v, where));
        case "expose_failure_reason" -> route.exposeFailureReason(bool(v, where));
        default -> throw new IllegalArgumentException(where + ": unknown setting");
      }
    }
    return route;
  }

  private static long requireNonNegative(long value, String name) {
    if (value < 0) {
      throw new IllegalArgumentException(name + ": must not be negative");
    }
    return value;
  }

  private static List<String> strings(Object v, String where) {
    if (!(v instanceof List<?> list)) {
      throw new IllegalArgumentException(where + ": must be a list of strings");
    }
    List<String> out = new ArrayList<>();
    for (Object item : list) {
      out.add(String.valueOf(item));
    }
    return out;
  }

  private static String oneOf(Object v, String where, String... allowed) {
    String text = String.valueOf(v);
    for (String a : allowed) {
      if (a.equals(text)) {
        return text;
      }
    }
    throw new IllegalArgumentException(where + ": \"" + text + "\" must be one of " + List.of(allowed));
  }

  private static boolean bool(Object v, String where) {
    if (!(v instanceof Boolean b)) {
      throw new IllegalArgumentException(where + ": must be true or false");
    }
    return b;
  }

  private static long number(Object v, String where) {
    try {
      return new java.math.BigDecimal(String.valueOf(v)).longValueExact();
    } catch (ArithmeticException | NumberFormatException e) {
      throw new IllegalArgumentException(where + ": must be a whole number", e);
    }
  }

  private static final Pattern DURATION = Pattern.compile("(\\d+(?:\\.\\d+)?)\\s*(ms|s|m)?");

  /** A duration: {@code "5s"}, {@code "250ms"}, {@code "1m"} (the routes file's spelling). */
  static Duration duration(Object v, String where) {
    Matcher m = DURATION.matcher(String.valueOf(v).trim());
    if (!m.matches()) {
      throw new IllegalArgumentException(where + ": \"" + v + "\" is not a duration such as 5s");
    }
    double amount = Double.parseDouble(m.group(1));
    String unit = m.group(2) == null ? "s" : m.group(2);
    double millis =
        switch (unit) {
          case "ms" -> amount;
          case "m" -> amount * 60_000;
          default -> amount * 1000;
        };
    return Duration.ofNanos((long) (millis * 1_000_000));
  }
}
