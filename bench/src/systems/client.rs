//! [`Client`]: one connected client of any system, so that every
//! workload is written once.

use anyhow::Result;

use super::workload::ClaimOutcome;
use super::{Grpc, Http, Lwt, Postgres, Redis};

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
