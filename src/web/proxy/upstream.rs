//! The upstream: a pooled HTTP/1.1 client, the headers that cross the proxy
//! and the classification of what went wrong, which decides whether a key
//! is released (nothing was sent) or left UNKNOWN (the request may have run).

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::uri::{Authority, Scheme};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::config::ConfigError;
use crate::config::routes::upstream_authority;

/// Hop-by-hop headers (RFC 9110 section 7.6.1): they describe one
/// connection and are never forwarded, in either direction, nor stored.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those the `Connection` header
/// names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
}

/// Where requests are forwarded.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `host:port` of the upstream.
    authority: Authority,
    /// The pooled client (keep-alive connections, `TCP_NODELAY`).
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Why a forwarded request got no (complete) answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made: the request was never sent.
    #[error("upstream connection failed, the request was not sent: {0}")]
    NotSent(String),
    /// The request may have been sent (reset, closed or timed out after).
    #[error("upstream failed after the request may have been sent: {0}")]
    MaybeSent(String),
}

impl Upstream {
    /// An upstream at `url` (`http://host:port`, see
    /// [`upstream_authority`]).
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        let authority = upstream_authority(url)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { authority, client })
    }

    /// Sends `parts` with `body` to the upstream: the same method, path and
    /// query, and the caller's headers without hop-by-hop ones and
    /// without `drop_header` (the proxy's own credential header, when it
    /// is not the application's `Authorization`).
    pub async fn send(
        &self,
        parts: &http::request::Parts,
        body: Bytes,
        drop_header: Option<&HeaderName>,
    ) -> Result<http::Response<Incoming>, UpstreamError> {
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let uri = http::Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| UpstreamError::NotSent(format!("request URI: {e}")))?;
        let mut headers = parts.headers.clone();
        strip_hop_by_hop(&mut headers);
        if let Some(name) = drop_header {
            headers.remove(name);
        }
        // The upstream sees the Host the caller asked for, as behind any
        // reverse proxy; hyper would otherwise put the upstream's address.
        let mut request = http::Request::new(Full::new(body));
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        self.client.request(request).await.map_err(|error| {
            let detail = error_chain(&error);
            if error.is_connect() {
                UpstreamError::NotSent(detail)
            } else {
                UpstreamError::MaybeSent(detail)
            }
        })
    }
}

/// An error and its causes on one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            "keep-alive, x-private".parse().expect("value"),
        );
        headers.insert("x-private", "1".parse().expect("value"));
        headers.insert(header::TRANSFER_ENCODING, "chunked".parse().expect("value"));
        headers.insert("idempotency-key", "k1".parse().expect("value"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("idempotency-key"));
    }
}
