//! `idemd proxy`: an HTTP sidecar that makes an upstream HTTP service
//! idempotent with no code change, speaking the `Idempotency-Key` header of
//! draft-ietf-httpapi-idempotency-key-header.
//!
//! For a request whose method its route marks ([`crate::config::routes`]):
//!
//! | situation | answer |
//! |---|---|
//! | no `Idempotency-Key` (route requires one) | 400 `idempotency_key_missing` |
//! | key malformed (not 1-255 of `[A-Za-z0-9_-]`, or a bad Structured Field string) | 400 `idempotency_key_malformed` |
//! | body over `max_request_bytes` | 413, before any claim |
//! | first request | forwarded; the answer is stored (Complete) and returned |
//! | retry after it completed | the stored answer + `Idempotent-Replayed: true` |
//! | retry while the first runs | 409 `request_in_progress` + `Retry-After` (or a wait up to `max_wait`) |
//! | same key, different method, path or body | 422 `idempotency_key_reuse` |
//! | key whose outcome is unknown | 409 `outcome_pending` (until Reconcile), with the key's state; its stored reason only with `expose_failure_reason` |
//! | upstream refused the connection | 502, key released (nothing ran) |
//! | upstream timed out or reset after the request was sent | 504 `outcome_pending`, key UNKNOWN |
//! | upstream 5xx | returned; key released or stored (`on_5xx`) |
//! | answer over `max_response_bytes` | returned; key UNKNOWN with the reason |
//!
//! The key header is a Structured Field string (`"8e0...24"`, as the draft
//! specifies) or, as Stripe-style clients send it, the bare token; both
//! name the same key. The fingerprint is fingerprint v1 of the method, the
//! path with its query and the body (JSON canonicalised, the route's
//! `ignore_fields` left out), so a changed amount is a 422.
//!
//! Once a request has claimed its key, forwarding and recording run in a
//! task of their own: a client that disconnects does not cut the upstream
//! call short (which would leave its outcome unknown); the answer is stored
//! and the client's retry replays it. While the upstream works, the lease is
//! extended, so a slow upstream is not taken over; if the proxy dies, the
//! lease runs out and the key follows its endpoint's expired-lease policy.
//!
//! Credentials: the tenant comes from the bearer token in `--token-header`
//! (default `authorization`, looked up in the same tokens file as the gRPC
//! port), from the client certificate over mTLS, or, with auth off, from
//! `x-tenant-id`. A token header other than `authorization` is not
//! forwarded to the upstream.

mod stream;
pub mod upstream;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use http::header::{self, HeaderName, HeaderValue};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;

use super::problem::Problem;
use super::serve::{Body, boxed, full};
use super::{Connection, Services, grpc_request};
use crate::config::routes::{KeyRule, On5xx, ProxySettings, RouteSettings, Routes};
use crate::metrics as names;
use crate::proto::v1 as pb;
use crate::proto::v1::idempotency_server::Idempotency;
use stream::stream_back;
use upstream::{Upstream, UpstreamError, strip_hop_by_hop};

/// The request header carrying the key.
pub const KEY_HEADER: &str = "idempotency-key";
/// The response header marking a replay.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The proxy: routes, the upstream and the in-process gRPC services.
#[derive(Debug, Clone)]
pub struct Proxy<S> {
    /// Claim, Complete, Fail and ExtendLease, called in process.
    services: S,
    /// What each path needs.
    routes: Arc<Routes>,
    /// Where claimed requests go.
    upstream: Upstream,
    /// The header whose bearer token names the tenant.
    token_header: HeaderName,
}

/// The outcome label of `idemd_proxy_requests_total`.
fn count(outcome: &'static str) {
    metrics::counter!(names::PROXY_REQUESTS, "outcome" => outcome).increment(1);
}

/// The Claim a keyed request makes: the request's method, path, body and
/// content type are its fingerprint (less the route's ignored fields).
fn claim_request(
    endpoint: String,
    key: String,
    parts: &http::request::Parts,
    body: &Bytes,
    settings: &RouteSettings,
) -> pb::ClaimRequest {
    pb::ClaimRequest {
        endpoint,
        key,
        fingerprint: Some(pb::claim_request::Fingerprint::Request(pb::HttpRequest {
            method: parts.method.to_string(),
            path: parts
                .uri
                .path_and_query()
                .map_or_else(|| "/".to_string(), ToString::to_string),
            body: body.to_vec(),
            content_type: parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            ignore_fields: settings.ignore_fields.clone(),
        })),
        wait: (!settings.max_wait.is_zero()).then(|| crate::api::duration(settings.max_wait)),
        ..Default::default()
    }
}

