//! The systems under test, behind one client type with two operations:
//! `claim` (take a key, or learn that it is taken or completed) and
//! `complete` (store the response of a claimed key).
//!
//! Every workload is written once against [`Client`], so idemd, the no-op
//! server and the three direct-store baselines run exactly the same loop;
//! only the statements differ. Each baseline issues what a team rolling its
//! own would issue:
//!
//! * Postgres: the article's `INSERT … ON CONFLICT DO NOTHING RETURNING id`,
//!   then (when nothing was inserted) a `SELECT` of the stored response;
//!   `UPDATE … SET state = 'completed'` to complete.
//! * Redis: `SET key v NX EX ttl GET` (claim, and the old value in the same
//!   round trip when the key exists), `SET key v XX KEEPTTL` to complete.
//! * raw LWT: idemd's own `INSERT … IF NOT EXISTS USING TTL` and
//!   `UPDATE … IF state = ? AND lease_token = ? AND expires_at > ?` on idemd's
//!   `records` table, through a session configured like idemd's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlValue, Row};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// gRPC (idemd, no-op)
// ---------------------------------------------------------------------------

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

    async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
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

    async fn complete(&self, key: &str, token: &str, worker: usize) -> Result<()> {
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

// ---------------------------------------------------------------------------
// HTTP/JSON (idemd --http-listen)
// ---------------------------------------------------------------------------

/// One HTTP/1.1 keep-alive connection: one request at a time.
type HttpConnection =
    tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>>;

/// Client of idemd's HTTP/JSON port over `connections` HTTP/1.1
/// connections (one request at a time each, so this is its parallelism,
/// as for Postgres).
pub struct Http {
    connections: Vec<HttpConnection>,
    /// `host:port`, for the Host header.
    authority: String,
    /// The fixed fingerprint, base64 (proto3 JSON `bytes`).
    sha256: String,
}

impl Http {
    /// Opens `connections` connections to `address`.
    pub async fn connect(address: std::net::SocketAddr, connections: usize) -> Result<Self> {
        use base64::Engine as _;
        let mut opened = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            let stream = tokio::net::TcpStream::connect(address)
                .await
                .with_context(|| format!("connecting to {address}"))?;
            stream.set_nodelay(true)?;
            let (sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .context("HTTP/1.1 handshake")?;
            tokio::spawn(connection);
            opened.push(tokio::sync::Mutex::new(sender));
        }
        Ok(Self {
            connections: opened,
            authority: address.to_string(),
            sha256: base64::engine::general_purpose::STANDARD.encode(FINGERPRINT),
        })
    }

    async fn post(
        &self,
        path: &str,
        body: serde_json::Value,
        worker: usize,
    ) -> Result<serde_json::Value> {
        use http_body_util::BodyExt as _;
        let request = hyper::Request::post(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header("x-tenant-id", "bench")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                serde_json::to_vec(&body)?,
            )))?;
        let mut sender = self.connections[worker % self.connections.len()]
            .lock()
            .await;
        sender.ready().await.context("HTTP connection closed")?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        drop(sender);
        if !status.is_success() {
            bail!("{path}: {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(serde_json::from_slice(&bytes)?)
    }

    async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
        let body = serde_json::json!({"endpoint": ENDPOINT, "key": key, "sha256": self.sha256});
        let response = self.post("/v1/claim", body, worker).await?;
        if let Some(token) = response["claimed"]["leaseToken"].as_str() {
            return Ok(ClaimOutcome::Won(token.to_string()));
        }
        if response.get("replayed").is_some() {
            return Ok(ClaimOutcome::Replayed);
        }
        if response.get("inProgress").is_some() || response.get("pending").is_some() {
            return Ok(ClaimOutcome::Busy);
        }
        bail!("claim of {key} answered {response}")
    }

    async fn complete(&self, key: &str, token: &str, worker: usize) -> Result<()> {
        use base64::Engine as _;
        let body = serde_json::json!({
            "endpoint": ENDPOINT,
            "key": key,
            "leaseToken": token,
            "response": {
                "status": 201,
                "headers": [{"name": "content-type", "value": "application/json"}],
                "body": base64::engine::general_purpose::STANDARD.encode(RESPONSE_BODY),
            },
        });
        self.post("/v1/complete", body, worker).await.map(drop)
    }
}

