//! The systems under test, behind one client type with two operations:
//! `claim` (take a key, or learn that it is taken or completed) and
//! `complete` (store the response of a claimed key).
//!
//! Every workload is written once against [`Client`], so idemd, the no-op
//! server and the three direct-store baselines run exactly the same loop;
//! only the statements differ. Each baseline issues what a team rolling its
//! own would issue, one module per system:
//!
//! * `grpc`: idemd and the no-op server over gRPC; `http`: idemd's
//!   HTTP/JSON port.
//! * `postgres`: the article's table and statements.
//! * `redis`: `SET NX` to claim, `SET XX` to complete.
//! * `lwt`: idemd's own LWT statements straight on the scylla driver.
//!
//! What every system is asked (endpoint, tenant, body, TTL, fingerprint)
//! and what a claim can answer are in `workload`; [`Client`] in `client`.

mod client;
mod grpc;
mod http;
mod lwt;
mod postgres;
mod redis;
mod workload;

pub use client::Client;
pub use grpc::Grpc;
pub use http::Http;
pub use lwt::Lwt;
pub use postgres::Postgres;
pub use redis::Redis;
pub use workload::{ClaimOutcome, ENDPOINT, FINGERPRINT, stored_response};
