//! Accepting TCP connections: the one place every listener of the process
//! (gRPC plaintext and TLS, `/metrics`) gets its sockets from.
//!
//! Why a module for three lines: every accepted socket must have
//! `TCP_NODELAY`. Without it, a reply written in two pieces (HTTP/2 HEADERS,
//! then DATA once the body exceeds a few hundred bytes) waits under Nagle's
//! algorithm for the ACK of the first piece, which the client's delayed-ACK
//! timer holds back for ~40 ms: every call at one request in flight then takes
//! ~44 ms whatever the server does. tonic's `Server::tcp_nodelay(true)` does
//! not help here: it applies only to listeners tonic binds itself and is
//! silently ignored by `serve_with_incoming`, which idemd needs for its own
//! TLS acceptor and for binding before the store opens, so `clippy.toml`
//! forbids accepting a connection anywhere but here, and `tests/it/server.rs`
//! and `tests/it/tls.rs` measure calls at one in flight through a real
//! client (`tests/common/latency.rs`).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::Stream;

/// Back-off after a failed `accept` (out of file descriptors and the like),
/// so a persistent error does not spin a core.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Applies the socket options every accepted connection needs.
pub fn configure(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)
}

/// Accepts one connection and configures it. A socket whose options cannot
/// be set is still returned (the error is logged): refusing the peer would
/// be worse than serving it slowly, and the failure does not happen on a
/// healthy socket.
#[allow(clippy::disallowed_methods)] // the one sanctioned accept: see the module doc
pub async fn accept(listener: &TcpListener) -> io::Result<(TcpStream, SocketAddr)> {
    let (stream, peer) = listener.accept().await?;
    if let Err(error) = configure(&stream) {
        tracing::warn!(%peer, %error, "cannot set TCP_NODELAY on an accepted connection");
    }
    Ok((stream, peer))
}

/// Accepts one connection, retrying after errors of the listener itself
/// (logged, with a short back-off) so a serving loop never ends because of
/// one failed accept.
pub async fn accept_retrying(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match accept(listener).await {
            Ok(accepted) => return accepted,
            Err(error) => {
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

/// The accepted, configured connections of `listener` as a stream, for
/// `tonic::transport::Server::serve_with_incoming*`. It never ends and never
/// yields an error (see [`accept_retrying`]).
pub fn incoming(listener: TcpListener) -> impl Stream<Item = io::Result<TcpStream>> + Send {
    futures::stream::unfold(listener, |listener| async move {
        let (stream, _peer) = accept_retrying(&listener).await;
        Some((Ok(stream), listener))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    /// The property the module exists for, read back from the socket.
    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let mut incoming = Box::pin(incoming(listener));
        for _ in 0..3 {
            let client = TcpStream::connect(address).await.expect("connect");
            let accepted = incoming.next().await.expect("a connection").expect("ok");
            assert!(
                accepted.nodelay().expect("read TCP_NODELAY"),
                "TCP_NODELAY is off"
            );
            drop(client);
        }
    }
}
