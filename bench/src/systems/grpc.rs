//! idemd and the no-op server over gRPC: the client every tonic user
//! writes, over several HTTP/2 connections so that one connection's stream
//! limit and head-of-line blocking do not cap the figure.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

use super::workload::{ClaimOutcome, ENDPOINT, FINGERPRINT, stored_response};

/// gRPC client over `connections` HTTP/2 connections.
pub struct Grpc {
    clients: Vec<IdempotencyClient<Channel>>,
    tenant: MetadataValue<Ascii>,
}

impl Grpc {
    /// Opens `connections` separate HTTP/2 connections to `url`.
    pub async fn connect(url: &str, connections: usize) -> Result<Self> {
        let mut clients = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            // One Endpoint::connect per connection: a cloned Channel would
            // share one HTTP/2 connection.
            let channel = Channel::from_shared(url.to_string())?
                .connect_timeout(Duration::from_secs(5))
                .connect()
                .await
                .with_context(|| format!("connecting to {url}"))?;
            clients.push(IdempotencyClient::new(channel));
        }
        Ok(Self {
            clients,
            tenant: MetadataValue::from_static("bench"),
        })
    }

    fn client(&self, worker: usize) -> IdempotencyClient<Channel> {
        self.clients[worker % self.clients.len()].clone()
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert("x-tenant-id", self.tenant.clone());
        request
    }

    pub(super) async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
        let message = pb::ClaimRequest {
            endpoint: ENDPOINT.into(),
            key: key.into(),
            fingerprint: Some(pb::claim_request::Fingerprint::Sha256(FINGERPRINT.to_vec())),
            ..Default::default()
        };
        let response = self
            .client(worker)
            .claim(self.request(message))
            .await?
            .into_inner();
        use pb::claim_response::Outcome;
        match response.outcome {
            Some(Outcome::Claimed(claimed)) => Ok(ClaimOutcome::Won(claimed.lease_token)),
            Some(Outcome::Replayed(_)) => Ok(ClaimOutcome::Replayed),
            Some(Outcome::InProgress(_) | Outcome::Pending(_)) => Ok(ClaimOutcome::Busy),
            Some(Outcome::Mismatch(_)) => bail!("fingerprint mismatch on {key}"),
            None => bail!("claim response without outcome"),
        }
    }

    pub(super) async fn complete(&self, key: &str, token: &str, worker: usize) -> Result<()> {
        let message = pb::CompleteRequest {
            endpoint: ENDPOINT.into(),
            key: key.into(),
            lease_token: token.into(),
            response: Some(stored_response()),
        };
        self.client(worker)
            .complete(self.request(message))
            .await
            .map_err(|status| anyhow!("complete: {status}"))?;
        Ok(())
    }
}
