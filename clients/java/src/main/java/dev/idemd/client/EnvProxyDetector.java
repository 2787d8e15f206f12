package dev.idemd.client;

import io.grpc.HttpConnectProxiedSocketAddress;
import io.grpc.ProxiedSocketAddress;
import io.grpc.ProxyDetector;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLDecoder;
import java.net.UnknownHostException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The proxy environment variables grpcio and grpc-js honour, which grpc-java does not read (it asks
 * {@link java.net.ProxySelector}, i.e. the {@code https.proxyHost} / {@code https.proxyPort} / {@code
 * http.nonProxyHosts} system properties, and the deprecated {@code GRPC_PROXY_EXP}): the first of
 * {@code grpc_proxy}, {@code https_proxy}, {@code HTTPS_PROXY}, {@code http_proxy} that is set
 * names an HTTP CONNECT proxy ({@code [http://][user:password@]host[:port]}, port 80 by default),
 * and the first of {@code no_grpc_proxy}, {@code no_proxy}, {@code NO_PROXY} lists the targets
 * reached directly: {@code *}, host names (a name also covers its subdomains; a leading dot is
 * allowed), IP addresses and CIDR blocks, separated by commas. Only a target that a name resolver
 * resolves by DNS (the default {@code host:port} / {@code dns:///} targets) goes through it.
 */
final class EnvProxyDetector implements ProxyDetector {
  private final String proxyHost;
  private final int proxyPort;
  private final String username;
  private final String password;
  private final List<String> noProxy;

  private EnvProxyDetector(
      String proxyHost, int proxyPort, String username, String password, List<String> noProxy) {
    this.proxyHost = proxyHost;
    this.proxyPort = proxyPort;
    this.username = username;
    this.password = password;
    this.noProxy = noProxy;
  }

  /**
   * The detector of {@code env}, or null when it names no proxy (grpc-java's default detector then
   * applies).
   *
   * @throws IllegalArgumentException if the proxy variable is not an {@code http://} proxy address
   */
  static EnvProxyDetector fromEnvironment(Map<String, String> env) {
    String variable = null;
    String value = null;
    for (String name : List.of("grpc_proxy", "https_proxy", "HTTPS_PROXY", "http_proxy")) {
      String v = env.get(name);
      if (v != null && !v.isBlank()) {
        variable = name;
        value = v.trim();
        break;
      }
    }
    if (value == null) {
      return null;
    }
    URI uri;
    try {
      uri = new URI(value.contains("://") ? value : "http://" + value);
    } catch (URISyntaxException e) {
      throw new IllegalArgumentException(variable + " is not a proxy address: " + e.getMessage(), e);
    }
    if (!"http".equalsIgnoreCase(uri.getScheme()) || uri.getHost() == null) {
      throw new IllegalArgumentException(
          variable + " must name an HTTP CONNECT proxy, [http://][user:password@]host[:port]");
    }
    String user = null;
    String pass = null;
    if (uri.getRawUserInfo() != null) {
      String[] parts = uri.getRawUserInfo().split(":", 2);
      user = URLDecoder.decode(parts[0], StandardCharsets.UTF_8);
      pass = parts.length > 1 ? URLDecoder.decode(parts[1], StandardCharsets.UTF_8) : "";
    }
    String host = uri.getHost();
    if (host.startsWith("[") && host.endsWith("]")) {
      host = host.substring(1, host.length() - 1);
    }
    List<String> noProxy = new ArrayList<>();
    for (String name : List.of("no_grpc_proxy", "no_proxy", "NO_PROXY")) {
      String v = env.get(name);
      if (v != null) {
        for (String entry : v.split(",")) {
          String e = entry.trim().toLowerCase(Locale.ROOT);
          if (!e.isEmpty()) {
            noProxy.add(e);
          }
        }
        break;
      }
    }
    return new EnvProxyDetector(
        host, uri.getPort() == -1 ? 80 : uri.getPort(), user, pass, List.copyOf(noProxy));
  }

  @Override
  public ProxiedSocketAddress proxyFor(SocketAddress target) {
    if (!(target instanceof InetSocketAddress)) {
      return null;
    }
    InetSocketAddress address = (InetSocketAddress) target;
    if (bypassed(address.getHostString())) {
      return null;
    }
    // Resolved now, as grpc-java's own detector does; the target is not (the proxy resolves it).
    HttpConnectProxiedSocketAddress.Builder proxied =
        HttpConnectProxiedSocketAddress.newBuilder()
            .setProxyAddress(new InetSocketAddress(proxyHost, proxyPort))
            .setTargetAddress(address);
    if (username != null) {
      proxied.setUsername(username).setPassword(password);
    }
    return proxied.build();
  }

  /** Whether {@code no_proxy} sends {@code host} directly. */
  boolean bypassed(String host) {
    String h = host.toLowerCase(Locale.ROOT);
    if (h.startsWith("[") && h.endsWith("]")) {
      h = h.substring(1, h.length() - 1);
    }
    for (String entry : noProxy) {
      if (entry.equals("*")) {
        return true;
      }
      if (entry.contains("/")) {
        if (inCidr(h, entry)) {
          return true;
        }
        continue;
      }
      String name = entry.startsWith(".") ? entry.substring(1) : entry;
      if (h.equals(name) || h.endsWith("." + name)) {
        return true;
      }
    }
    return false;
  }

  private static boolean inCidr(String host, String cidr) {
    if (!isIpLiteral(host)) {
      return false;
    }
    String[] parts = cidr.split("/", 2);
    try {
      if (!isIpLiteral(parts[0])) {
        return false;
      }
      byte[] address = InetAddress.getByName(host).getAddress();
      byte[] network = InetAddress.getByName(parts[0]).getAddress();
      int bits = Integer.parseInt(parts[1]);
      if (address.length != network.length || bits < 0 || bits > 8 * address.length) {
        return false;
      }
      for (int i = 0; i < bits; i++) {
        int mask = 0x80 >> (i % 8);
        if ((address[i / 8] & mask) != (network[i / 8] & mask)) {
          return false;
        }
      }
      return true;
    } catch (UnknownHostException | NumberFormatException e) {
      return false;
    }
  }

  /** An IPv4 or IPv6 literal (so that InetAddress.getByName never looks a name up). */
  private static boolean isIpLiteral(String s) {
    return s.contains(":") || s.matches("[0-9.]+");
  }
}
