//! The integration tests that need no external service, as one test binary.
//!
//! One binary instead of one per file: each test executable links idemd
//! with scylla, tonic and redb, and linking dominated the build of the
//! tests. Run one group with
//! `cargo test --test it server::`, one test by its full name.
//!
//! Shared helpers live beside this folder (`tests/common`, the gRPC,
//! store and audit conformance suites) because the CQL binary
//! (`tests/cql`) and `tests/log_hygiene.rs` use them too. `log_hygiene`
//! stays a binary of its own: it installs a process-wide log capture.

#[path = "../audit_conformance/mod.rs"]
#[macro_use]
mod audit_conformance;
#[path = "../common/mod.rs"]
mod common;
#[path = "../grpc_suite/mod.rs"]
#[macro_use]
mod grpc_suite;
#[path = "../keys_suite/mod.rs"]
#[macro_use]
mod keys_suite;
#[path = "../proxy_suite/mod.rs"]
#[macro_use]
mod proxy_suite;
#[path = "../store_conformance/mod.rs"]
#[macro_use]
mod store_conformance;

mod audit_embedded;
mod concurrency;
mod day_two;
mod docs;
mod encryption;
mod grpc_embedded;
mod keys_embedded;
mod limits;
mod otlp;
mod process;
mod protected_mode;
mod proxy_embedded;
mod server;
mod store_embedded;
mod tls;
mod upgrade_embedded;
mod web;
