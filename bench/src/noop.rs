//! The no-op baseline: a tonic server of the same proto that answers from
//! canned messages, without state or I/O. It is the gRPC ceiling: whatever
//! idemd does beyond decoding, routing and encoding shows as the gap to it.
//!
//! The responses have the same shape and size as idemd's: a `Claim` of a
//! key starting with `r-` (the replay workload's keys) answers `replayed`
//! with the stored response; a key starting with `rb<SIZE>-` (the
//! one-in-flight replay probes, `clients`) answers `replayed` with a
//! body of SIZE bytes; any other `Claim` answers `claimed` with a
//! 32-character lease token. It enforces nothing, so the conflict workload
//! is not run against it. It serves reflection (v1 and v1alpha) like idemd,
//! so that ghz finds both services the same way.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_server::{Idempotency, IdempotencyServer};
use tonic::{Request, Response, Status};

use crate::systems::stored_response;

/// The canned service.
#[derive(Debug, Default)]
pub struct Noop;

fn timestamp(offset: Duration) -> prost_types::Timestamp {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        + offset;
    prost_types::Timestamp {
        seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
    }
}

/// The body size a `rb<SIZE>-…` key asks for (at most 1 MiB).
fn sized_replay(key: &str) -> Option<usize> {
    let (size, _) = key.strip_prefix("rb")?.split_once('-')?;
    size.parse().ok().filter(|&n| n <= 1 << 20)
}

#[tonic::async_trait]
impl Idempotency for Noop {
    async fn claim(
        &self,
        request: Request<pb::ClaimRequest>,
    ) -> Result<Response<pb::ClaimResponse>, Status> {
        let request = request.into_inner();
        let fingerprint = match request.fingerprint {
            Some(pb::claim_request::Fingerprint::Sha256(digest)) => digest,
            _ => vec![0; 32],
        };
        use pb::claim_response::Outcome;
        let canned = if request.key.starts_with("r-") {
            Some(stored_response())
        } else {
            sized_replay(&request.key).map(|size| pb::StoredResponse {
                body: vec![b'x'; size],
                ..stored_response()
            })
        };
        let (outcome, http_status) = if let Some(response) = canned {
            (
                Outcome::Replayed(pb::Replayed {
                    response: Some(response),
                    completed_at: Some(timestamp(Duration::ZERO)),
                }),
                201,
            )
        } else {
            (
                Outcome::Claimed(pb::Claimed {
                    lease_token: "0123456789abcdef0123456789abcdef".into(),
                    lease_expires_at: Some(timestamp(Duration::from_secs(60))),
                    attempt: 1,
                    expires_at: Some(timestamp(Duration::from_secs(86_400))),
                }),
                0,
            )
        };
        Ok(Response::new(pb::ClaimResponse {
            outcome: Some(outcome),
            http_status,
            error_code: String::new(),
            fingerprint,
        }))
    }

    /// Each item as `claim` answers it: the no-op's batch costs what
    /// decoding and encoding the items cost, nothing more.
    async fn claim_batch(
        &self,
        request: Request<pb::ClaimBatchRequest>,
    ) -> Result<Response<pb::ClaimBatchResponse>, Status> {
        let mut results = Vec::new();
        for claim in request.into_inner().claims {
            let response = self.claim(Request::new(claim)).await?.into_inner();
            results.push(pb::ClaimBatchResult {
                result: Some(pb::claim_batch_result::Result::Response(response)),
            });
        }
        Ok(Response::new(pb::ClaimBatchResponse { results }))
    }

    async fn complete_batch(
        &self,
        request: Request<pb::CompleteBatchRequest>,
    ) -> Result<Response<pb::CompleteBatchResponse>, Status> {
        let results = request
            .into_inner()
            .completions
            .iter()
            .map(|_| pb::CompleteBatchResult {
                result: Some(pb::complete_batch_result::Result::Response(
                    pb::CompleteResponse {
                        expires_at: Some(timestamp(Duration::from_secs(86_400))),
                    },
                )),
            })
            .collect();
        Ok(Response::new(pb::CompleteBatchResponse { results }))
    }

    async fn complete(
        &self,
        _request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        Ok(Response::new(pb::CompleteResponse {
            expires_at: Some(timestamp(Duration::from_secs(86_400))),
        }))
    }

    async fn fail(
        &self,
        _request: Request<pb::FailRequest>,
    ) -> Result<Response<pb::FailResponse>, Status> {
        Ok(Response::new(pb::FailResponse {}))
    }

    async fn extend_lease(
        &self,
        _request: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        Ok(Response::new(pb::ExtendLeaseResponse {
            lease_expires_at: Some(timestamp(Duration::from_secs(60))),
        }))
    }

    async fn lookup(
        &self,
        _request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        Ok(Response::new(pb::LookupResponse::default()))
    }

    async fn list_pending(
        &self,
        _request: Request<pb::ListPendingRequest>,
    ) -> Result<Response<pb::ListPendingResponse>, Status> {
        Ok(Response::new(pb::ListPendingResponse::default()))
    }

    async fn reconcile(
        &self,
        _request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        Ok(Response::new(pb::ReconcileResponse::default()))
    }
}

/// Serves the no-op service on `listen` until SIGTERM/SIGINT; prints the
/// bound address (useful with port 0) on stdout first.
pub async fn serve(listen: SocketAddr) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let address = listener.local_addr()?;
    println!("{address}");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(idemd::proto::FILE_DESCRIPTOR_SET)
    };
    // The same transport settings as idemd's server (src/server.rs),
    // including its accept path (`idemd::net`, which sets TCP_NODELAY).
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(IdempotencyServer::new(Noop))
        .serve_with_incoming_shutdown(idemd::net::incoming(listener), async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::sized_replay;

    #[test]
    fn sized_replay_keys() {
        assert_eq!(sized_replay("rb1024-abc"), Some(1024));
        assert_eq!(sized_replay("rb16384-go-1"), Some(16384));
        assert_eq!(sized_replay("rbx-1"), None);
        assert_eq!(sized_replay("r-1"), None);
        assert_eq!(sized_replay("rb99999999-1"), None);
    }
}
