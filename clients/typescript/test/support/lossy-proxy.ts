/**
 * A TCP proxy in front of idemd that loses the response of the first gRPC call: on the first
 * connection it forwards the request, swallows every HTTP/2 frame the server sends on a stream
 * (connection-level frames such as SETTINGS still pass), then drops the connection. Later
 * connections are forwarded untouched. This is the "Claim applied, response lost" case.
 */
import { createServer, connect, type Server, type Socket } from "node:net";
import type { AddressInfo } from "node:net";

export interface LossyProxy {
  address: string;
  /** Connections accepted so far. */
  connections(): number;
  /** Stream frames swallowed on the first connection. */
  droppedFrames(): number;
  close(): Promise<void>;
}

export async function startLossyProxy(upstream: string): Promise<LossyProxy> {
  const [host, port] = splitAddress(upstream);
  let connections = 0;
  let dropped = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    connections++;
    const lossy = connections === 1;
    const backend = connect(port, host);
    sockets.add(client).add(backend);
    const closeBoth = (): void => {
      client.destroy();
      backend.destroy();
    };
    client.on("close", closeBoth).on("error", closeBoth);
    backend.on("close", closeBoth).on("error", closeBoth);
    client.pipe(backend);
    if (!lossy) {
      backend.pipe(client);
      return;
    }
    let pending = Buffer.alloc(0);
    let scheduled = false;
    backend.on("data", (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 9) {
        const length = pending.readUIntBE(0, 3);
        if (pending.length < 9 + length) break;
        const frame = pending.subarray(0, 9 + length);
        pending = pending.subarray(9 + length);
        const streamId = frame.readUInt32BE(5) & 0x7fffffff;
        if (streamId === 0) {
          client.write(frame);
        } else {
          dropped++;
          if (!scheduled) {
            scheduled = true;
            setTimeout(closeBoth, 100);
          }
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    address: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    connections: () => connections,
    droppedFrames: () => dropped,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function splitAddress(address: string): [string, number] {
  const i = address.lastIndexOf(":");
  return [address.slice(0, i), Number(address.slice(i + 1))];
}
