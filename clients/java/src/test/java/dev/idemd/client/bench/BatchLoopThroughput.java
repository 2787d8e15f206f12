package dev.idemd.client.bench;

import dev.idemd.client.BatchOptions;
import dev.idemd.client.IdemdClient;
import dev.idemd.client.Message;
import dev.idemd.client.MessageProcessor;
import dev.idemd.client.testing.IdemdServer;
import dev.idemd.client.testing.RepoPaths;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * {@link MessageProcessor#processBatch} without a broker: ROUNDS rounds (default 8) of N messages
 * (default 40,000) in batches of 500 (a Kafka poll), fresh keys, handler doing nothing, PER_KEY,
 * against a fresh idemd of $IDEMD_BIN (the conformance config, no claim-rate limit). Prints messages/s per round and,
 * at the end, idemd's CPU (user + system, from /proc) per message over all rounds: what issue 52
 * used to find the helper's own costs apart from the broker's and to compare two server builds.
 * Run by bench/batch-loop.sh.
 */
public final class BatchLoopThroughput {
  private BatchLoopThroughput() {}

  public static void main(String[] args) throws Exception {
    int perRound = args.length > 0 ? Integer.parseInt(args[0]) : 40_000;
    int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 8;
    int poll = 500;
    // --claim-rate 0: the default limit (10,000 new keys a second per tenant after a burst of
    // 20,000) would answer most of these claims RESOURCE_EXHAUSTED, which is fast and not the path
    // under test.
    try (IdemdServer server = IdemdServer.startWithArgs(List.of(
            "--auth-tokens", RepoPaths.conformance().resolve("tokens.txt").toString(), "--claim-rate", "0"));
        IdemdClient client = IdemdClient.builder(server.address())
            .bearerToken("conformance-token-alice-3f9a").plaintext().build()) {
      MessageProcessor processor = MessageProcessor.builder(client, "bench:batch-loop")
          .keyFromHeader("idempotency-key")
          .deadLetter((message, reason) -> {
            throw new IllegalStateException("dead-lettered: " + reason);
          })
          .build();
      BatchOptions options = BatchOptions.defaults().withOrdering(BatchOptions.Ordering.PER_KEY);
      String prefix = Long.toHexString(System.nanoTime());
      long cpuBefore = cpuTicks(server.pid());
      for (int round = 0; round < rounds; round++) {
        long start = System.nanoTime();
        for (int offset = 0; offset < perRound; offset += poll) {
          List<Message> messages = new ArrayList<>(poll);
          for (int k = 0; k < poll; k++) {
            int n = offset + k;
            messages.add(Message.of("t", n % 4, n, ("{\"n\":" + n + "}").getBytes(StandardCharsets.UTF_8))
                .withHeader("idempotency-key", prefix + "-" + round + "-" + n));
          }
          for (MessageProcessor.Outcome outcome : processor.processBatch(messages, message -> { }, options)) {
            if (outcome.kind() != MessageProcessor.Kind.EXECUTED) {
              throw new IllegalStateException("a fresh key came back " + outcome.kind() + ": " + outcome.reason());
            }
          }
        }
        System.out.printf(Locale.ROOT, "round %d: %.0f messages/s%n",
            round, perRound / ((System.nanoTime() - start) / 1e9));
      }
      long ticks = cpuTicks(server.pid()) - cpuBefore;
      System.out.printf(Locale.ROOT, "idemd CPU: %.1f µs per message (claim and complete), %d messages%n",
          ticks * 10_000.0 / ((long) perRound * rounds), (long) perRound * rounds);
    }
  }

  /** utime + stime of a process in clock ticks (100 a second on Linux). */
  private static long cpuTicks(long pid) throws Exception {
    String stat = Files.readString(Path.of("/proc/" + pid + "/stat"));
    String[] fields = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
    return Long.parseLong(fields[11]) + Long.parseLong(fields[12]);
  }
}