/// The answer to a Claim that did not grant the key: a replay, or the
/// problem (409, 422) the caller is told.
fn answer(
    outcome: Option<pb::claim_response::Outcome>,
    settings: &RouteSettings,
) -> http::Response<Body> {
    use pb::claim_response::Outcome;
    match outcome {
        Some(Outcome::Replayed(replayed)) => {
            count("replayed");
            replay(replayed.response.unwrap_or_default())
        }
        Some(Outcome::InProgress(in_progress)) => {
            count("in_progress");
            let mut problem = Problem::new(
                StatusCode::CONFLICT,
                "request_in_progress",
                "a request with this Idempotency-Key is in progress; retry after Retry-After",
            );
            problem.retry_after(
                in_progress
                    .retry_after
                    .map_or(Duration::from_secs(1), |d| crate::api::std_duration(&d)),
            );
            boxed(problem.response())
        }
        Some(Outcome::Mismatch(_)) => {
            count("mismatch");
            boxed(
                Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_key_reuse",
                    "this Idempotency-Key was used for a different request (method, path or body); use a new key for a new operation",
                )
                .response(),
            )
        }
        Some(Outcome::Pending(pending)) => {
            count("pending");
            let state =
                pb::State::try_from(pending.state).map_or("STATE_UNSPECIFIED", |s| s.as_str_name());
            let mut problem = Problem::new(
                StatusCode::CONFLICT,
                "outcome_pending",
                "the outcome of the first request with this Idempotency-Key is not known; it is waiting for an operator's decision",
            );
            problem.set("state", json!(state));
            if settings.expose_failure_reason {
                problem.set("reason", json!(pending.reason));
            }
            boxed(problem.response())
        }
        // A granted Claim is the caller's to run (`Proxy::handle`).
        Some(Outcome::Claimed(_)) | None => boxed(
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Claim answered without an outcome",
            )
            .response(),
        ),
    }
}

impl<S: Services> Proxy<S> {
    /// A proxy calling `services`.
    pub fn new(services: S, settings: &ProxySettings) -> Result<Self, crate::config::ConfigError> {
        let exposing = settings.routes.exposing_failure_reasons();
        if !exposing.is_empty() {
            tracing::warn!(
                routes = ?exposing,
                "expose_failure_reason is on: 409 outcome_pending answers on these routes carry the \
                 stored failure reason (upstream and handler error text) to every caller; for \
                 development only"
            );
        }
        Ok(Self {
            services,
            routes: Arc::new(settings.routes.clone()),
            upstream: Upstream::new(&settings.upstream)?,
            token_header: settings.token_header.clone(),
        })
    }

