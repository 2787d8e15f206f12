/** Node stream helpers of the middleware. */
import type { IncomingMessage } from "node:http";
import type { Readable } from "node:stream";
import { BODY_READ_BEFORE } from "./http";

/**
 * The body of `request`, read from `stream` (the request itself, or what Fastify's earlier
 * preParsing hooks made of it): null when over `limit`, {@link BODY_READ_BEFORE} when something
 * mounted before the middleware already read it. A read stream never ends again, so without this
 * check the middleware would wait for it forever.
 *
 * Read is: ended, read from, or destroyed, or body-parser 1.x's `_body` mark (2.x leaves the
 * stream ended). A request that declares no body loses nothing when read (an HTTP/1.1 request
 * without Content-Length or Transfer-Encoding, or with Content-Length 0): its body is empty.
 * HTTP/2 frames a body without either header, so there only Content-Length 0 says "none".
 */
export function readRequestBody(
  request: IncomingMessage & { _body?: unknown },
  stream: Readable,
  limit: number,
): Promise<Buffer | null | typeof BODY_READ_BEFORE> {
  const read = stream.readableEnded || stream.readableDidRead || stream.destroyed || request._body === true;
  if (!read) return readStream(stream, limit);
  const length = request.headers["content-length"];
  const declaresBody = length === undefined
    ? request.headers["transfer-encoding"] !== undefined || request.httpVersionMajor >= 2
    : Number(length) !== 0;
  return Promise.resolve(declaresBody ? BODY_READ_BEFORE : Buffer.alloc(0));
}

/** The whole stream, or null as soon as it is over `limit` bytes (the rest is not read). */
function readStream(stream: Readable, limit: number): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer | string): void => {
      const buffer = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
      size += buffer.length;
      if (size > limit) {
        cleanup();
        stream.pause();
        resolve(null);
        return;
      }
      chunks.push(buffer);
    };
    const onEnd = (): void => {
      cleanup();
      resolve(Buffer.concat(chunks));
    };
    const onError = (error: Error): void => {
      cleanup();
      reject(error);
    };
    const cleanup = (): void => {
      stream.off("data", onData);
      stream.off("end", onEnd);
      stream.off("error", onError);
    };
    stream.on("data", onData);
    stream.on("end", onEnd);
    stream.on("error", onError);
  });
}
