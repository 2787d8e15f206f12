//! The HTTP front doors: the gRPC API over HTTP/JSON (`--http-listen`) and
//! `idemd proxy`, the sidecar that makes an HTTP service idempotent with no
//! code change.
//!
//! Both sit *above* the gRPC layer: they turn an HTTP request into the
//! `tonic::Request` the gRPC handlers take and call them in process, through
//! the same delegate the gRPC port uses (admission limits, the
//! `idemd_rpc_duration_seconds` metric, a span per call). So credentials are
//! checked by [`crate::auth`] exactly as for gRPC (the bearer token, the
//! verified client certificate, or `x-tenant-id` with auth off), the
//! engine's validation and its statuses are the same, and a caller's W3C
//! `traceparent` header joins the call's spans to its trace. Nothing here
//! touches the engine or a store directly.
//!
//! * [`api`]: `POST /v1/claim`, … with the proto3 JSON mapping of the
//!   messages; errors are RFC 9457 problem details carrying the gRPC code
//!   and the `google.rpc` details ([`problem`]).
//! * [`proxy`]: `Idempotency-Key` handling in front of an upstream HTTP
//!   service (draft-ietf-httpapi-idempotency-key-header).
//! * [`call`]: what both hand the gRPC handlers: the [`Connection`], the
//!   `tonic::Request` built from an HTTP request, a size-limited body.
//! * [`serve`]: the accept loop both use (HTTP/1.1, plaintext or TLS with
//!   the gRPC port's reloading certificates, graceful shutdown).

pub mod api;
pub mod call;
pub mod problem;
pub mod proxy;
pub mod serve;

pub use call::{Connection, ConnectionCerts, Services, grpc_request, read_body};
