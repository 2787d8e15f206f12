package dev.idemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.LiveIdemd;
import dev.idemd.client.testing.RepoPaths;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.jar.JarFile;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.io.TempDir;

/**
 * The SDK installs from outside the repository exactly as README.md's "Install" section says, and
 * a fresh Maven project that declares the README's dependency runs against a live idemd
 * (clients/conformance/README.md, "Consumer project").
 *
 * <p>The "checkout" is a copy of exactly the files git would ship for clients/java and proto/
 * (tracked, plus untracked and not ignored), so stubs generated into target/ cannot hide a
 * packaging defect.
 *
 * <p>Maven repositories: the install must not touch the developer's local repository (it would
 * overwrite an idemd-client they installed, and a stale copy there could stand in for the fresh
 * one), yet a temporary local repository alone would download every plugin and dependency from
 * Maven Central again on each run. Maven 3.8 has no chained local repository
 * ({@code maven.repo.local.tail} is 3.9+), so both nested builds run with a temporary {@code
 * -Dmaven.repo.local} and a global settings file that adds this build's local repository as a
 * read-only {@code file://} remote, tried before Central: what is cached is copied from disk (about
 * 70 MB, mostly protoc and the gRPC plugin); only what is missing there comes from Central, into
 * the temporary repository, so on every run: the jar and install plugins, which the outer {@code
 * mvn test} never uses, and the exec plugin (a few dozen small files). The consumer uses that same
 * temporary repository, so the idemd-client it resolves can only be the one just installed (the
 * program prints the jar it loaded the SDK from, and the test checks it). {@code -gs} replaces
 * Maven's global conf/settings.xml only; the user settings (~/.m2/settings.xml: mirrors, proxies)
 * still apply. An outer offline build ({@code -o}) runs the nested ones offline too.
 */
@ExtendWith(LiveIdemd.class)
class ConsumerProjectTest {
  /**
   * What the Install section's sh block must say; the test runs it (plus Maven flags, below): the
   * core, then the servlet filter, whose tests skip themselves without IDEMD_BIN, as on a fresh
   * clone.
   */
  static final List<String> INSTALL =
      List.of(
          "mvn -f clients/java/pom.xml install -DskipTests",
          "mvn -f clients/java/servlet/pom.xml install");

  private static final String GROUP_ID = "dev.idemd";
  private static final String ARTIFACT_ID = "idemd-client";
  private static final String SERVLET_ARTIFACT_ID = "idemd-servlet";
  private static final String MODULE_NAME = "dev.idemd.client";
  private static final Pattern INSTALL_SECTION =
      Pattern.compile("^## Install\\n(.*?)(?=^## )", Pattern.DOTALL | Pattern.MULTILINE);
  private static final long MAVEN_TIMEOUT_MINUTES = 10;

  /** A user's first program: execute, replay, then the same key with a different body. */
  private static final String PROGRAM =
      """
      package consumer;

      import dev.idemd.client.*;

      public final class Main {
        public static void main(String[] args) {
          String key = System.getenv("IDEMPOTENCY_KEY");
          int[] calls = {0};
          Handler charge = ex -> { calls[0]++; return HttpResponseSpec.json(201, "{\\"id\\":\\"pay_1\\"}"); };
          try (IdemdClient idemd = IdemdClient.builder(System.getenv("IDEMD_ADDR"))
              .bearerToken(System.getenv("IDEMD_TOKEN")).plaintext().build()) {
            for (String body : new String[] {"{\\"amount\\":4200}", "{\\"amount\\":4200}", "{\\"amount\\":9900}"}) {
              HttpRequestSpec payment = HttpRequestSpec.json("POST", "/v1/payments", body);
              try {
                ExecuteResult r = idemd.executeOnce("POST /v1/payments", key, payment, charge);
                System.out.println(r.response().status() + " " + r.response().bodyText()
                    + " replayed: " + r.replayed() + " handler calls: " + calls[0]);
              } catch (KeyReuseException e) {
                System.out.println("key reuse: " + e.httpStatus() + " " + e.errorCode()
                    + " handler calls: " + calls[0]);
              }
            }
          }
          // Where the SDK was loaded from: the jar the Install command put in the local repository.
          System.out.println("sdk: " + IdemdClient.class.getProtectionDomain().getCodeSource().getLocation().getPath());
        }
      }
      """;

