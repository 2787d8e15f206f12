//! Writes the seed corpora of the fuzz targets into `fuzz/corpus/<target>/`:
//! the shared fingerprint vectors (`proto/testdata/fingerprint-v1.json`),
//! valid and invalid identities and JSON Pointers, one encoded request of
//! every message type, and records and keys as the embedded store encodes
//! them (the samples of `src/store/embedded/codec.rs`'s tests).
//!
//! Run from the repository root: `cargo run --manifest-path fuzz/Cargo.toml
//! --example gen_corpus`. Output is deterministic; file names are the
//! SHA-less seed names below.

use std::fs;
use std::path::{Path, PathBuf};

use idemd::proto::v1 as pb;
use idemd::store::embedded::codec;
use idemd::store::{RecordKey, RecordState};
use prost::Message;

fn dir(root: &Path, target: &str) -> PathBuf {
    let dir = root.join("corpus").join(target);
    fs::create_dir_all(&dir).expect("create corpus dir");
    dir
}

fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::write(dir.join(file_name(name)), bytes).expect("write seed");
}

struct Vector {
    name: String,
    method: String,
    path: String,
    content_type: String,
    body: Vec<u8>,
    ignore_fields: Vec<String>,
}

fn vectors(repo: &Path) -> Vec<Vector> {
    let text =
        fs::read_to_string(repo.join("proto/testdata/fingerprint-v1.json")).expect("vectors");
    let json: serde_json::Value = serde_json::from_str(&text).expect("vectors JSON");
    json["vectors"]
        .as_array()
        .expect("vectors array")
        .iter()
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            let body = match v.get("body_hex").and_then(|b| b.as_str()) {
                Some(hex) => hex::decode(hex).expect("body_hex"),
                None => s("body_utf8").into_bytes(),
            };
            Vector {
                name: s("name"),
                method: s("method"),
                path: s("path"),
                content_type: s("content_type"),
                body,
                ignore_fields: v["ignore_fields"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|p| p.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect()
}

fn duration(ms: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: ms / 1000,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    })
}

fn response() -> pb::StoredResponse {
    pb::StoredResponse {
        status: 201,
        headers: vec![pb::Header {
            name: "content-type".into(),
            value: "application/json".into(),
        }],
        body: br#"{"id":"pay_1"}"#.to_vec(),
        body_ref: String::new(),
    }
}

fn request(dir: &Path, name: &str, selector: u8, message: &impl Message) {
    let mut bytes = vec![selector];
    message.encode(&mut bytes).expect("encode");
    write(dir, name, &bytes);
}

