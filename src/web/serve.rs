//! The accept loop of the HTTP front doors: HTTP/1.1 on a listener bound by
//! the server, plaintext or TLS (the gRPC port's [`TlsServer`], so the
//! same certificates, client CA and reloading apply), until shutdown; then
//! every open connection finishes its request in progress and closes.
//!
//! Protected mode ([`crate::auth`]) is decided here, once per connection:
//! with auth off, every request of a non-loopback caller is answered `403`
//! without reaching the handler, so the proxy forwards nothing upstream for
//! it either.
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

use super::call::{Connection, ConnectionCerts};
use super::problem::Problem;
use crate::auth::Authenticator;
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
/// by its drain timeout). `auth` decides which peers are served at all.
pub async fn serve<H, F>(
    listener: TcpListener,
    tls: Option<TlsServer>,
    mut shutdown: watch::Receiver<bool>,
    auth: Authenticator,
    handler: H,
) where
    H: Fn(http::Request<Incoming>, Connection) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    match tls {
        None => loop {
            let (stream, peer) = tokio::select! {
                accepted = crate::net::accept_retrying(&listener) => accepted,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let connection = Connection { peer, certs: None };
            serve_connection(&graceful, stream, connection, &auth, handler.clone());
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
                let (tcp, session) = stream.get_ref();
                // A socket whose peer is gone already: nothing to answer.
                let Ok(peer) = tcp.peer_addr() else { continue };
                let certs: ConnectionCerts = session
                    .peer_certificates()
                    .map(|chain| Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect()));
                let connection = Connection { peer, certs };
                serve_connection(&graceful, stream, connection, &auth, handler.clone());
            }
        }
    }
    graceful.shutdown().await;
}

fn serve_connection<I, H, F>(
    graceful: &GracefulShutdown,
    stream: I,
    connection: Connection,
    auth: &Authenticator,
    handler: H,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(http::Request<Incoming>, Connection) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<Body>> + Send + 'static,
{
    // Refused connections still get an answer per request (a problem
    // naming the flag), not a reset the caller cannot explain.
    let refusal = auth.admit_peer(Some(connection.peer)).err().map(|error| {
        tracing::debug!(peer = %connection.peer, "protected mode: refusing a remote caller");
        Problem::from_status(&crate::api::status::auth_status(error))
    });
    let service = hyper::service::service_fn(move |request| {
        let response = match &refusal {
            Some(problem) => {
                futures::future::Either::Left(futures::future::ready(boxed(problem.response())))
            }
            None => futures::future::Either::Right(handler(request, connection.clone())),
        };
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
