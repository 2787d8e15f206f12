//! The careful client: what a service that uses idemd correctly does, run
//! by many workers at once while faults are injected.
//!
//! Each logical call Claims with an `attempt_id` of its own and retries the
//! same Claim on every transport error or `UNAVAILABLE` (the server may have
//! applied it); when it wins, it Completes with a response derived from its
//! lease token and retries that same Complete until it is acknowledged.
//! About 30% of calls go to keys that several workers claim at once, so
//! exclusivity is exercised under the fault, not only durability.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::history::{Final, History, response_body};
use crate::plumbing::grpc::{ENDPOINT, channel, request};

/// Settings shared by the workers of one scenario.
#[derive(Debug, Clone)]
pub struct Load {
    /// Concurrent workers: enough that contended keys see several
    /// claimants at once under the fault.
    pub workers: usize,
    /// Per-RPC deadline: a paused server must not hold a worker forever.
    pub rpc_timeout: Duration,
    /// How long one logical call may keep retrying after the heal began.
    pub heal_budget: Duration,
}

/// The Claim's fingerprint: any 32 bytes fixed per key, so retries of a
/// call send the same request.
fn fingerprint(key: &str) -> Vec<u8> {
    let mut digest = [0u8; 32];
    for (i, byte) in key.bytes().enumerate() {
        digest[i % 32] ^= byte.rotate_left((i / 32) as u32);
    }
    digest.to_vec()
}

/// A Claim of `key` by the attempt `attempt_id`, as every careful client
/// sends it.
pub fn claim_request(key: &str, attempt_id: &str) -> pb::ClaimRequest {
    pb::ClaimRequest {
        endpoint: ENDPOINT.to_string(),
        key: key.to_string(),
        fingerprint: Some(pb::claim_request::Fingerprint::Sha256(fingerprint(key))),
        // Longer than any scenario: a lease never runs out under the fault,
        // so a second holder can only come from a broken claim.
        lease: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
        ttl: None,
        wait: None,
        attempt_id: attempt_id.to_string(),
    }
}

/// Whether a failed RPC may be retried as is (the server may or may not
/// have applied it; the same request is safe to send again).
fn transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Cancelled
            | Code::Internal
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

fn code_name(code: Code) -> String {
    format!("{code:?}")
}

