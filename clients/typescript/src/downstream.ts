import { createHash } from "node:crypto";
import { frameLength } from "./fingerprint";

const DOWNSTREAM_TAG = Buffer.from("idemd-downstream-v1", "utf8");

/**
 * The idempotency key to send to a third party (a payment provider) for one step of an
 * operation: the same on every retry of the operation, different for every step.
 *
 *     downstreamKey(key, step) = base64url_nopad(SHA-256(
 *         frame("idemd-downstream-v1") || frame(utf8(key)) || frame(utf8(step))))
 *
 * 43 characters of `[A-Za-z0-9_-]`; the client's key cannot be recovered from it.
 */
export function downstreamKey(key: string, step: string): string {
  const hash = createHash("sha256");
  for (const part of [DOWNSTREAM_TAG, Buffer.from(key, "utf8"), Buffer.from(step, "utf8")]) {
    hash.update(frameLength(part.length));
    hash.update(part);
  }
  return hash.digest("base64url");
}