  /** The consumer's pom; DEPENDENCY is replaced by the README's xml block, as written. */
  private static final String CONSUMER_POM =
      """
      <?xml version="1.0" encoding="UTF-8"?>
      <project xmlns="http://maven.apache.org/POM/4.0.0"
               xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
               xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 https://maven.apache.org/xsd/maven-4.0.0.xsd">
        <modelVersion>4.0.0</modelVersion>
        <groupId>com.example</groupId>
        <artifactId>consumer</artifactId>
        <version>1.0.0</version>
        <properties>
          <maven.compiler.release>17</maven.compiler.release>
          <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
        </properties>
        <dependencies>
      DEPENDENCY
        </dependencies>
        <build>
          <plugins>
            <!-- The versions the SDK's own build uses, so they come from the local repository. -->
            <plugin>
              <groupId>org.apache.maven.plugins</groupId>
              <artifactId>maven-compiler-plugin</artifactId>
              <version>3.13.0</version>
            </plugin>
            <plugin>
              <groupId>org.apache.maven.plugins</groupId>
              <artifactId>maven-resources-plugin</artifactId>
              <version>3.3.1</version>
            </plugin>
            <!-- mvn compile exec:exec: a JVM of its own on the runtime classpath. -->
            <plugin>
              <groupId>org.codehaus.mojo</groupId>
              <artifactId>exec-maven-plugin</artifactId>
              <version>3.5.0</version>
              <configuration>
                <executable>${java.home}/bin/java</executable>
                <arguments>
                  <argument>-classpath</argument>
                  <classpath/>
                  <argument>consumer.Main</argument>
                </arguments>
              </configuration>
            </plugin>
          </plugins>
        </build>
      </project>
      """;

  @Test
  void readmeInstallSectionIsWhatThisTestRuns() throws IOException {
    assertEquals(INSTALL, installCommands());
    String version = projectVersion();
    assertFalse(version.endsWith("-SNAPSHOT"), "a consumer pins a release version, not " + version);
    String dependency = dependencyBlock();
    assertEquals(GROUP_ID, element(dependency, "groupId"));
    assertEquals(ARTIFACT_ID, element(dependency, "artifactId"));
    assertEquals(version, element(dependency, "version"), "the README's version must be the pom's");
  }

  @Test
  void freshProjectUsesTheInstalledJar(IdemdServer server, @TempDir Path tmp) throws Exception {
    assertOutsideRepository(tmp);
    Path checkout = tmp.resolve("idemd");
    copyShippedFiles(checkout, "clients/java", "proto");
    Path localRepo = tmp.resolve("m2");
    Path settings = writeSettings(tmp);

    assertEquals(INSTALL, installCommands());
    for (String command : INSTALL) {
      // A fresh clone has no idemd: IDEMD_BIN unset, as a user runs it.
      Run installed =
          maven(
              Arrays.asList(command.split(" ")), checkout, localRepo, settings, Map.of(), "IDEMD_BIN");
      assertEquals(0, installed.exit(), () -> "`" + command + "` failed:\n" + installed.tail());
    }

    Path jar = installedJar(localRepo, ARTIFACT_ID);
    assertTrue(Files.isRegularFile(jar), () -> "no jar at " + jar);
    Path servletJar = installedJar(localRepo, SERVLET_ARTIFACT_ID);
    assertTrue(Files.isRegularFile(servletJar), () -> "no jar at " + servletJar);
    try (JarFile file = new JarFile(jar.toFile())) {
      assertNotNull(file.getManifest(), "the jar has no manifest");
      assertEquals(
          MODULE_NAME,
          file.getManifest().getMainAttributes().getValue("Automatic-Module-Name"),
          "the jar's Automatic-Module-Name");
      // Self-contained: the generated stubs are in the jar, nothing refers back to proto/.
      assertNotNull(file.getEntry("dev/idemd/v1/IdempotencyGrpc.class"), "stubs missing");
      assertNotNull(file.getEntry("dev/idemd/client/IdemdClient.class"), "SDK classes missing");
      assertTrue(
          file.stream().noneMatch(e -> e.getName().startsWith("dev/idemd/examples/")),
          "the HTTP example must not ship in the jar");
    }

    Path consumer = tmp.resolve("consumer");
    Path main = consumer.resolve("src/main/java/consumer/Main.java");
    Files.createDirectories(main.getParent());
    Files.writeString(main, PROGRAM, StandardCharsets.UTF_8);
    Files.writeString(
        consumer.resolve("pom.xml"),
        CONSUMER_POM.replace("DEPENDENCY", dependencyBlock().indent(4).stripTrailing()),
        StandardCharsets.UTF_8);
    Run program =
        maven(
            List.of("mvn", "-q", "compile", "exec:exec"),
            consumer,
            localRepo,
            settings,
            Map.of(
                "IDEMD_ADDR", server.address(),
                "IDEMD_TOKEN", "conformance-token-alice-3f9a",
                "IDEMPOTENCY_KEY", UUID.randomUUID().toString()));
    assertEquals(
        0, program.exit(), () -> "the consumer failed:\n" + program.tail());
    assertEquals(
        String.join(
            "\n",
            "201 {\"id\":\"pay_1\"} replayed: false handler calls: 1",
            "201 {\"id\":\"pay_1\"} replayed: true handler calls: 1",
            "key reuse: 422 idempotency_key_reuse handler calls: 1",
            "sdk: " + jar.toRealPath()),
        program.stdout().strip(),
        () -> "the consumer program's output (stderr:\n" + program.stderr() + ")");
  }