// ---------------------------------------------------------------------------
// Postgres-direct
// ---------------------------------------------------------------------------

/// The article's table (reference/baselines/postgres-seed-schema.sql).
pub const POSTGRES_SCHEMA: &str = include_str!("../sql/postgres-schema.sql");

struct PgConnection {
    client: tokio_postgres::Client,
    claim: tokio_postgres::Statement,
    lookup: tokio_postgres::Statement,
    complete: tokio_postgres::Statement,
}

/// A fixed pool of Postgres connections; worker `w` uses connection
/// `w % n`, so several in-flight operations pipeline on one connection the
/// way a pool under load would queue them.
pub struct Postgres {
    connections: Vec<PgConnection>,
}

impl Postgres {
    /// Recreates the table (so every run starts from the same state).
    pub async fn reset_schema(conninfo: &str) -> Result<()> {
        let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
            .await
            .context("connecting to postgres")?;
        let driver = tokio::spawn(connection);
        client
            .batch_execute("DROP TABLE IF EXISTS idempotency_keys")
            .await?;
        client.batch_execute(POSTGRES_SCHEMA).await?;
        drop(client);
        let _ = driver.await;
        Ok(())
    }

    /// Opens `connections` connections and prepares the statements on each.
    pub async fn connect(conninfo: &str, connections: usize) -> Result<Self> {
        let mut out = Vec::new();
        for _ in 0..connections.max(1) {
            let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
                .await
                .context("connecting to postgres")?;
            // A connection error (the server stopping at the end of the
            // bench) surfaces as an error of the next query; nothing to log.
            tokio::spawn(connection);
            // The pgbench script's statements, with the key and fingerprint
            // as parameters instead of pgbench variables.
            let claim = client
                .prepare(&format!(
                    "INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, \
                     state, expires_at, locked_until) VALUES ('{TENANT_UUID}', '{ENDPOINT}', $1, $2, \
                     'in_progress', now() + interval '24 hours', now() + interval '60 seconds') \
                     ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING RETURNING id"
                ))
                .await?;
            let lookup = client
                .prepare(&format!(
                    "SELECT state, response_status, response_body, response_headers::text \
                     FROM idempotency_keys WHERE tenant_id = '{TENANT_UUID}' \
                     AND endpoint = '{ENDPOINT}' AND idem_key = $1"
                ))
                .await?;
            let complete = client
                .prepare(&format!(
                    "UPDATE idempotency_keys SET state = 'completed', response_status = 201, \
                     response_body = $2, response_headers = '{{\"content-type\":\"application/json\"}}' \
                     WHERE tenant_id = '{TENANT_UUID}' AND endpoint = '{ENDPOINT}' AND idem_key = $1"
                ))
                .await?;
            out.push(PgConnection {
                client,
                claim,
                lookup,
                complete,
            });
        }
        Ok(Self { connections: out })
    }

    fn connection(&self, worker: usize) -> &PgConnection {
        &self.connections[worker % self.connections.len()]
    }

