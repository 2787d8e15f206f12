package dev.idemd.examples.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.RepoPaths;
import java.io.StringWriter;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Compiles the README's consumer block as written (its imports at the top of a fresh source file,
 * the rest as a method body) and runs it against a real broker and idemd: one message produced
 * twice with the same key is charged once, and both offsets are committed.
 */
class ReadmeConsumerTest {
  private static final Pattern CONSUMER_BLOCK =
      Pattern.compile("## Consumers\\n.*?```java\\n(.*?)\\n```", Pattern.DOTALL);

  @Test
  void readmeConsumerBlockRunsAsWritten(@TempDir Path dir) throws Exception {
    String brokers = ConsumerScenariosTest.brokers();
    String readme = Files.readString(RepoPaths.sdk().resolve("README.md"), StandardCharsets.UTF_8);
    Matcher m = CONSUMER_BLOCK.matcher(readme);
    assertTrue(m.find(), "README.md has no ```java block under '## Consumers'");
    Map<Boolean, List<String>> parts =
        m.group(1).lines().collect(Collectors.partitioningBy(l -> l.startsWith("import ")));
    String source = "package readme;\n" + String.join("\n", parts.get(true)) + "\n"
        + "public final class ConsumerSnippet extends dev.idemd.examples.kafka.ConsumerReadmeHarness {\n"
        + "  @Override\n"
        + "  public void run(String target, String token, String brokers) throws Exception {\n"
        + String.join("\n", parts.get(false)) + "\n  }\n}\n";
    Path src = dir.resolve("src/readme/ConsumerSnippet.java");
    Files.createDirectories(src.getParent());
    Files.writeString(src, source, StandardCharsets.UTF_8);
    Path classes = Files.createDirectories(dir.resolve("classes"));
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    StringWriter diagnostics = new StringWriter();
    boolean compiled = javac.getTask(diagnostics, null, null,
            List.of("-proc:none", "-classpath", System.getProperty("java.class.path"), "-d", classes.toString()),
            null, javac.getStandardFileManager(null, null, StandardCharsets.UTF_8).getJavaFileObjects(src.toFile()))
        .call();
    assertTrue(compiled, "the README consumer block does not compile:\n" + diagnostics + "\n" + source);

    Properties props = new Properties();
    props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    try (IdemdServer idemd = IdemdServer.startConformance();
        Admin admin = Admin.create(props);
        URLClassLoader loader = new URLClassLoader(new URL[] {classes.toUri().toURL()}, getClass().getClassLoader())) {
      admin.createTopics(List.of(new NewTopic("payments", 1, (short) 1))).all().get(30, TimeUnit.SECONDS);
      produceTwice(brokers, UUID.randomUUID().toString());

      ConsumerReadmeHarness block = (ConsumerReadmeHarness)
          loader.loadClass("readme.ConsumerSnippet").getDeclaredConstructor().newInstance();
      CompletableFuture<Void> loop = CompletableFuture.runAsync(() -> {
        try {
          block.run(idemd.address(), "conformance-token-alice-3f9a", brokers);
        } catch (Exception e) {
          throw new RuntimeException(e);
        }
      });
      TopicPartition partition = new TopicPartition("payments", 0);
      long deadline = System.currentTimeMillis() + 60_000;
      while (true) {
        OffsetAndMetadata committed = admin.listConsumerGroupOffsets("payments")
            .partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS).get(partition);
        if (committed != null && committed.offset() >= 2) {
          break;
        }
        if (loop.isDone() || System.currentTimeMillis() > deadline) {
          block.stop();
          loop.get(30, TimeUnit.SECONDS);
          fail("the block did not commit both offsets within 60 s (charges: " + block.payments.charges() + ")");
        }
        Thread.sleep(200);
      }
      block.stop();
      loop.get(30, TimeUnit.SECONDS);
      assertEquals(1, block.payments.charges(), "the message produced twice must be charged once");
      assertEquals(Map.of(), block.deadLetters);
    }
  }

  private static void produceTwice(String brokers, String key) throws Exception {
    Properties props = new Properties();
    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
      for (int i = 0; i < 2; i++) {
        ProducerRecord<byte[], byte[]> record = new ProducerRecord<>("payments", 0, null,
            "{\"amount\":4200}".getBytes(StandardCharsets.UTF_8));
        record.headers().add("idempotency-key", key.getBytes(StandardCharsets.UTF_8));
        producer.send(record).get(30, TimeUnit.SECONDS);
      }
    }
  }
}