    /// Handles one request.
    pub async fn handle(
        &self,
        request: http::Request<Incoming>,
        connection: Connection,
    ) -> http::Response<Body> {
        let (parts, body) = request.into_parts();
        let matched = self.routes.find(&parts.method, parts.uri.path());
        let settings = Arc::clone(matched.settings);
        if !settings.methods.contains(&parts.method) {
            count("passthrough");
            return self.pass_through(parts, body, &settings).await;
        }
        let key = match parts.headers.get(KEY_HEADER) {
            None if settings.key == KeyRule::Optional => {
                count("passthrough");
                return self.pass_through(parts, body, &settings).await;
            }
            None => {
                count("rejected");
                return boxed(
                    Problem::new(
                        StatusCode::BAD_REQUEST,
                        "idempotency_key_missing",
                        format!(
                            "{} {} requires an Idempotency-Key header",
                            parts.method,
                            parts.uri.path()
                        ),
                    )
                    .response(),
                );
            }
            Some(value) => match parse_key(value) {
                Ok(key) => key,
                Err(description) => {
                    count("rejected");
                    let mut problem = Problem::new(
                        StatusCode::BAD_REQUEST,
                        "idempotency_key_malformed",
                        format!("Idempotency-Key {description}"),
                    );
                    problem.set("field", json!("Idempotency-Key"));
                    return boxed(problem.response());
                }
            },
        };
        let body = match super::read_body(body, settings.max_request_bytes).await {
            Ok(body) => body,
            Err(problem) => {
                count("rejected");
                return boxed(problem.response());
            }
        };
        let claim = claim_request(
            matched.endpoint.clone(),
            key.clone(),
            &parts,
            &body,
            &settings,
        );
        let request = grpc_request(claim, &parts.headers, &self.token_header, &connection);
        let claimed = match Idempotency::claim(&self.services, request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                count("rejected");
                return boxed(Problem::from_status(&status).response());
            }
        };
        let lease = match claimed.outcome {
            Some(pb::claim_response::Outcome::Claimed(lease)) => lease,
            other => return answer(other, &settings),
        };
        let call = Call {
            proxy: self.clone(),
            endpoint: matched.endpoint,
            key,
            lease,
            headers: parts.headers.clone(),
            connection,
            settings,
        };
        // Detached from the client's connection: see the module docs.
        match tokio::spawn(call.run(parts, body)).await {
            Ok(response) => response,
            Err(error) => boxed(
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("proxy task failed: {error}"),
                )
                .response(),
            ),
        }
    }

    /// Forwards a request that needs no key, streaming both ways.
    async fn pass_through(
        &self,
        parts: http::request::Parts,
        body: Incoming,
        settings: &RouteSettings,
    ) -> http::Response<Body> {
        let body = match super::read_body(body, settings.max_request_bytes).await {
            Ok(body) => body,
            Err(problem) => return boxed(problem.response()),
        };
        let started = Instant::now();
        let sent = tokio::time::timeout(
            settings.upstream_timeout,
            self.upstream.send(&parts, body, self.dropped_header()),
        )
        .await;
        record_upstream(started);
        match sent {
            Ok(Ok(response)) => stream_back(response, Bytes::new()),
            Ok(Err(UpstreamError::NotSent(detail))) => bad_gateway(&detail),
            Ok(Err(UpstreamError::MaybeSent(detail))) => gateway_timeout(&detail, false),
            Err(_) => gateway_timeout("the upstream did not answer in time", false),
        }
    }

    fn dropped_header(&self) -> Option<&HeaderName> {
        (self.token_header != header::AUTHORIZATION).then_some(&self.token_header)
    }
}

/// One claimed request: forwarded, then recorded.
struct Call<S> {
    proxy: Proxy<S>,
    endpoint: String,
    key: String,
    lease: pb::Claimed,
    /// The original request's headers: its credentials make the Complete,
    /// Fail and ExtendLease calls (the lease holder is the claiming caller).
    headers: http::HeaderMap,
    /// The client's connection (its address and certificates), for the
    /// same reason.
    connection: Connection,
    settings: Arc<RouteSettings>,
}

