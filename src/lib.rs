//! idemd: idempotency keys as a gRPC service.
//!
//! Callers `Claim` a key before a side effect, run the side effect only when
//! they won the claim, then `Complete` with the response; every retry of the
//! same logical operation gets the stored response back. The contract is the
//! one in `docs/design.md` (states, 409 vs 422, fingerprints, leases, TTL).
//!
//! # Layout
//!
//! The module tree follows the request path, outside in:
//!
//! * [`server`]: process start-up and graceful shutdown; wires the store,
//!   the engine, auth, health and reflection onto one tonic server.
//! * [`config`]: command line, `IDEMD_*` environment and the TOML policy
//!   file, layered and validated into [`config::Settings`].
//! * [`auth`]: who is calling. Resolves the tenant from credentials (bearer
//!   tokens, mTLS client certificates through [`auth::client_cert`]) or,
//!   with auth off, from the `x-tenant-id` metadata.
//! * [`tls`]: TLS of the gRPC port with certificates reloaded from disk;
//!   verifies client certificates, which [`auth`] maps to tenants.
//! * [`reload`]: one watcher for every file re-read while running (tokens,
//!   client tenants, certificates, the encryption keyring), on change and on
//!   SIGHUP.
//! * [`api`]: the gRPC handlers. Converts protobuf messages to engine calls
//!   and maps every engine error to a `tonic::Status` in one place
//!   ([`api::status`]). Never touches a database type.
//! * [`web`]: the HTTP front doors above the gRPC layer: the API over
//!   HTTP/JSON (`--http-listen`) and `idemd proxy`, the `Idempotency-Key`
//!   sidecar in front of an HTTP service. Both call the gRPC handlers in
//!   process, so auth, limits, metrics and statuses are the gRPC port's.
//! * [`engine`]: the idempotency state machine (claim, complete, fail,
//!   extend, lookup, pending, reconcile), input validation, waiting for
//!   in-flight duplicates and the completed-record cache. Backend-generic.
//! * [`fingerprint`]: fingerprint v1, the canonical request digest.
//! * [`store`]: the [`store::Store`] trait (the only seam between the engine
//!   and storage), its backends, one module each, and what they share above
//!   both ([`store::response`]: the stored response's bytes, sealed or not).
//! * [`crypto`]: the AES-256-GCM keyring and sealed-value envelope, on
//!   bytes only.
//! * [`audit`]: the append-only audit log of audited endpoints' transitions
//!   ([`audit::AuditLog`]), its own storage with its own retention, one
//!   module per backend.
//! * [`telemetry`]: OpenTelemetry traces over OTLP (a span per RPC, a
//!   child per store operation), off unless `OTEL_EXPORTER_OTLP_ENDPOINT`
//!   is set.
//! * [`net`]: the one accept path of every listener (gRPC, TLS,
//!   `/metrics`), which sets `TCP_NODELAY` on each connection.
//! * [`metrics`]: every Prometheus metric name and help text, the label
//!   cardinality guard and the `/metrics` exporter.
//! * [`admin`]: the admin socket's protocol (`idemd backup` asks the
//!   serving process), below both the server and the CLI.
//! * [`cli`]: operator subcommands: clients of a running server
//!   (`idemd audit`, `idemd keys`), and `idemd copy-to-cql`, which copies a
//!   stopped embedded store into a CQL keyspace.
//! * [`clock`]: the time source, injectable so leases and TTLs are testable
//!   without sleeping.
//! * [`crash`]: the crash points the kill tests name (`IDEMD_CRASH_AT`):
//!   where the CQL store's writes and `idemd restore`'s swap are cut.
//! * [`proto`]: the generated protobuf and gRPC code.

// No function over clippy.toml's `too-many-lines-threshold` (120 code lines).
#![warn(clippy::too_many_lines)]

pub mod admin;
pub mod api;
pub mod audit;
pub mod auth;
pub mod cli;
pub mod clock;
pub mod config;
pub mod crash;
pub mod crypto;
pub mod engine;
pub mod fingerprint;
pub mod metrics;
pub mod net;
pub mod proto;
pub mod reload;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod web;
