//! The one write of `records` that is not a lightweight transaction: a
//! record copied in from another store (`idemd copy-to-cql`,
//! [`crate::store::Store::import`]), written as it is with a plain
//! `INSERT … USING TTL` after a read found its key free.
//!
//! # Why not `INSERT … IF NOT EXISTS`
//!
//! A Paxos round costs a Cassandra node about four times the work of a
//! plain write (prepare, propose and commit each write `system.paxos`, and
//! read the row); copying a node's whole dedup window one LWT per record
//! took 1.4 ms of the node's CPU per record, about 1,000 records/s on the
//! test node (docs/benchmarks.md, "The cut-over to CQL"). The import runs
//! while no idemd serves the keyspace (the cut-over's order,
//! docs/deploy.md), so nothing can write a key between the read and the
//! write, and the atomicity of an LWT buys nothing there.
//!
//! # Why mixing it with the LWTs that follow is safe
//!
//! Plain writes and LWTs on the same row conflict only when they run at
//! the same time. The import's write is acknowledged at the regular
//! consistency (QUORUM) before any idemd starts, so the read phase of every
//! later LWT sees it, and every later LWT writes with a newer timestamp.
//! Retrying the write (a timeout, a copy run again) writes the same values.

use std::sync::Arc;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::super::session::{CqlOptions, unavailable};
use super::super::statements::{Preparer, idempotent};
use super::codec::{RECORD_COLUMNS, key_values, record_values, values};
use super::ttl_value;
use crate::crypto::Keyring;
use crate::store::{Record, StoreResult};

/// Writes copied records (see the module docs).
pub(in crate::store::cql) struct Importer {
    /// The store's session.
    session: Arc<Session>,
    /// `INSERT … USING TTL ?`, no condition; idempotent (same values on a
    /// retry), so the driver may retry it.
    insert: PreparedStatement,
    /// Seals the `response` column, as [`super::Records`] does.
    keyring: Option<Arc<Keyring>>,
}

impl Importer {
    /// Prepares the import's statement on `session`.
    pub(in crate::store::cql) async fn open(
        session: Arc<Session>,
        options: &CqlOptions,
        keyring: Option<Arc<Keyring>>,
    ) -> StoreResult<Self> {
        let preparer = Preparer::new(&session, &options.keyspace);
        let ks = preparer.keyspace;
        let mut insert = preparer
            .prepare(format!(
                "INSERT INTO {ks}.records (tenant, endpoint, key, {RECORD_COLUMNS}) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
            ))
            .await?;
        idempotent([&mut insert]);
        Ok(Self {
            session,
            insert,
            keyring,
        })
    }

    /// Writes `record` whole, with the TTL left of its window at `now_ms`.
    pub(in crate::store::cql) async fn write(
        &self,
        record: &Record,
        now_ms: i64,
    ) -> StoreResult<()> {
        let bound = values([
            key_values(&record.id),
            record_values(record, self.keyring.as_deref())?,
            ttl_value(record, now_ms),
        ]);
        self.session
            .execute_unpaged(&self.insert, bound)
            .await
            .map_err(|e| unavailable("import write", e))?;
        Ok(())
    }
}
