//! The workload every system runs: the endpoint, tenant, stored body,
//! TTL and fingerprint of each key, and what a claim can answer.

use std::time::{SystemTime, UNIX_EPOCH};

use idemd::proto::v1 as pb;

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

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
