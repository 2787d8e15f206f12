//! The payment retry from the idempotency-keys article, against a running
//! idemd (`cargo run --release` in another terminal):
//!
//! 1. Claim the key and "charge the card".
//! 2. Complete with the 201 response, which the client never receives
//!    (the connection drops).
//! 3. The client retries with the same key: idemd replays the stored 201
//!    instead of charging again.
//! 4. A buggy client reuses the key with a changed amount: 422.
//!
//! ```text
//! cargo run --example payment_flow [-- http://127.0.0.1:50051]
//! ```

use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use pb::claim_response::Outcome;

fn payment_request(amount: u64) -> pb::ClaimRequest {
    pb::ClaimRequest {
        endpoint: "POST /v1/payments".into(),
        key: KEY.to_string(),
        fingerprint: Some(pb::claim_request::Fingerprint::Request(pb::HttpRequest {
            method: "POST".into(),
            path: "/v1/payments".into(),
            body: format!(
                r#"{{"amount":{amount},"currency":"usd","customer":"cus_8812","description":"Order 1042"}}"#
            )
            .into_bytes(),
            content_type: "application/json".into(),
            ignore_fields: vec![],
        })),
        ..Default::default()
    }
}

/// One key per logical operation; a real client generates a UUIDv4 and
/// persists it before the first attempt. The process id keeps runs of this
/// example apart.
static KEY: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("4f8c2a1e-6b0d-4c7e-9a51-{:012x}", std::process::id()));

fn tenant<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "x-tenant-id",
        tonic::metadata::MetadataValue::from_static("demo"),
    );
    request
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:50051".to_string());
    let mut client = IdempotencyClient::connect(address.clone())
        .await
        .map_err(|e| {
            format!("cannot reach idemd at {address} ({e}); start it with `cargo run --release`")
        })?;

    println!("key: {}", *KEY);
    // 1. First attempt: claim, then run the side effect.
    let first = client
        .claim(tenant(payment_request(4200)))
        .await?
        .into_inner();
    let Some(Outcome::Claimed(lease)) = first.outcome else {
        return Err(format!("expected to claim a fresh key, got {:?}", first.outcome).into());
    };
    println!(
        "1. claimed (attempt {}): charging the card once",
        lease.attempt
    );

    // 2. Store the response. Pretend the client never receives it.
    let response = pb::StoredResponse {
        status: 201,
        headers: vec![pb::Header {
            name: "Content-Type".into(),
            value: "application/json".into(),
        }],
        body: br#"{"id":"pay_9F2Kx","status":"succeeded","amount":4200}"#.to_vec(),
        body_ref: String::new(),
    };
    client
        .complete(tenant(pb::CompleteRequest {
            endpoint: "POST /v1/payments".into(),
            key: KEY.to_string(),
            lease_token: lease.lease_token,
            response: Some(response),
        }))
        .await?;
    println!("2. completed with 201 ... and the connection dropped before the client saw it");

    // 3. The client retries the same operation with the same key.
    let retry = client
        .claim(tenant(payment_request(4200)))
        .await?
        .into_inner();
    match retry.outcome {
        Some(Outcome::Replayed(replayed)) => {
            let stored = replayed.response.unwrap_or_default();
            println!(
                "3. retry -> replayed {} (Idempotent-Replayed: true): {}",
                retry.http_status,
                String::from_utf8_lossy(&stored.body)
            );
        }
        other => return Err(format!("expected a replay, got {other:?}").into()),
    }

    // 4. Same key, different amount: a client bug, rejected permanently.
    let reuse = client
        .claim(tenant(payment_request(42000)))
        .await?
        .into_inner();
    println!(
        "4. same key, amount changed -> {} {{\"error\":\"{}\"}}",
        reuse.http_status, reuse.error_code
    );
    if reuse.http_status != 422 {
        return Err("expected 422 for a reused key".into());
    }
    Ok(())
}
