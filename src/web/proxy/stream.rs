//! The upstream's answer streamed back to the caller: what the proxy
//! already read of its body (to decide whether to store it) first, then the
//! rest as it arrives, so a large answer is never held whole.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::upstream::strip_hop_by_hop;
use crate::web::serve::{Body, BoxError};

/// The upstream's answer to the caller: hop-by-hop headers removed, the
/// bytes already read first, then the rest of the body as it arrives.
pub(super) fn stream_back(
    response: http::Response<Incoming>,
    first: Bytes,
) -> http::Response<Body> {
    let (mut head, body) = response.into_parts();
    strip_hop_by_hop(&mut head.headers);
    if !first.is_empty() {
        // The length is the upstream's; the body below is all of it.
        let prefix = http_body_util::Full::new(first).map_err(|never| match never {});
        let rest = body.map_err(|e| Box::new(e) as BoxError);
        let chained = Chain {
            first: Some(prefix),
            rest,
        };
        return http::Response::from_parts(head, chained.boxed_unsync());
    }
    http::Response::from_parts(
        head,
        body.map_err(|e| Box::new(e) as BoxError).boxed_unsync(),
    )
}

/// One body after another.
struct Chain<A, B> {
    first: Option<A>,
    rest: B,
}

impl<A, B> hyper::body::Body for Chain<A, B>
where
    A: hyper::body::Body<Data = Bytes, Error = BoxError> + Unpin,
    B: hyper::body::Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        if let Some(first) = self.first.as_mut() {
            match std::pin::Pin::new(first).poll_frame(cx) {
                Poll::Ready(None) => self.first = None,
                other => return other,
            }
        }
        std::pin::Pin::new(&mut self.rest).poll_frame(cx)
    }
}