  /** The defect a copy of clients/java alone used to hit: it must stop early and say why. */
  @Test
  void installWithoutTheProtoFailsEarlyAndSaysWhy(@TempDir Path tmp) throws Exception {
    assertOutsideRepository(tmp);
    Path checkout = tmp.resolve("idemd");
    copyShippedFiles(checkout, "clients/java");
    Run run =
        maven(
            Arrays.asList(INSTALL.get(0).split(" ")),
            checkout,
            tmp.resolve("m2"),
            writeSettings(tmp),
            Map.of());
    assertNotEquals(0, run.exit(), () -> "the install succeeded without proto/:\n" + run.tail());
    assertTrue(
        run.stdout().contains("idemd's proto is missing"),
        () -> "no clear message about the missing proto:\n" + run.tail());
    assertFalse(
        run.stdout().contains("does not exist"),
        () -> "the build went on to compile without the stubs:\n" + run.tail());
  }

  // -----------------------------------------------------------------------------------------------

  /** Where a command of the Install section puts an artifact of this SDK's version. */
  private static Path installedJar(Path localRepo, String artifactId) {
    String version = projectVersion();
    return localRepo.resolve(
        GROUP_ID.replace('.', '/')
            + "/"
            + artifactId
            + "/"
            + version
            + "/"
            + artifactId
            + "-"
            + version
            + ".jar");
  }

  private record Run(int exit, String stdout, String stderr) {
    String tail() {
      String all = stdout + stderr;
      return all.length() > 6000 ? "..." + all.substring(all.length() - 6000) : all;
    }
  }

  /**
   * Runs {@code command} (its first word "mvn": the Maven running this build) in {@code dir} with
   * the temporary local repository and settings, in batch mode without progress or colours, with
   * {@code env} added to this process's environment and {@code unset} removed from it.
   */
  private static Run maven(
      List<String> command,
      Path dir,
      Path localRepo,
      Path settings,
      Map<String, String> env,
      String... unset)
      throws IOException, InterruptedException {
    assertEquals("mvn", command.get(0));
    List<String> full = new ArrayList<>();
    String home = System.getProperty("idemd.maven.home", "");
    full.add(
        !home.isEmpty() && Files.isExecutable(Path.of(home, "bin", "mvn"))
            ? Path.of(home, "bin", "mvn").toString()
            : "mvn");
    full.addAll(command.subList(1, command.size()));
    full.addAll(
        List.of(
            "-B",
            "-ntp",
            "-Dstyle.color=never",
            "-Dmaven.repo.local=" + localRepo,
            "-gs",
            settings.toString()));
    if ("offline=true".equals(System.getProperty("idemd.maven.offline"))) {
      // Offline blocks file:// repositories too unless the protocol is allowed.
      full.addAll(List.of("-o", "-Daether.offline.protocols=file"));
    }
    Path out = Files.createTempFile(dir.getParent(), "mvn-", ".out");
    Path err = Files.createTempFile(dir.getParent(), "mvn-", ".err");
    ProcessBuilder builder =
        new ProcessBuilder(full)
            .directory(dir.toFile())
            .redirectInput(ProcessBuilder.Redirect.from(Path.of("/dev/null").toFile()))
            .redirectOutput(out.toFile())
            .redirectError(err.toFile());
    builder.environment().putAll(env);
    builder.environment().keySet().removeAll(List.of(unset));
    Process process = builder.start();
    if (!process.waitFor(MAVEN_TIMEOUT_MINUTES, TimeUnit.MINUTES)) {
      process.descendants().forEach(ProcessHandle::destroyForcibly);
      process.destroyForcibly();
      process.waitFor(10, TimeUnit.SECONDS);
      fail(String.join(" ", full) + " did not finish in " + MAVEN_TIMEOUT_MINUTES + " minutes:\n"
          + Files.readString(out) + Files.readString(err));
    }
    return new Run(
        process.exitValue(),
        withoutColours(Files.readString(out, StandardCharsets.UTF_8)),
        withoutColours(Files.readString(err, StandardCharsets.UTF_8)));
  }

  /** Drops ANSI colour codes: Debian's Maven prints some even with -B -Dstyle.color=never. */
  private static String withoutColours(String text) {
    return text.replaceAll("\u001b\\[[0-9;]*m", "");
  }

