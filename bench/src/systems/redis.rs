//! The Redis-direct baseline: `SET key v NX EX ttl GET` to claim (and the
//! old value in the same round trip when the key exists), `SET key v XX
//! KEEPTTL` to complete.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};

use super::workload::{ClaimOutcome, FINGERPRINT, RESPONSE_BODY, TTL_SECONDS};

/// Multiplexed Redis connections (each pipelines its in-flight commands).
pub struct Redis {
    connections: Vec<redis::aio::MultiplexedConnection>,
    tokens: AtomicU64,
}

impl Redis {
    /// Opens `connections` multiplexed connections to `url`.
    pub async fn connect(url: &str, connections: usize) -> Result<Self> {
        let client = redis::Client::open(url)?;
        let mut out = Vec::new();
        for _ in 0..connections.max(1) {
            out.push(client.get_multiplexed_async_connection().await?);
        }
        Ok(Self {
            connections: out,
            tokens: AtomicU64::new(1),
        })
    }

    fn connection(&self, worker: usize) -> redis::aio::MultiplexedConnection {
        self.connections[worker % self.connections.len()].clone()
    }

    pub(super) async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let mut value = Vec::with_capacity(48);
        value.extend_from_slice(b"p:");
        value.extend_from_slice(&FINGERPRINT);
        value.extend_from_slice(&token.to_le_bytes());
        // NX + GET: sets when absent, else returns the current value without
        // writing, so a replay costs one round trip (Redis >= 7.0).
        let previous: Option<Vec<u8>> = redis::cmd("SET")
            .arg(format!("idem:{key}"))
            .arg(value)
            .arg("NX")
            .arg("EX")
            .arg(TTL_SECONDS)
            .arg("GET")
            .query_async(&mut self.connection(worker))
            .await?;
        Ok(match previous {
            None => ClaimOutcome::Won(token.to_string()),
            Some(v) if v.starts_with(b"c:") => ClaimOutcome::Replayed,
            Some(_) => ClaimOutcome::Busy,
        })
    }

    pub(super) async fn complete(&self, key: &str, worker: usize) -> Result<()> {
        let mut value = Vec::with_capacity(80);
        value.extend_from_slice(b"c:201:");
        value.extend_from_slice(RESPONSE_BODY);
        let done: Option<String> = redis::cmd("SET")
            .arg(format!("idem:{key}"))
            .arg(value)
            .arg("XX")
            .arg("KEEPTTL")
            .query_async(&mut self.connection(worker))
            .await?;
        if done.is_none() {
            bail!("SET XX found no claim for {key}");
        }
        Ok(())
    }
}