    async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
        let c = self.connection(worker);
        let fingerprint: &[u8] = &FINGERPRINT;
        if let Some(row) = c.client.query_opt(&c.claim, &[&key, &fingerprint]).await? {
            let id: i64 = row.try_get(0)?;
            return Ok(ClaimOutcome::Won(id.to_string()));
        }
        // Conflict: read what is there (the replay path of the article).
        let Some(row) = c.client.query_opt(&c.lookup, &[&key]).await? else {
            // Deleted between the two statements: nobody holds it now.
            return Ok(ClaimOutcome::Busy);
        };
        let state: String = row.try_get(0)?;
        if state == "completed" {
            let _body: Option<Vec<u8>> = row.try_get(2)?;
            Ok(ClaimOutcome::Replayed)
        } else {
            Ok(ClaimOutcome::Busy)
        }
    }

    async fn complete(&self, key: &str, worker: usize) -> Result<()> {
        let c = self.connection(worker);
        let updated = c
            .client
            .execute(&c.complete, &[&key, &RESPONSE_BODY])
            .await?;
        if updated != 1 {
            bail!("complete updated {updated} rows for {key}");
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Redis-direct
// ---------------------------------------------------------------------------

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

    async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
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

    async fn complete(&self, key: &str, worker: usize) -> Result<()> {
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

// ---------------------------------------------------------------------------
// raw-driver LWT
// ---------------------------------------------------------------------------

/// Tenant of the raw-LWT rows: never collides with idemd's own.
const LWT_TENANT: &str = "bench-raw-lwt";

const RECORD_COLUMNS: &str = "state, fingerprint, attempt, lease_token, attempt_id, created_at, \
     updated_at, lease_expires_at, completed_at, expires_at, response, reason";

/// idemd's claim and complete statements, straight on the driver.
pub struct Lwt {
    session: Arc<Session>,
    insert: PreparedStatement,
    update: PreparedStatement,
    response: Vec<u8>,
    /// `raw-lwt-indexed`: the pending index's writes idemd adds per pair.
    index: Option<IndexStatements>,
}

/// The pending index's entry and its delete, as idemd writes them
/// (`pending_buckets`, migration 3).
struct IndexStatements {
    put: PreparedStatement,
    delete: PreparedStatement,
}

/// Lease of the raw claims (the index entry's due instant is its end).
const LWT_LEASE_MS: i64 = 60_000;

/// The index partition of a raw claim: its bucket of due instants and a
/// shard from the key, as idemd spreads them (the exact hash does not
/// matter for the cost, only that keys spread over the shards).
fn index_slot(key: &str, due: i64) -> (i64, i32) {
    let bucket = due.div_euclid(idemd::store::cql::BUCKET_MS);
    let hash = key
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let shards = idemd::store::cql::SHARDS.unsigned_abs();
    (bucket, i32::try_from(hash % shards).unwrap_or(0))
}

impl Lwt {
    /// Connects exactly as idemd does (`idemd::store::cql::connect`: QUORUM,
    /// SERIAL, same timeouts and load balancing) and prepares the statements
    /// of `src/store/cql/mod.rs` against idemd's keyspace (migrated first).
    /// With `indexed`, also the pending index's put and delete per pair.
    pub async fn connect(nodes: &[String], keyspace: &str, indexed: bool) -> Result<Self> {
        let mut options = idemd::store::cql::CqlOptions::local(keyspace);
        options.nodes = nodes.to_vec();
        let session = idemd::store::cql::connect(&options)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let key_filter = "WHERE tenant = ? AND endpoint = ? AND key = ?";
        let set_all = "state = ?, fingerprint = ?, attempt = ?, lease_token = ?, attempt_id = ?, \
             created_at = ?, updated_at = ?, lease_expires_at = ?, completed_at = ?, \
             expires_at = ?, response = ?, reason = ?";
        let insert = session
            .prepare(format!(
                "INSERT INTO {keyspace}.records (tenant, endpoint, key, {RECORD_COLUMNS}) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS USING TTL ?"
            ))
            .await
            .context("preparing the LWT insert (has `idemd migrate` run?)")?;
        let update = session
            .prepare(format!(
                "UPDATE {keyspace}.records USING TTL ? SET {set_all} {key_filter} \
                 IF state = ? AND lease_token = ? AND expires_at > ?"
            ))
            .await?;
        let index = if indexed {
            let mut put = session
                .prepare(format!(
                    "INSERT INTO {keyspace}.pending_buckets \
                     (tenant, bucket, shard, due_at, endpoint, key) \
                     VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
                ))
                .await?;
            let mut delete = session
                .prepare(format!(
                    "DELETE FROM {keyspace}.pending_buckets WHERE tenant = ? AND bucket = ? \
                     AND shard = ? AND due_at = ? AND endpoint = ? AND key = ?"
                ))
                .await?;
            put.set_is_idempotent(true);
            delete.set_is_idempotent(true);
            Some(IndexStatements { put, delete })
        } else {
            None
        };
        let response = prost::Message::encode_to_vec(&stored_response());
        Ok(Self {
            session: Arc::new(session),
            insert,
            update,
            response,
            index,
        })
    }

    fn text(value: &str) -> Option<CqlValue> {
        Some(CqlValue::Text(value.to_string()))
    }

    async fn claim(&self, key: &str) -> Result<ClaimOutcome> {
        let now = now_ms();
        // The claim instant leads the token: the indexed complete finds the
        // entry's due instant from it, as idemd does from its record.
        let token = format!("{now:016x}{:032x}", rand::random::<u128>());
        if let Some(index) = &self.index {
            let due = now + LWT_LEASE_MS;
            let (bucket, shard) = index_slot(key, due);
            self.session
                .execute_unpaged(
                    &index.put,
                    (
                        LWT_TENANT,
                        bucket,
                        shard,
                        due,
                        ENDPOINT,
                        key,
                        TTL_SECONDS as i32,
                    ),
                )
                .await?;
        }
        let values: Vec<Option<CqlValue>> = vec![
            Self::text(LWT_TENANT),
            Self::text(ENDPOINT),
            Self::text(key),
            Self::text("in_progress"),
            Some(CqlValue::Blob(FINGERPRINT.to_vec())),
            Some(CqlValue::Int(1)),
            Self::text(&token),
            Self::text(""),
            Some(CqlValue::BigInt(now)),
            Some(CqlValue::BigInt(now)),
            Some(CqlValue::BigInt(now + LWT_LEASE_MS)),
            None,
            Some(CqlValue::BigInt(now + TTL_SECONDS * 1000)),
            None,
            Self::text(""),
            Some(CqlValue::Int(TTL_SECONDS as i32)),
        ];
        let result = self.session.execute_unpaged(&self.insert, values).await?;
        let (applied, state) = lwt_result(result)?;
        Ok(if applied {
            ClaimOutcome::Won(token)
        } else if state.as_deref() == Some("completed") {
            ClaimOutcome::Replayed
        } else {
            ClaimOutcome::Busy
        })
    }

    async fn complete(&self, key: &str, token: &str) -> Result<()> {
        let now = now_ms();
        let values: Vec<Option<CqlValue>> = vec![
            Some(CqlValue::Int(TTL_SECONDS as i32)),
            Self::text("completed"),
            Some(CqlValue::Blob(FINGERPRINT.to_vec())),
            Some(CqlValue::Int(1)),
            Self::text(token),
            Self::text(""),
            Some(CqlValue::BigInt(now)),
            Some(CqlValue::BigInt(now)),
            Some(CqlValue::BigInt(0)),
            Some(CqlValue::BigInt(now)),
            Some(CqlValue::BigInt(now + TTL_SECONDS * 1000)),
            Some(CqlValue::Blob(self.response.clone())),
            Self::text(""),
            Self::text(LWT_TENANT),
            Self::text(ENDPOINT),
            Self::text(key),
            Self::text("in_progress"),
            Self::text(token),
            Some(CqlValue::BigInt(now)),
        ];
        let result = self.session.execute_unpaged(&self.update, values).await?;
        let (applied, _) = lwt_result(result)?;
        if !applied {
            bail!("conditional complete of {key} was not applied");
        }
        if let Some(index) = &self.index {
            // Off the reply path, as idemd does it.
            let claimed_at = token
                .get(..16)
                .and_then(|hex| i64::from_str_radix(hex, 16).ok())
                .context("raw-lwt-indexed token without its claim instant")?;
            let due = claimed_at + LWT_LEASE_MS;
            let (bucket, shard) = index_slot(key, due);
            let session = Arc::clone(&self.session);
            let delete = index.delete.clone();
            let key = key.to_string();
            tokio::spawn(async move {
                let _ = session
                    .execute_unpaged(&delete, (LWT_TENANT, bucket, shard, due, ENDPOINT, key))
                    .await;
            });
        }
        Ok(())
    }
}

/// `[applied]` and, when present, the `state` column of an LWT result.
/// Cassandra returns `[applied]` alone when applied and the existing row
/// when an `IF NOT EXISTS` fails, so columns are looked up by name.
fn lwt_result(
    result: scylla::response::query_result::QueryResult,
) -> Result<(bool, Option<String>)> {
    let rows = result.into_rows_result()?;
    let names: Vec<String> = rows
        .column_specs()
        .iter()
        .map(|spec| spec.name().to_string())
        .collect();
    let Some(row) = rows.rows::<Row>()?.next() else {
        bail!("conditional statement returned no row");
    };
    let row = row?;
    let mut applied = None;
    let mut state = None;
    for (name, value) in names.iter().zip(row.columns) {
        match (name.as_str(), value) {
            ("[applied]", Some(CqlValue::Boolean(b))) => applied = Some(b),
            ("state", Some(CqlValue::Text(s) | CqlValue::Ascii(s))) => state = Some(s),
            _ => {}
        }
    }
    let applied = applied.ok_or_else(|| anyhow!("LWT result without [applied]"))?;
    Ok((applied, state))
}
