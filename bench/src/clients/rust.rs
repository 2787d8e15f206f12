//! The `rust` client: this crate's tonic client over one connection,
//! sequential calls, timed here; it also stores the replay keys every
//! client replays.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use tonic::transport::Channel;

use super::probe::{PROBES, Probe, TENANT, WARMUP_CALLS, unique_key};
use crate::systems::{ENDPOINT, FINGERPRINT, stored_response};

pub(super) async fn connect(url: &str) -> Result<IdempotencyClient<Channel>> {
    let channel = Channel::from_shared(url.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to {url}"))?;
    Ok(IdempotencyClient::new(channel))
}

fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "x-tenant-id",
        tonic::metadata::MetadataValue::from_static(TENANT),
    );
    request
}

fn claim_message(key: &str) -> pb::ClaimRequest {
    pb::ClaimRequest {
        endpoint: ENDPOINT.into(),
        key: key.into(),
        fingerprint: Some(pb::claim_request::Fingerprint::Sha256(FINGERPRINT.to_vec())),
        ..Default::default()
    }
}

/// The response every system stores, with `body` instead.
fn stored(body: Vec<u8>) -> pb::StoredResponse {
    pb::StoredResponse {
        body,
        ..stored_response()
    }
}

/// The replay key of a body size: the no-op server answers `rb<SIZE>-` keys
/// with a stored body of that size; idemd gets the key completed here.
pub(super) async fn prepare_replay_keys(
    client: &mut IdempotencyClient<Channel>,
    system: &str,
) -> Result<Vec<(usize, String)>> {
    let mut keys = Vec::new();
    for size in PROBES.iter().filter_map(|p| p.replay_bytes()) {
        let key = unique_key(&format!("rb{size}"));
        let response = client
            .claim(request(claim_message(&key)))
            .await
            .map_err(|s| anyhow!("{system}: claim of replay key: {s}"))?
            .into_inner();
        match response.outcome {
            Some(pb::claim_response::Outcome::Claimed(claimed)) => {
                client
                    .complete(request(pb::CompleteRequest {
                        endpoint: ENDPOINT.into(),
                        key: key.clone(),
                        lease_token: claimed.lease_token,
                        response: Some(stored(vec![b'x'; size])),
                    }))
                    .await
                    .map_err(|s| anyhow!("{system}: complete of replay key: {s}"))?;
            }
            // The no-op server's canned answer for `rb` keys.
            Some(pb::claim_response::Outcome::Replayed(_)) => {}
            other => bail!("{system}: replay key set-up got {other:?}"),
        }
        keys.push((size, key));
    }
    Ok(keys)
}

/// p50 and p99 in ms of a sample.
fn percentiles_ms(mut sample: Vec<Duration>) -> (f64, f64) {
    sample.sort_unstable();
    if sample.is_empty() {
        return (0.0, 0.0);
    }
    let at = |q: f64| sample[((sample.len() - 1) as f64 * q).round() as usize];
    (
        at(0.50).as_secs_f64() * 1000.0,
        at(0.99).as_secs_f64() * 1000.0,
    )
}

async fn rust_call(
    client: &mut IdempotencyClient<Channel>,
    probe: Probe,
    replay_key: Option<&str>,
) -> Result<()> {
    use pb::claim_response::Outcome;
    match (probe, replay_key) {
        (Probe::Claim, _) => {
            let response = client
                .claim(request(claim_message(&unique_key("c1"))))
                .await?
                .into_inner();
            if !matches!(response.outcome, Some(Outcome::Claimed(_))) {
                bail!("fresh claim answered {:?}", response.outcome);
            }
        }
        (Probe::Pair, _) => {
            let key = unique_key("p1");
            let response = client
                .claim(request(claim_message(&key)))
                .await?
                .into_inner();
            let Some(Outcome::Claimed(claimed)) = response.outcome else {
                bail!("fresh claim answered {:?}", response.outcome);
            };
            client
                .complete(request(pb::CompleteRequest {
                    endpoint: ENDPOINT.into(),
                    key,
                    lease_token: claimed.lease_token,
                    response: Some(stored_response()),
                }))
                .await?;
        }
        (Probe::Replay1k | Probe::Replay16k, Some(key)) => {
            let response = client
                .claim(request(claim_message(key)))
                .await?
                .into_inner();
            let Some(Outcome::Replayed(replayed)) = response.outcome else {
                bail!("replay answered {:?}", response.outcome);
            };
            let expected = probe.replay_bytes().unwrap_or(0);
            let got = replayed.response.map_or(0, |r| r.body.len());
            if got != expected {
                bail!("replayed body of {got} bytes, expected {expected}");
            }
        }
        (_, None) => bail!("no replay key for {}", probe.name()),
    }
    Ok(())
}

pub(super) async fn sequence(
    client: &mut IdempotencyClient<Channel>,
    probe: Probe,
    replay_key: Option<&str>,
    calls: usize,
) -> Result<(f64, f64)> {
    for _ in 0..WARMUP_CALLS {
        rust_call(client, probe, replay_key).await?;
    }
    let mut sample = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        rust_call(client, probe, replay_key).await?;
        sample.push(started.elapsed());
    }
    Ok(percentiles_ms(sample))
}
