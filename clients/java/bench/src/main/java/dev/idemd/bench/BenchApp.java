package dev.idemd.bench;

import dev.idemd.client.IdemdClient;
import dev.idemd.servlet.IdempotencyFilter;
import dev.idemd.servlet.Route;
import jakarta.servlet.DispatcherType;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.EnumSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.eclipse.jetty.ee10.servlet.FilterHolder;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.boot.web.servlet.context.ServletWebServerApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.http.MediaType;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;

/**
 * The middleware load bench's app (README.md): {@code POST /pay} counts its executions and answers
 * 201 {@code {"ok":true,"execution":N}}, in Spring Boot (embedded Tomcat, the filter registered as
 * a user registers it) or in Jetty 12 (as the filter's tests run it), with or without the idemd
 * servlet filter in front (one route, {@code /pay}, defaults otherwise; tenant {@code bench};
 * plaintext to idemd).
 *
 * <pre>{@code
 * BenchApp --framework spring|jetty --middleware on|off --port PORT --idemd HOST:PORT
 * }</pre>
 *
 * <p>Prints {@code listening on PORT} on stdout once it serves, and nothing else there (the
 * frameworks' own logging goes to stderr); stops on SIGTERM.
 */
public final class BenchApp {
  static final String TENANT = "bench";

  private BenchApp() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> flags = flags(args);
    String framework = flags.get("framework");
    boolean middleware = switch (flags.get("middleware")) {
      case "on" -> true;
      case "off" -> false;
      default -> throw usage("--middleware is on or off");
    };
    int port = Integer.parseInt(flags.get("port"));
    String idemd = flags.get("idemd");
    // The bench script reads stdout for the one ready line: everything else (Spring's banner and
    // logs, Jetty's) goes to stderr. Logback's console appender looks System.out up on every write,
    // so swapping it before the frameworks start moves their output too.
    PrintStream stdout = System.out;
    System.setOut(System.err);
    int bound = switch (framework) {
      case "spring" -> spring(middleware, port, idemd);
      case "jetty" -> jetty(middleware, port, idemd);
      default -> throw usage("--framework is spring or jetty");
    };
    stdout.println("listening on " + bound);
    stdout.flush();
  }

  private static Map<String, String> flags(String[] args) {
    Map<String, String> flags = new LinkedHashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw usage("unexpected argument " + args[i]);
      }
      flags.put(args[i].substring(2), args[i + 1]);
    }
    for (String name : new String[] {"framework", "middleware", "port", "idemd"}) {
      if (!flags.containsKey(name)) {
        throw usage("--" + name + " is required");
      }
    }
    return flags;
  }

  private static IllegalArgumentException usage(String why) {
    return new IllegalArgumentException(why + "; usage: BenchApp --framework spring|jetty"
        + " --middleware on|off --port PORT --idemd HOST:PORT");
  }

  static IdemdClient client(String idemd) {
    return IdemdClient.builder(idemd).plaintext().tenantId(TENANT).build();
  }

  static IdempotencyFilter filter(IdemdClient client) {
    return IdempotencyFilter.builder(client).route(Route.path("/pay")).build();
  }

  static String answer(long execution) {
    return "{\"ok\":true,\"execution\":" + execution + "}";
  }

  // ---------------------------------------------------------------------------------------------
  // Spring Boot

  private static int spring(boolean middleware, int port, String idemd) {
    SpringApplication app = new SpringApplication(SpringBench.class);
    Map<String, Object> properties = new LinkedHashMap<>();
    properties.put("server.address", "127.0.0.1");
    properties.put("server.port", port);
    properties.put("spring.main.banner-mode", "off");
    properties.put("logging.level.root", "warn");
    properties.put("bench.middleware", middleware);
    properties.put("bench.idemd", idemd);
    app.setDefaultProperties(properties);
    ServletWebServerApplicationContext context =
        (ServletWebServerApplicationContext) app.run();
    return context.getWebServer().getPort();
  }

  /** The Spring Boot app; its shutdown hook closes the context, and so the client, on SIGTERM. */
  @SpringBootApplication
  public static class SpringBench {
    @Bean(destroyMethod = "close")
    @ConditionalOnProperty(name = "bench.middleware", havingValue = "true")
    IdemdClient idemdClient(@Value("${bench.idemd}") String idemd) {
      return client(idemd);
    }

    @Bean
    @ConditionalOnProperty(name = "bench.middleware", havingValue = "true")
    FilterRegistrationBean<IdempotencyFilter> idempotency(IdemdClient client) {
      FilterRegistrationBean<IdempotencyFilter> registration =
          new FilterRegistrationBean<>(filter(client));
      registration.addUrlPatterns("/*");
      return registration;
    }
  }

  @RestController
  static class PayController {
    private final AtomicLong executions = new AtomicLong();

    @PostMapping("/pay")
    ResponseEntity<String> pay(@RequestBody String body) {
      return ResponseEntity.status(201)
          .contentType(MediaType.APPLICATION_JSON)
          .body(answer(executions.incrementAndGet()));
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Jetty 12

  private static int jetty(boolean middleware, int port, String idemd) throws Exception {
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost("127.0.0.1");
    connector.setPort(port);
    server.addConnector(connector);
    ServletContextHandler context = new ServletContextHandler();
    IdemdClient client = middleware ? client(idemd) : null;
    if (client != null) {
      context.addFilter(new FilterHolder(filter(client)), "/*", EnumSet.of(DispatcherType.REQUEST));
    }
    context.addServlet(new ServletHolder(new PayServlet()), "/pay");
    server.setHandler(context);
    server.setStopAtShutdown(true);
    server.start();
    if (client != null) {
      Runtime.getRuntime().addShutdownHook(new Thread(client::close, "idemd-client-close"));
    }
    return connector.getLocalPort();
  }

  static final class PayServlet extends HttpServlet {
    private static final long serialVersionUID = 1L;
    private final AtomicLong executions = new AtomicLong();

    @Override
    protected void doPost(HttpServletRequest request, HttpServletResponse response)
        throws IOException {
      request.getInputStream().readAllBytes();
      byte[] body = answer(executions.incrementAndGet()).getBytes(StandardCharsets.UTF_8);
      response.setStatus(201);
      response.setContentType("application/json");
      response.setContentLength(body.length);
      response.getOutputStream().write(body);
    }
  }
}
