/**
 * A port for a child process to listen on. The kernel picks one that is free now (listen on 0),
 * which beats a random number: a random port in 20000-40000 can be taken by another process (the
 * ephemeral range starts at 32768, and the Kafka and nginx helpers listen on random ports too), and
 * the child then dies at start with EADDRINUSE. Between close() and the child's listen another
 * process could still take it, so callers also watch the child's exit.
 */
import { createServer } from "node:net";

export async function freePort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve, reject) => {
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", resolve);
  });
  const address = probe.address();
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("freePort: no TCP address");
  return address.port;
}
