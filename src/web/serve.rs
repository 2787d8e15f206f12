//! The accept loop of the HTTP front doors: HTTP/1.1 on a listener bound by
//! the server, plaintext or TLS (the gRPC port's [`TlsServer`], so the
//! same certificates, client CA and reloading apply), until shutdown; then
//! every open connection finishes its request in progress and closes.
//!
//! HTTP/1.1 only: it is what curl, load generators, reverse proxies and
//! every HTTP client library speak by default, and the proxy's upstream is
//! one too; HTTP/2 callers have the gRPC port.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::ConnectionCerts;
use crate::tls::TlsServer;

/// Error type of response bodies (an upstream body can fail mid-stream).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of every front-door handler.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A whole body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Turns a response with a whole body into one with a [`Body`].
pub fn boxed(response: http::Response<http_body_util::Full<Bytes>>) -> http::Response<Body> {
    response.map(|body| body.map_err(|never| match never {}).boxed_unsync())
}

/// Serves `handler` on `listener` until `shutdown` turns true, then waits
/// for the connections' requests in progress (the server bounds that wait
/// by its drain timeout).
pub async fn serve<H, F>(
    listener: TcpListener,
    tls: Option<TlsServer>,
    mut shutdown: watch::Receiver<bool>,
    handler: H,
) where
    H: Fn(http::Request<Incoming>, ConnectionCerts) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    match tls {
        None => loop {
            let (stream, _peer) = tokio::select! {
                accepted = crate::net::accept_retrying(&listener) => accepted,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            serve_connection(&graceful, stream, None, handler.clone());
        },
        Some(tls) => {
            let mut incoming = tls
                .with_alpn(&[b"http/1.1"])
                .incoming(listener, shutdown.clone());
            loop {
                let stream = tokio::select! {
                    next = incoming.next() => match next {
                        Some(Ok(stream)) => stream,
                        Some(Err(_)) => continue,
                        None => break,
                    },
                    _ = shutdown.wait_for(|stop| *stop) => break,
                };
                let certs =
                    stream.get_ref().1.peer_certificates().map(|chain| {
                        Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect())
                    });
                serve_connection(&graceful, stream, certs, handler.clone());
            }
        }
    }
    graceful.shutdown().await;
}

fn serve_connection<I, H, F>(
    graceful: &GracefulShutdown,
    stream: I,
    certs: ConnectionCerts,
    handler: H,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(http::Request<Incoming>, ConnectionCerts) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let response = handler(request, certs.clone());
        async move { Ok::<_, Infallible>(response.await) }
    });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "HTTP connection ended with an error");
        }
    });
}
