package dev.idemd.client;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;

/**
 * A message as {@link MessageProcessor} sees it, built by the caller from any broker's record: the
 * value (the fingerprint), the headers (where the key usually is) and its position (the fallback
 * key, and what the dead-letter hook can report). Immutable.
 *
 * <pre>{@code
 * Message message = Message.of(record.topic(), record.partition(), record.offset(), record.value());
 * for (Header h : record.headers()) message = message.withHeader(h.key(), h.value());
 * }</pre>
 */
public final class Message {
  private final String topic;
  private final int partition;
  private final long offset;
  private final byte[] value;
  private final Map<String, byte[]> headers;

  private Message(String topic, int partition, long offset, byte[] value, Map<String, byte[]> headers) {
    this.topic = Objects.requireNonNull(topic, "topic");
    this.partition = partition;
    this.offset = offset;
    this.value = value == null ? new byte[0] : value.clone();
    this.headers = headers;
  }

  /** A message without headers; a null value (a Kafka tombstone) is the empty value. */
  public static Message of(String topic, int partition, long offset, byte[] value) {
    return new Message(topic, partition, offset, value, Map.of());
  }

  /**
   * A copy with header {@code name} set to {@code value}. A name given twice keeps the last value,
   * as Kafka's {@code Headers.lastHeader} does.
   */
  public Message withHeader(String name, byte[] value) {
    Map<String, byte[]> copy = new LinkedHashMap<>(headers);
    copy.remove(Objects.requireNonNull(name, "name"));
    copy.put(name, value == null ? new byte[0] : value.clone());
    return new Message(topic, partition, offset, value(), Collections.unmodifiableMap(copy));
  }

  /** A copy with header {@code name} set to the UTF-8 bytes of {@code value}. */
  public Message withHeader(String name, String value) {
    return withHeader(name, value.getBytes(StandardCharsets.UTF_8));
  }

  /** The topic (or queue, stream) the message came from. */
  public String topic() {
    return topic;
  }

  /** Its partition (0 for brokers without partitions). */
  public int partition() {
    return partition;
  }

  /** Its offset (or sequence number) in the partition. */
  public long offset() {
    return offset;
  }

  /** A copy of the value. */
  public byte[] value() {
    return value.clone();
  }

  /** The value decoded as UTF-8. */
  public String valueText() {
    return new String(value, StandardCharsets.UTF_8);
  }

  /** The value of header {@code name}, if present. */
  public Optional<byte[]> header(String name) {
    byte[] v = headers.get(name);
    return v == null ? Optional.empty() : Optional.of(v.clone());
  }

  byte[] valueUnsafe() {
    return value;
  }

  /** Position only: values and header values may hold personal data and are never printed. */
  @Override
  public String toString() {
    return "Message[" + topic + "/" + partition + "/" + offset + ", " + value.length + " bytes, headers="
        + headers.keySet() + "]";
  }

  @Override
  public boolean equals(Object other) {
    if (!(other instanceof Message m)) {
      return false;
    }
    if (!topic.equals(m.topic) || partition != m.partition || offset != m.offset
        || !Arrays.equals(value, m.value) || !headers.keySet().equals(m.headers.keySet())) {
      return false;
    }
    return headers.entrySet().stream().allMatch(e -> Arrays.equals(e.getValue(), m.headers.get(e.getKey())));
  }

  @Override
  public int hashCode() {
    return Objects.hash(topic, partition, offset, Arrays.hashCode(value));
  }
}
