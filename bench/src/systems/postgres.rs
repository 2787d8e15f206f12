//! The Postgres-direct baseline: the article's `INSERT … ON CONFLICT DO
//! NOTHING RETURNING id`, then (when nothing was inserted) a `SELECT` of
//! the stored response; `UPDATE … SET state = 'completed'` to complete.

use anyhow::{Context, Result, bail};

use super::workload::{ClaimOutcome, ENDPOINT, FINGERPRINT, RESPONSE_BODY, TENANT_UUID};

/// The article's table (reference/baselines/postgres-seed-schema.sql).
pub const POSTGRES_SCHEMA: &str = include_str!("../../sql/postgres-schema.sql");

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

    pub(super) async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
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

    pub(super) async fn complete(&self, key: &str, worker: usize) -> Result<()> {
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