impl<S: Services> Call<S> {
    async fn run(self, parts: http::request::Parts, body: Bytes) -> http::Response<Body> {
        let deadline = Instant::now() + self.settings.upstream_timeout;
        let started = Instant::now();
        let forward = async {
            let response = self
                .proxy
                .upstream
                .send(&parts, body, self.proxy.dropped_header())
                .await?;
            let (head, mut body) = response.into_parts();
            if head.status.is_server_error() && self.settings.on_5xx == On5xx::Release {
                return Ok(Answer::Released(head, body));
            }
            let mut buffered = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame =
                    frame.map_err(|e| UpstreamError::MaybeSent(upstream::error_chain(&e)))?;
                if let Some(data) = frame.data_ref() {
                    buffered.extend_from_slice(data);
                    if buffered.len() > self.settings.max_response_bytes {
                        return Ok(Answer::TooLarge(head, Bytes::from(buffered), body));
                    }
                }
            }
            Ok(Answer::Whole(head, Bytes::from(buffered)))
        };
        let answer = tokio::select! {
            answer = tokio::time::timeout_at(deadline.into(), forward) => answer,
            never = self.keep_lease() => match never {},
        };
        record_upstream(started);
        match answer {
            Err(_) => {
                let reason = format!(
                    "upstream gave no complete answer within {}",
                    humantime::format_duration(self.settings.upstream_timeout)
                );
                self.fail(pb::Disposition::Unknown, &reason).await;
                count("upstream_unknown");
                gateway_timeout(&reason, true)
            }
            Ok(Err(UpstreamError::NotSent(detail))) => {
                self.fail(pb::Disposition::Release, &detail).await;
                count("upstream_unavailable");
                bad_gateway(&detail)
            }
            Ok(Err(UpstreamError::MaybeSent(detail))) => {
                self.fail(pb::Disposition::Unknown, &detail).await;
                count("upstream_unknown");
                gateway_timeout(&detail, true)
            }
            Ok(Ok(Answer::Released(head, body))) => {
                let reason = format!("upstream answered {}", head.status);
                self.fail(pb::Disposition::Release, &reason).await;
                count("released");
                stream_back(http::Response::from_parts(head, body), Bytes::new())
            }
            Ok(Ok(Answer::TooLarge(head, buffered, rest))) => {
                let reason = format!(
                    "upstream answer exceeds max_response_bytes ({} bytes); returned to the caller, not stored",
                    self.settings.max_response_bytes
                );
                self.fail(pb::Disposition::Unknown, &reason).await;
                count("too_large");
                stream_back(http::Response::from_parts(head, rest), buffered)
            }
            Ok(Ok(Answer::Whole(head, body))) => {
                let stored = pb::StoredResponse {
                    status: u32::from(head.status.as_u16()),
                    headers: head
                        .headers
                        .iter()
                        .filter(|(name, _)| self.settings.store_headers.contains(name))
                        .filter_map(|(name, value)| {
                            Some(pb::Header {
                                name: name.as_str().to_string(),
                                value: value.to_str().ok()?.to_string(),
                            })
                        })
                        .collect(),
                    body: body.to_vec(),
                    body_ref: String::new(),
                };
                let complete = pb::CompleteRequest {
                    endpoint: self.endpoint.clone(),
                    key: self.key.clone(),
                    lease_token: self.lease.lease_token.clone(),
                    response: Some(stored),
                };
                match Idempotency::complete(&self.proxy.services, self.request(complete)).await {
                    Ok(_) => count("executed"),
                    Err(status) => {
                        // The side effect happened: the caller gets its
                        // answer. The key is marked UNKNOWN when the store
                        // refused the answer (e.g. too large for the
                        // endpoint's policy); a store fault leaves it to the
                        // lease and the expired-lease policy.
                        tracing::warn!(endpoint = %self.endpoint, code = ?status.code(), message = status.message(), "recording the upstream's answer failed");
                        if matches!(
                            status.code(),
                            tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
                        ) {
                            let reason = format!("answer not stored: {}", status.message());
                            self.fail(pb::Disposition::Unknown, &reason).await;
                        }
                        count("unrecorded");
                    }
                }
                let mut headers = head.headers;
                strip_hop_by_hop(&mut headers);
                headers.remove(header::CONTENT_LENGTH);
                let mut response = http::Response::new(full(body));
                *response.status_mut() = head.status;
                *response.headers_mut() = headers;
                response
            }
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        grpc_request(
            message,
            &self.headers,
            &self.proxy.token_header,
            &self.connection,
        )
    }

    async fn fail(&self, disposition: pb::Disposition, reason: &str) {
        let fail = pb::FailRequest {
            endpoint: self.endpoint.clone(),
            key: self.key.clone(),
            lease_token: self.lease.lease_token.clone(),
            disposition: disposition.into(),
            reason: truncate(reason, crate::api::MAX_REASON_BYTES),
        };
        if let Err(status) = Idempotency::fail(&self.proxy.services, self.request(fail)).await {
            tracing::warn!(endpoint = %self.endpoint, code = ?status.code(), message = status.message(), "failing the key after an upstream error failed; its lease will run out");
        }
    }

