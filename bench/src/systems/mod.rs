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

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use idemd::proto::v1 as pb;

mod grpc;
mod http;
mod lwt;
mod postgres;
mod redis;

pub use grpc::Grpc;
pub use http::Http;
pub use lwt::Lwt;
pub use postgres::Postgres;
pub use redis::Redis;

/// The logical endpoint every system is asked about.
pub const ENDPOINT: &str = "POST /v1/payments";
/// The tenant (gRPC `x-tenant-id`, Postgres `tenant_id`, CQL `tenant`).
pub const TENANT_UUID: &str = "6f1c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90";
/// The stored response body: the article's payment, 55 bytes.
pub const RESPONSE_BODY: &[u8] = br#"{"id":"pay_9F2Kx","status":"succeeded","amount":4200}"#;
/// Dedup window given to every system: 24 h, as in the article.
pub const TTL_SECONDS: i64 = 86_400;
/// Every key is claimed with the same request, so the fingerprint is fixed.
pub const FINGERPRINT: [u8; 32] = [7; 32];

/// What a claim told the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller holds the key (with this lease token): run, then complete.
    Won(String),
    /// The key was completed earlier; the stored response came back.
    Replayed,
    /// Another caller holds the key (in progress / pending).
    Busy,
}

/// One connected client of any system.
pub enum Client {
    /// idemd or the no-op server over gRPC.
    Grpc(Grpc),
    /// idemd's HTTP/JSON port (`--http-listen`).
    Http(Http),
    /// The article's table over tokio-postgres.
    Postgres(Postgres),
    /// Redis, SET NX / SET XX.
    Redis(Redis),
    /// idemd's LWT statements issued directly with the scylla driver.
    Lwt(Box<Lwt>),
}

impl Client {
    /// Claims `key`; `worker` picks the connection.
    pub async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
        match self {
            Client::Grpc(c) => c.claim(key, worker).await,
            Client::Http(c) => c.claim(key, worker).await,
            Client::Postgres(c) => c.claim(key, worker).await,
            Client::Redis(c) => c.claim(key, worker).await,
            Client::Lwt(c) => c.claim(key).await,
        }
    }

    /// Completes a key this caller won with `token`.
    pub async fn complete(&self, key: &str, token: &str, worker: usize) -> Result<()> {
        match self {
            Client::Grpc(c) => c.complete(key, token, worker).await,
            Client::Http(c) => c.complete(key, token, worker).await,
            Client::Postgres(c) => c.complete(key, worker).await,
            Client::Redis(c) => c.complete(key, worker).await,
            Client::Lwt(c) => c.complete(key, token).await,
        }
    }
}

/// The response every system stores, as the proto message.
pub fn stored_response() -> pb::StoredResponse {
    pb::StoredResponse {
        status: 201,
        headers: vec![pb::Header {
            name: "content-type".into(),
            value: "application/json".into(),
        }],
        body: RESPONSE_BODY.to_vec(),
        body_ref: String::new(),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
