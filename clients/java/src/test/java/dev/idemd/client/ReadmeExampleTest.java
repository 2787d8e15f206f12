package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.client.testing.RepoPaths;
import java.io.StringWriter;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.UUID;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.io.TempDir;

/** Compiles the README's usage block as written and runs it twice against a live idemd. */
@ExtendWith(LiveIdemd.class)
class ReadmeExampleTest {
  private static final Pattern USAGE_BLOCK =
      Pattern.compile("## Usage\\s+```java\\n(.*?)\\n```", Pattern.DOTALL);

  @Test
  void readmeUsageRunsAsWritten(IdemdServer server, @TempDir Path dir) throws Exception {
    String readme = Files.readString(RepoPaths.sdk().resolve("README.md"), StandardCharsets.UTF_8);
    Matcher m = USAGE_BLOCK.matcher(readme);
    assertTrue(m.find(), "README.md has no ```java block under '## Usage'");
    String snippet = m.group(1);
    assertTrue(snippet.lines().count() <= 6, "the usage block should stay short");

    String source =
        "package readme;\n"
            + "import dev.idemd.client.*;\n"
            + "public final class Snippet extends ReadmeHarness {\n"
            + "  @Override\n"
            + "  public void run(String target, String token, String key, String body)"
            + " throws Exception {\n"
            + snippet
            + "\n  }\n}\n";
    Path src = dir.resolve("src/readme/Snippet.java");
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
                List.of(
                    "-proc:none",
                    "-classpath",
                    System.getProperty("java.class.path"),
                    "-d",
                    classes.toString()),
                null,
                javac.getStandardFileManager(null, null, StandardCharsets.UTF_8)
                    .getJavaFileObjects(src.toFile()))
            .call();
    assertTrue(compiled, "the README block does not compile:\n" + diagnostics + "\n" + source);

    try (URLClassLoader loader =
        new URLClassLoader(new URL[] {classes.toUri().toURL()}, getClass().getClassLoader())) {
      ReadmeHarness example =
          (ReadmeHarness) loader.loadClass("readme.Snippet").getDeclaredConstructor().newInstance();
      String key = UUID.randomUUID().toString();
      String body = "{\"amount\":4200,\"currency\":\"usd\",\"customer\":\"cus_8812\"}";
      String token = "conformance-token-alice-3f9a";
      example.run(server.address(), token, key, body);
      example.run(server.address(), token, key, body);

      assertEquals(1, example.payments.charges(), "the handler must charge once");
      assertEquals(List.of(IdemdClient.downstreamKey(key, "charge")), example.payments.keys());
      assertEquals(2, example.answers.size());
      ReadmeHarness.Answer first = example.answers.get(0);
      ReadmeHarness.Answer retry = example.answers.get(1);
      assertFalse(first.replayed());
      assertEquals(201, first.response().status());
      assertTrue(retry.replayed());
      assertEquals(first.response(), retry.response());
    }
  }
}
