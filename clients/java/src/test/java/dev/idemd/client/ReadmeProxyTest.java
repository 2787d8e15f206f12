package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.client.testing.Nginx;
import dev.idemd.client.testing.RepoPaths;
import java.io.StringWriter;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.io.TempDir;

/**
 * Compiles the README's block for a proxy or ingress with TLS as written and runs it twice against
 * idemd behind nginx's {@code tls} profile (scripts/nginx.sh): the first executes, the second
 * replays.
 */
@ExtendWith(LiveIdemd.class)
public class ReadmeProxyTest {
  private static final Pattern BLOCK =
      Pattern.compile(
          "### Through a proxy or an ingress, with TLS\\s.*?```java\\n(.*?)\\n```", Pattern.DOTALL);

  /** What the block refers to but leaves to the reader: {@code respond}. */
  public abstract static class Harness {
    /** What the block answered, in order. */
    public final List<ReadmeHarness.Answer> answers = new ArrayList<>();

    /** Answers the HTTP caller (recorded). */
    protected void respond(HttpResponseSpec response, boolean replayed) {
      answers.add(new ReadmeHarness.Answer(response, replayed));
    }

    /** The README block. */
    public abstract void run(String ingress, String caFile, String token, String key)
        throws Exception;
  }

  @Test
  void readmeProxyBlockRunsAsWritten(IdemdServer server, @TempDir Path dir) throws Exception {
    String readme = Files.readString(RepoPaths.sdk().resolve("README.md"), StandardCharsets.UTF_8);
    Matcher m = BLOCK.matcher(readme);
    assertTrue(m.find(), "README.md has no ```java block under '### Through a proxy or an ingress, with TLS'");
    String source =
        "package readme;\n"
            + "import dev.idemd.client.*;\n"
            + "import java.nio.file.Path;\n"
            + "import java.time.Duration;\n"
            + "public final class ProxySnippet extends dev.idemd.client.ReadmeProxyTest.Harness {\n"
            + "  @Override\n"
            + "  public void run(String ingress, String caFile, String token, String key)"
            + " throws Exception {\n"
            + m.group(1)
            + "\n  }\n}\n";
    Path src = dir.resolve("src/readme/ProxySnippet.java");
    Files.createDirectories(src.getParent());
    Files.writeString(src, source, StandardCharsets.UTF_8);
    Path classes = Files.createDirectories(dir.resolve("classes"));
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    StringWriter diagnostics = new StringWriter();
    boolean compiled =
        javac
            .getTask(
                diagnostics,
                null,
                null,
                List.of("-proc:none", "-classpath", System.getProperty("java.class.path"),
                    "-d", classes.toString()),
                null,
                javac.getStandardFileManager(null, null, StandardCharsets.UTF_8)
                    .getJavaFileObjects(src.toFile()))
            .call();
    assertTrue(compiled, "the README block does not compile:\n" + diagnostics + "\n" + source);

    Path certs = RepoPaths.testCerts();
    try (Nginx nginx = Nginx.start(server.address(), "tls", certs);
        URLClassLoader loader =
            new URLClassLoader(new URL[] {classes.toUri().toURL()}, getClass().getClassLoader())) {
      Harness example =
          (Harness) loader.loadClass("readme.ProxySnippet").getDeclaredConstructor().newInstance();
      String key = UUID.randomUUID().toString();
      String ingress = "localhost:" + nginx.port(); // server.crt names localhost
      String ca = certs.resolve("ca.pem").toString();
      example.run(ingress, ca, ProxyMatrixTest.TOKEN, key);
      example.run(ingress, ca, ProxyMatrixTest.TOKEN, key);
      assertEquals(2, example.answers.size());
      assertFalse(example.answers.get(0).replayed());
      assertEquals(201, example.answers.get(0).response().status());
      assertTrue(example.answers.get(1).replayed());
      assertEquals(example.answers.get(0).response(), example.answers.get(1).response());
    }
  }
}