  /** A global settings file: this build's local repository as a read-only remote before Central. */
  private static Path writeSettings(Path tmp) throws IOException {
    String outer = System.getProperty("idemd.maven.repo.local", "");
    Path outerRepo =
        outer.isEmpty()
            ? Path.of(System.getProperty("user.home"), ".m2", "repository")
            : Path.of(outer);
    String repository =
        """
              <id>outer-local-repository</id>
              <url>%s</url>
              <releases><enabled>true</enabled></releases>
              <snapshots><enabled>false</enabled></snapshots>
        """
            .formatted(outerRepo.toUri());
    String settings =
        """
        <?xml version="1.0" encoding="UTF-8"?>
        <settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
          <profiles>
            <profile>
              <id>outer-local-repository</id>
              <repositories>
                <repository>
        %s        </repository>
              </repositories>
              <pluginRepositories>
                <pluginRepository>
        %s        </pluginRepository>
              </pluginRepositories>
            </profile>
          </profiles>
          <activeProfiles>
            <activeProfile>outer-local-repository</activeProfile>
          </activeProfiles>
        </settings>
        """
            .formatted(repository, repository);
    Path file = tmp.resolve("settings.xml");
    Files.writeString(file, settings, StandardCharsets.UTF_8);
    return file;
  }

  /**
   * Copies the files git would ship under {@code dirs} of the repository (tracked, and untracked
   * but not ignored) to the same relative paths under {@code dest}.
   */
  private static void copyShippedFiles(Path dest, String... dirs)
      throws IOException, InterruptedException {
    Path root = RepoPaths.root();
    List<String> command =
        new ArrayList<>(
            List.of(
                "git", "-C", root.toString(), "ls-files", "-z", "-co", "--exclude-standard", "--"));
    command.addAll(List.of(dirs));
    Process git =
        new ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.INHERIT).start();
    ByteArrayOutputStream listing = new ByteArrayOutputStream();
    git.getInputStream().transferTo(listing);
    assertEquals(0, git.waitFor(), "git ls-files failed (git is needed for this test)");
    int copied = 0;
    for (String rel : listing.toString(StandardCharsets.UTF_8).split("\0")) {
      if (rel.isEmpty()) {
        continue;
      }
      Path src = root.resolve(rel);
      if (!Files.exists(src)) {
        continue; // tracked but deleted in the work tree: this checkout does not ship it
      }
      Path target = dest.resolve(rel);
      Files.createDirectories(target.getParent());
      Files.copy(src, target, StandardCopyOption.COPY_ATTRIBUTES);
      copied++;
    }
    assertTrue(copied > 10, "git ls-files listed only " + copied + " files under " + List.of(dirs));
  }

  private static void assertOutsideRepository(Path tmp) throws IOException {
    Path root = RepoPaths.root().toRealPath();
    assertFalse(
        tmp.toRealPath().startsWith(root),
        "temporary directory " + tmp + " is inside the repository: set java.io.tmpdir elsewhere");
  }

  private static String readme() throws IOException {
    return Files.readString(RepoPaths.sdk().resolve("README.md"), StandardCharsets.UTF_8);
  }

  private static String installSection() throws IOException {
    Matcher section = INSTALL_SECTION.matcher(readme());
    assertTrue(section.find(), "README.md has no '## Install' section");
    return section.group(1);
  }

  /** The commands of the Install section's sh block (comments and blank lines dropped). */
  static List<String> installCommands() throws IOException {
    Matcher block = Pattern.compile("```sh\\n(.*?)```", Pattern.DOTALL).matcher(installSection());
    assertTrue(block.find(), "README.md's Install section has no ```sh block");
    return block
        .group(1)
        .lines()
        .map(line -> line.replaceFirst("#.*", "").strip())
        .filter(line -> !line.isEmpty())
        .toList();
  }

  /** The Install section's ```xml block: the dependency a consumer declares. */
  static String dependencyBlock() throws IOException {
    Matcher block = Pattern.compile("```xml\\n(.*?)```", Pattern.DOTALL).matcher(installSection());
    assertTrue(block.find(), "README.md's Install section has no ```xml block");
    String xml = block.group(1).strip();
    assertTrue(
        xml.startsWith("<dependency>") && xml.endsWith("</dependency>"),
        "the xml block should be one <dependency> element:\n" + xml);
    return xml;
  }

  private static String element(String xml, String name) {
    Matcher m = Pattern.compile("<" + name + ">\\s*([^<]*?)\\s*</" + name + ">").matcher(xml);
    assertTrue(m.find(), "no <" + name + "> in\n" + xml);
    return m.group(1);
  }

  /** The SDK's version, from its pom (set by Surefire). */
  private static String projectVersion() {
    String version = System.getProperty("idemd.project.version", "");
    assertFalse(version.isEmpty(), "idemd.project.version is not set (run the tests with Maven)");
    return version;
  }
}
