//! The upstream of the proxy benchmark (`bench/scripts/proxy.sh`): an
//! HTTP/1.1 service whose every request takes `--work` of CPU (a busy loop,
//! like a handler that computes, so the upstream and a sidecar proxy on the
//! same cores compete as they would in a pod) and answers 201 with a small
//! JSON body.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

async fn answer(
    request: hyper::Request<Incoming>,
    work: Duration,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().len())
        .unwrap_or(0);
    let started = std::time::Instant::now();
    while started.elapsed() < work {
        std::hint::spin_loop();
    }
    let json = format!("{{\"id\":\"pay_1\",\"status\":\"succeeded\",\"request_bytes\":{body}}}");
    let mut response = hyper::Response::new(Full::new(Bytes::from(json)));
    *response.status_mut() = hyper::StatusCode::CREATED;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Serves until killed; prints the address bound.
pub async fn serve(listen: SocketAddr, work: Duration) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await.context("bind")?;
    println!("{}", listener.local_addr().context("address")?);
    loop {
        let (stream, _) = idemd::net::accept_retrying(&listener).await;
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| answer(request, work));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