/// Runs workers until `stop`; each finishes its call in progress (retrying
/// within the heal budget) before it returns.
pub async fn run(
    addresses: Arc<Vec<String>>,
    load: Load,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) {
    let contended = Arc::new(AtomicU64::new(0));
    // Keys unique to this run: scenarios that share a store (the CQL ones
    // share a keyspace) must not replay each other's responses.
    let run_id = format!("{:08x}", rand::random::<u32>());
    let mut tasks = Vec::new();
    for worker in 0..load.workers {
        let run_id = run_id.clone();
        let (addresses, load, history, stop, contended) = (
            Arc::clone(&addresses),
            load.clone(),
            Arc::clone(&history),
            Arc::clone(&stop),
            Arc::clone(&contended),
        );
        tasks.push(tokio::spawn(async move {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let key = if rand::random::<f64>() < 0.3 {
                    // About four workers in a row land on each contended key.
                    format!(
                        "{run_id}-c-{}",
                        contended.fetch_add(1, Ordering::Relaxed) / 4
                    )
                } else {
                    format!("{run_id}-u-{worker}-{seq}")
                };
                let attempt_id = format!("w{worker}-{seq}");
                let to = Replicas {
                    addresses: &addresses,
                    first: worker,
                };
                call(&to, &load, &history, &stop, &key, &attempt_id).await;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

/// The idemd replicas a worker may call: it starts with one and moves to
/// the next on every failed RPC (what a client behind a load balancer
/// sees when a replica dies).
struct Replicas<'a> {
    /// Every replica's address, in the run's order (replica indices in the
    /// history are positions here).
    addresses: &'a [String],
    /// The worker's first choice, so workers spread over the replicas.
    first: usize,
}

impl Replicas<'_> {
    /// The index of the replica of `turn`.
    fn index(&self, turn: usize) -> usize {
        (self.first + turn) % self.addresses.len()
    }

    /// A client for the replica of `turn` (a fresh channel follows a
    /// restarted server).
    fn client(&self, turn: usize, load: &Load) -> IdempotencyClient<Channel> {
        let address = &self.addresses[self.index(turn)];
        // Only a malformed URI fails, and the addresses are ours.
        IdempotencyClient::new(channel(address, load.rpc_timeout).expect("a valid address"))
    }
}

/// How a logical call handles a failed RPC.
struct Retry<'a> {
    /// The heal budget a call's retries must end within.
    load: &'a Load,
    /// Where failures are recorded (each is a status the report counts).
    history: &'a History,
    /// Set when the fault is healed and workers finish: from then on the
    /// heal budget runs.
    stop: &'a AtomicBool,
    /// When the call first failed after the heal began: the start of its
    /// heal budget.
    healing_since: Option<Instant>,
}

impl Retry<'_> {
    /// Records a failed RPC and says whether to send the same one again
    /// (after a short pause): yes for a transient failure within the heal
    /// budget; no for anything else, recorded as unexpected or undecided.
    async fn again(
        &mut self,
        status: &tonic::Status,
        replica: usize,
        rpc: &str,
        key: &str,
    ) -> bool {
        self.history.status_via(replica, &code_name(status.code()));
        if !transient(status.code()) {
            self.history
                .unexpected(format!("{key}: {rpc} failed: {status}"));
            return false;
        }
        if self.stop.load(Ordering::Relaxed) {
            let since = *self.healing_since.get_or_insert_with(Instant::now);
            if since.elapsed() > self.load.heal_budget {
                self.history.undecided();
                return false;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        true
    }
}

/// One logical call: Claim (retried), then Complete (retried) if it won.
async fn call(
    to: &Replicas<'_>,
    load: &Load,
    history: &History,
    stop: &AtomicBool,
    key: &str,
    attempt_id: &str,
) {
    let mut retry = Retry {
        load,
        history,
        stop,
        healing_since: None,
    };
    let mut turn = 0;
    let mut grpc = to.client(turn, load);
    let claimed = loop {
        match grpc.claim(request(claim_request(key, attempt_id))).await {
            Ok(response) => {
                history.status_via(to.index(turn), "ok");
                use pb::claim_response::Outcome;
                match response.into_inner().outcome {
                    Some(Outcome::Claimed(lease)) => {
                        history.claimed(key, &lease.lease_token);
                        break lease.lease_token;
                    }
                    Some(Outcome::Replayed(replayed)) => {
                        let body = replayed.response.map(|r| r.body).unwrap_or_default();
                        history.replayed(key, &body);
                        return;
                    }
                    Some(Outcome::InProgress(_)) => return,
                    other => {
                        history.unexpected(format!("{key}: Claim answered {other:?}"));
                        return;
                    }
                }
            }
            Err(status) if retry.again(&status, to.index(turn), "Claim", key).await => {
                turn += 1;
                grpc = to.client(turn, load);
            }
            Err(_) => return,
        }
    };
    let body = response_body(key, &claimed);
    let complete = pb::CompleteRequest {
        endpoint: ENDPOINT.to_string(),
        key: key.to_string(),
        lease_token: claimed,
        response: Some(pb::StoredResponse {
            status: 201,
            headers: vec![pb::Header {
                name: "content-type".into(),
                value: "application/json".into(),
            }],
            body: body.clone(),
            body_ref: String::new(),
        }),
    };
    loop {
        match grpc.complete(request(complete.clone())).await {
            Ok(_) => {
                history.status_via(to.index(turn), "ok");
                history.acked(key, &body);
                return;
            }
            Err(status) if retry.again(&status, to.index(turn), "Complete", key).await => {
                turn += 1;
                grpc = to.client(turn, load);
            }
            Err(_) => return,
        }
    }
}

/// After the heal: what the server holds for each key the run touched,
/// read with Lookup (reads never go through the store's writer, so the
/// check itself changes nothing and works on a store that refuses writes).
pub async fn finals(
    address: &str,
    history: &History,
) -> anyhow::Result<std::collections::HashMap<String, Final>> {
    let mut client = IdempotencyClient::new(channel(address, Duration::from_secs(10))?);
    let mut finals = std::collections::HashMap::new();
    for expectation in history.expectations() {
        let key = expectation.key;
        let mut attempts = 0;
        let found = loop {
            attempts += 1;
            let lookup = pb::LookupRequest {
                endpoint: ENDPOINT.to_string(),
                key: key.clone(),
                include_response: true,
            };
            match client.lookup(request(lookup)).await {
                Ok(response) => {
                    let record = response.into_inner().record.unwrap_or_default();
                    break match pb::State::try_from(record.state) {
                        Ok(pb::State::Completed) => {
                            Final::Replayed(record.response.map(|r| r.body).unwrap_or_default())
                        }
                        Ok(pb::State::InProgress) => Final::InProgress,
                        other => Final::Other(format!("state {other:?}")),
                    };
                }
                // Free: a new caller would win it.
                Err(status) if status.code() == Code::NotFound => break Final::Claimed,
                Err(status) if status.code() == Code::DataLoss => break Final::DataLoss,
                Err(status) if transient(status.code()) && attempts < 20 => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(status) => break Final::Other(status.to_string()),
            }
        };
        finals.insert(key, found);
    }
    Ok(finals)
}
