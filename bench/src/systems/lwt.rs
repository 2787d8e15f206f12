//! The raw-driver LWT baseline: idemd's own `INSERT … IF NOT EXISTS USING
//! TTL` and `UPDATE … IF state = ? AND lease_token = ? AND expires_at > ?`
//! on idemd's `records` table, through a session configured like idemd's,
//! so that P4 compares idemd-cql with the statements it cannot avoid.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlValue, Row};

use super::workload::{ClaimOutcome, ENDPOINT, FINGERPRINT, TTL_SECONDS, now_ms, stored_response};

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

    pub(super) async fn claim(&self, key: &str) -> Result<ClaimOutcome> {
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

    pub(super) async fn complete(&self, key: &str, token: &str) -> Result<()> {
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