    /// Extends the lease at a third of its length until dropped.
    async fn keep_lease(&self) -> Infallible {
        let remaining = self
            .lease
            .lease_expires_at
            .as_ref()
            .and_then(|at| {
                crate::api::system_time(at)
                    .duration_since(SystemTime::now())
                    .ok()
            })
            .unwrap_or(Duration::from_secs(1));
        let period = (remaining / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(period).await;
            let extend = pb::ExtendLeaseRequest {
                endpoint: self.endpoint.clone(),
                key: self.key.clone(),
                lease_token: self.lease.lease_token.clone(),
                lease: None,
            };
            if let Err(status) =
                Idempotency::extend_lease(&self.proxy.services, self.request(extend)).await
            {
                tracing::warn!(endpoint = %self.endpoint, code = ?status.code(), message = status.message(), "extending the lease failed");
            }
        }
    }
}

/// What the upstream answered.
enum Answer {
    /// A whole answer within `max_response_bytes`.
    Whole(http::response::Parts, Bytes),
    /// A 5xx on a route that releases the key; the body is streamed back.
    Released(http::response::Parts, Incoming),
    /// An answer over `max_response_bytes`: the part read so far and the
    /// rest, streamed back.
    TooLarge(http::response::Parts, Bytes, Incoming),
}

/// A stored answer, replayed.
fn replay(stored: pb::StoredResponse) -> http::Response<Body> {
    let mut response = http::Response::new(full(stored.body));
    *response.status_mut() =
        StatusCode::from_u16(u16::try_from(stored.status).unwrap_or(500)).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    for stored in stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(stored.name.as_bytes()),
            HeaderValue::from_str(&stored.value),
        ) {
            headers.append(name, value);
        }
    }
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

fn bad_gateway(detail: &str) -> http::Response<Body> {
    boxed(
        Problem::new(
            StatusCode::BAD_GATEWAY,
            "upstream_unavailable",
            format!("{detail}; the key was released, retry with the same key"),
        )
        .response(),
    )
}

/// 504; with `pending`, the key was claimed and its outcome is unknown.
fn gateway_timeout(detail: &str, pending: bool) -> http::Response<Body> {
    let problem = if pending {
        let mut problem = Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "outcome_pending",
            format!(
                "{detail}; the request may have run, so its key is marked UNKNOWN until it is reconciled"
            ),
        );
        problem.set("state", json!("STATE_UNKNOWN"));
        problem
    } else {
        Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            detail.to_string(),
        )
    };
    boxed(problem.response())
}

fn record_upstream(started: Instant) {
    metrics::histogram!(names::PROXY_UPSTREAM_DURATION).record(started.elapsed().as_secs_f64());
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The key of an `Idempotency-Key` value: a Structured Field string
/// (RFC 8941 section 3.3.3) or a bare token, then the API's key rules.
pub fn parse_key(value: &HeaderValue) -> Result<String, String> {
    let text = value
        .to_str()
        .map_err(|_| "contains bytes that are not visible ASCII".to_string())?
        .trim_matches(' ');
    let key = match text.strip_prefix('"') {
        None => text.to_string(),
        Some(quoted) => {
            let mut key = String::new();
            let mut chars = quoted.chars();
            loop {
                match chars.next() {
                    None => {
                        return Err("is a Structured Field string without its closing quote".into());
                    }
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(c @ ('"' | '\\')) => key.push(c),
                        _ => return Err(
                            "has an escape other than \\\" or \\\\ in its Structured Field string"
                                .into(),
                        ),
                    },
                    Some(c) if (' '..='~').contains(&c) => key.push(c),
                    Some(_) => {
                        return Err("has a character a Structured Field string cannot hold".into());
                    }
                }
            }
            if !chars.as_str().is_empty() {
                return Err("has characters after its Structured Field string".into());
            }
            key
        }
    };
    crate::api::check_key(&key)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &str) -> Result<String, String> {
        parse_key(&HeaderValue::from_str(value).expect("header value"))
    }

    #[test]
    fn keys_are_structured_field_strings_or_bare_tokens() {
        assert_eq!(key("\"8e03978e-40d5\"").as_deref(), Ok("8e03978e-40d5"));
        assert_eq!(key("8e03978e-40d5").as_deref(), Ok("8e03978e-40d5"));
        assert!(key("\"unterminated").is_err());
        assert!(key("\"a\";x=1").is_err());
        assert!(key("\"\"").is_err(), "empty key");
        assert!(key("has space").is_err());
        assert!(key(&"k".repeat(256)).is_err());
        assert!(key(&"k".repeat(255)).is_ok());
    }
}