fn main() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = fuzz.parent().expect("repo root");
    let vectors = vectors(repo);

    // fingerprint: ignore_fields (one a line) NUL body.
    let out = dir(fuzz, "fingerprint");
    for v in &vectors {
        let mut bytes = Vec::new();
        if !v.ignore_fields.is_empty() {
            bytes.extend_from_slice(v.ignore_fields.join("\n").as_bytes());
            bytes.push(0);
        }
        bytes.extend_from_slice(&v.body);
        write(&out, &v.name, &bytes);
    }

    // validate: identities, tenant/endpoint/key triples, pointer lists.
    let out = dir(fuzz, "validate");
    for (name, text) in [
        ("key-uuid", "0b6f1a9e-3c1d-4f3e-9a55-2f1d7b7c9e01"),
        ("key-ulid", "01HV6Z6X8Q9T7M3K2J1H0G9F8E"),
        ("key-bad-char", "key with spaces/and:colons"),
        ("endpoint", "POST /v1/payments"),
        ("endpoint-control", "POST /v1/\u{7}payments"),
        ("unicode", "é\u{1F600}\u{200B}\u{FEFF}"),
        ("triple", "tenant-a\nPOST /v1/payments\nk-1"),
        ("triple-unicode", "t_1\nPUT /v1/ordres/é\nKEY_9"),
        ("pointers", "/client_ts\n/a~1b/0\n/~0tilde\n/items/10/nonce"),
        ("pointers-bad", "/ok\nno-slash\n/bad~2escape\n"),
        ("durations", "\u{1}\0\0\0\0\0\0\u{80}rest"),
    ] {
        write(&out, name, text.as_bytes());
    }
    for v in &vectors {
        if !v.ignore_fields.is_empty() {
            write(
                &out,
                &format!("pointers {}", v.name),
                v.ignore_fields.join("\n").as_bytes(),
            );
        }
    }

    // request_decode: selector byte (message type) then the encoded message.
    let out = dir(fuzz, "request_decode");
    for (i, v) in vectors.iter().enumerate().filter(|(i, _)| i % 4 == 0) {
        let claim = pb::ClaimRequest {
            endpoint: "POST /v1/payments".into(),
            key: format!("key-{i}"),
            fingerprint: Some(pb::claim_request::Fingerprint::Request(pb::HttpRequest {
                method: v.method.clone(),
                path: v.path.clone(),
                body: v.body.clone(),
                content_type: v.content_type.clone(),
                ignore_fields: v.ignore_fields.clone(),
            })),
            lease: duration(30_000),
            ttl: duration(86_400_000),
            wait: duration(1_500),
            attempt_id: "attempt-1".into(),
        };
        request(&out, &format!("claim {}", v.name), 0, &claim);
    }
    request(
        &out,
        "claim sha256",
        0,
        &pb::ClaimRequest {
            endpoint: "POST /v1/payments".into(),
            key: "k".into(),
            fingerprint: Some(pb::claim_request::Fingerprint::Sha256(vec![9; 32])),
            lease: duration(-1),
            ttl: None,
            wait: duration(0),
            attempt_id: String::new(),
        },
    );
    request(
        &out,
        "complete",
        1,
        &pb::CompleteRequest {
            endpoint: "POST /v1/payments".into(),
            key: "k-1".into(),
            lease_token: "0123456789abcdef0123456789abcdef".into(),
            response: Some(response()),
        },
    );
    request(
        &out,
        "fail",
        2,
        &pb::FailRequest {
            endpoint: "POST /v1/payments".into(),
            key: "k-1".into(),
            lease_token: "0123456789abcdef0123456789abcdef".into(),
            disposition: pb::Disposition::Unknown as i32,
            reason: "upstream timeout".into(),
        },
    );
    request(
        &out,
        "extend lease",
        3,
        &pb::ExtendLeaseRequest {
            endpoint: "POST /v1/payments".into(),
            key: "k-1".into(),
            lease_token: "0123456789abcdef0123456789abcdef".into(),
            lease: duration(60_000),
        },
    );
    request(
        &out,
        "lookup",
        4,
        &pb::LookupRequest {
            endpoint: "POST /v1/payments".into(),
            key: "k-1".into(),
            include_response: true,
        },
    );
    let record = codec::sample_record();
    request(
        &out,
        "list pending",
        5,
        &pb::ListPendingRequest {
            endpoint: "POST /v1/payments".into(),
            older_than: duration(5_000),
            page_size: 50,
            page_token: hex::encode(codec::pending_position(1_700_000_000_000, &record.id)),
        },
    );
    for (name, verdict) in [
        (
            "reconcile committed",
            pb::reconcile_request::Verdict::Committed(response()),
        ),
        (
            "reconcile released",
            pb::reconcile_request::Verdict::Released(pb::Released {}),
        ),
        (
            "reconcile failed",
            pb::reconcile_request::Verdict::Failed("card declined".into()),
        ),
        (
            "reconcile takeover",
            pb::reconcile_request::Verdict::Takeover(pb::Takeover {
                lease: duration(10_000),
            }),
        ),
    ] {
        request(
            &out,
            name,
            6,
            &pb::ReconcileRequest {
                endpoint: "POST /v1/payments".into(),
                key: "k-1".into(),
                verdict: Some(verdict),
            },
        );
    }
    request(
        &out,
        "list audit events",
        7,
        &pb::ListAuditEventsRequest {
            endpoint: "POST /v1/payments".into(),
            key: "k-1".into(),
            since: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5_000_000,
            }),
            page_size: 100,
            page_token: "1700000000005.42".into(),
        },
    );

    // record_codec: values and keys exactly as the embedded store writes them.
    let out = dir(fuzz, "record_codec");
    write(&out, "record completed", &codec::encode_record(&record));
    let mut pending = record.clone();
    pending.state = RecordState::InProgress;
    pending.response = None;
    pending.completed_at_ms = None;
    pending.reason = String::new();
    write(&out, "record in progress", &codec::encode_record(&pending));
    let mut unknown = pending.clone();
    unknown.state = RecordState::Unknown;
    unknown.reason = "timeout".into();
    write(&out, "record unknown", &codec::encode_record(&unknown));
    // Sealed under the fuzz keyring and the target's own record id (the
    // associated data binds the ciphertext to it), so the target opens it.
    let mut sealed = record.clone();
    sealed.id = RecordKey {
        tenant: "tenant-a".into(),
        endpoint: "POST /v1/payments".into(),
        key: "key-1".into(),
    };
    let keyring = idemd_fuzz::fuzz_keyring();
    let sealed_bytes =
        codec::encode_record_sealed(&sealed, Some(&keyring)).expect("seal the seed record");
    // What the target does with it: a seed that did not open would leave
    // the sealed branch unexercised without anyone noticing.
    let (_, envelope) =
        codec::decode_record_value(sealed.id.clone(), &sealed_bytes).expect("decode the seed");
    let opened = idemd::store::response::open(
        Some(&keyring),
        &sealed.id,
        &envelope.expect("the seed is sealed"),
    )
    .expect("the seed opens with the fuzz keyring");
    assert_eq!(
        Some(opened),
        sealed.response,
        "the seed opens to its response"
    );
    write(&out, "record sealed", &sealed_bytes);
    if let Some(response) = &record.response {
        write(&out, "response", &idemd::store::response::encode(response));
    }
    write(&out, "record key", &codec::record_key(&record.id));
    write(&out, "expiry key", &codec::expiry_key(40, &record.id));
    write(
        &out,
        "pending position",
        &codec::pending_position(-5, &record.id),
    );

    println!("wrote seed corpora under {}", fuzz.join("corpus").display());
}
