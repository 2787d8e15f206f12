//! Exactly one winner per key under heavy contention: 64 concurrent Claims
//! per key over 500 keys (32,000 Claims in flight together), through gRPC
//! against a real server on the embedded store.

use std::collections::HashMap;

use crate::common::*;

/// Contenders per key.
const CONTENDERS: usize = 64;
/// Distinct keys.
const KEYS: usize = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_claims_per_key_over_500_keys_have_one_winner_each() {
    let server = TestServer::embedded().await;
    // A handful of connections, as a fleet of callers would have.
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(server.new_client().await);
    }
    let mut tasks = Vec::with_capacity(CONTENDERS * KEYS);
    for contender in 0..CONTENDERS {
        for key in 0..KEYS {
            let mut client = clients[(contender + key) % clients.len()].clone();
            let request = claim(PAYMENTS, &format!("contended-{key}"), 4200);
            tasks.push(tokio::spawn(async move {
                let response = client
                    .claim(as_tenant("race", request))
                    .await
                    .expect("claim answered")
                    .into_inner();
                (key, outcome_name(&response), response)
            }));
        }
    }
    let mut winners: HashMap<usize, Vec<String>> = HashMap::new();
    let mut outcomes: HashMap<&'static str, usize> = HashMap::new();
    for task in tasks {
        let (key, outcome, response) = task.await.expect("task");
        *outcomes.entry(outcome).or_default() += 1;
        match outcome {
            "claimed" => winners
                .entry(key)
                .or_default()
                .push(claimed(&response).lease_token),
            "in_progress" => assert_eq!(response.http_status, 409),
            other => panic!("unexpected outcome {other} for key {key}"),
        }
    }
    assert_eq!(winners.len(), KEYS, "every key has a winner: {outcomes:?}");
    for (key, tokens) in &winners {
        assert_eq!(tokens.len(), 1, "key {key} has {} winners", tokens.len());
    }
    assert_eq!(
        outcomes.get("in_progress"),
        Some(&(KEYS * (CONTENDERS - 1)))
    );
    server.stop().await;
}
