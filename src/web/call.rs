//! An HTTP request as an in-process gRPC call: the services the front
//! doors call ([`Services`]), what they know of a connection
//! ([`Connection`]), the `tonic::Request` carrying a caller's credentials
//! and trace context ([`grpc_request`]), and a body read within its limit
//! ([`read_body`]). Shared by the JSON API and the proxy.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Limited};

use super::problem;
use crate::auth::PeerCertificates;
use crate::proto::v1 as pb;

/// What the front doors call: the gRPC services, in process.
pub trait Services:
    pb::idempotency_server::Idempotency + pb::audit_server::Audit + Clone + Send + Sync + 'static
{
}

impl<T> Services for T where
    T: pb::idempotency_server::Idempotency
        + pb::audit_server::Audit
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Headers copied into the gRPC metadata of an in-process call: the
/// credentials [`crate::auth`] reads and the trace context
/// [`crate::telemetry`] continues. Nothing else of the HTTP request reaches
/// the handlers.
const FORWARDED_METADATA: [&str; 3] = [crate::auth::TENANT_HEADER, "traceparent", "tracestate"];

/// The verified client certificate chain of a connection, if any.
pub type ConnectionCerts = Option<Arc<Vec<rustls::pki_types::CertificateDer<'static>>>>;

/// What the front doors know of a connection, and hand to the gRPC
/// handlers with each call.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The caller's address: with auth off, protected mode
    /// ([`crate::auth`]) admits loopback callers only.
    pub peer: SocketAddr,
    /// The verified client certificate chain, over mTLS.
    pub certs: ConnectionCerts,
}

/// A `tonic::Request` carrying `message` and the caller's credentials and
/// trace context from `headers`: the `authorization` metadata is the value
/// of `token_header` (the proxy may take the token from a header of its own
/// so the upstream's `Authorization` stays the application's), and the
/// connection's peer address and client certificates go into the
/// extensions, where tonic's transport would have put them.
pub fn grpc_request<T>(
    message: T,
    headers: &http::HeaderMap,
    token_header: &http::HeaderName,
    connection: &Connection,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let metadata = request.metadata_mut();
    let copy = |metadata: &mut tonic::metadata::MetadataMap, from: &str, to: &'static str| {
        if let Some(value) = headers
            .get(from)
            .and_then(|value| tonic::metadata::MetadataValue::try_from(value.as_bytes()).ok())
        {
            metadata.insert(to, value);
        }
    };
    copy(metadata, token_header.as_str(), "authorization");
    for name in FORWARDED_METADATA {
        copy(metadata, name, name);
    }
    request
        .extensions_mut()
        .insert(tonic::transport::server::TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(connection.peer),
        });
    if let Some(certs) = &connection.certs {
        request
            .extensions_mut()
            .insert(PeerCertificates(Arc::clone(certs)));
    }
    request
}

/// Reads a whole body of at most `limit` bytes; a larger one is `413`.
pub async fn read_body(
    body: hyper::body::Incoming,
    limit: usize,
) -> Result<bytes::Bytes, problem::Problem> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(problem::Problem::new(
            http::StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("request body exceeds {limit} bytes"),
        )),
        Err(error) => Err(problem::Problem::new(
            http::StatusCode::BAD_REQUEST,
            "request_body_unreadable",
            format!("reading the request body failed: {error}"),
        )),
    }
}
