//! Embedded audit log: `audit.redb` in the data directory.
//!
//! A file of its own rather than tables in the records' database: audit
//! appends then never lengthen the records' group commits, and the two can
//! be copied, kept or deleted independently (the audit log has its own
//! retention).
//!
//! Tables (keys are byte strings built so that byte order is time order):
//! * `events`: `time` → the event as JSON. `time` is 16 bytes, `at_ms` and
//!   `event_id` big-endian with the sign bit flipped. Time order across
//!   tenants is what the retention sweep walks.
//! * `by_tenant`: `tenant · time` → (): a tenant's timeline.
//! * `by_key`: `tenant · endpoint · key_sha256 · time` → (): one key's history.
//!
//! Strings in keys are length-prefixed (u16 BE), so `ab` and `a`+`b…` never
//! share a prefix. One writer thread (the store's group commit,
//! [`crate::store::embedded::group`]) batches whatever appends are waiting
//! into one durable (fsynced) transaction; a sweep is a transaction of its
//! own, in queue order between them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::log::{AuditCursor, AuditEvent, AuditLog, AuditQuery, retention_ms};
use crate::store::StoreError;
use crate::store::embedded::group::{Batcher, GroupCommit};

/// File name inside the data directory.
pub const AUDIT_FILE: &str = "audit.redb";

const EVENTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("events");
const BY_TENANT: TableDefinition<&[u8], ()> = TableDefinition::new("by_tenant");
const BY_KEY: TableDefinition<&[u8], ()> = TableDefinition::new("by_key");

/// Appends waiting beyond this make callers wait for room (backpressure
/// instead of unbounded memory); a batch takes everything queued.
const QUEUE_DEPTH: usize = 4096;

/// An append's caller, answered once its events are durable.
type AppendReply = oneshot::Sender<Result<(), StoreError>>;

/// A write queued for the writer thread, with its caller's reply channel.
enum Request {
    /// Events to append; consecutive appends share one transaction.
    Append(Vec<AuditEvent>, AppendReply),
    /// One bounded sweep (see [`AuditLog::sweep`]).
    Sweep {
        /// Events before it go.
        cutoff_ms: i64,
        /// Most events removed.
        batch: usize,
        /// The caller.
        done: oneshot::Sender<Result<usize, StoreError>>,
    },
}

/// The embedded audit log.
#[derive(Debug)]
pub struct EmbeddedAuditLog {
    /// Read transactions run on it directly; writes go through the writer.
    database: Arc<Database>,
    /// The writer thread and its queue, closed on close so that every
    /// accepted append is committed.
    writer: GroupCommit<Request>,
    /// How long events are kept.
    retention: Duration,
}

/// [`crate::store::embedded::storage_error`], naming the audit log.
fn storage_error(context: &str, error: impl std::fmt::Display) -> StoreError {
    crate::store::embedded::storage_error(&format!("audit log: {context}"), error)
}

fn ordered(value: i64) -> [u8; 8] {
    ((value as u64) ^ (1 << 63)).to_be_bytes()
}

fn time_key(cursor: AuditCursor) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&ordered(cursor.at_ms));
    key[8..].copy_from_slice(&ordered(cursor.event_id));
    key
}

fn push_str(key: &mut Vec<u8>, value: &str) {
    let len = u16::try_from(value.len()).unwrap_or(u16::MAX);
    key.extend_from_slice(&len.to_be_bytes());
    key.extend_from_slice(&value.as_bytes()[..usize::from(len)]);
}

fn tenant_prefix(tenant: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + tenant.len() + 16);
    push_str(&mut key, tenant);
    key
}

fn key_prefix(tenant: &str, endpoint: &str, key_sha256: &str) -> Vec<u8> {
    let mut key = tenant_prefix(tenant);
    push_str(&mut key, endpoint);
    push_str(&mut key, key_sha256);
    key
}

fn with_time(prefix: &[u8], cursor: AuditCursor) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&time_key(cursor));
    key
}

/// The event's entries in `by_tenant` and `by_key`.
fn index_keys(event: &AuditEvent) -> (Vec<u8>, Vec<u8>) {
    (
        with_time(&tenant_prefix(&event.tenant), event.cursor()),
        with_time(
            &key_prefix(&event.tenant, &event.endpoint, &event.key_sha256),
            event.cursor(),
        ),
    )
}

impl EmbeddedAuditLog {
    /// Opens (creating if needed) `audit.redb` in `data_dir`.
    pub fn open(data_dir: &Path, retention: Duration) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| storage_error(&format!("create {}", data_dir.display()), e))?;
        let path = data_dir.join(AUDIT_FILE);
        let database = Database::create(&path)
            .map_err(|e| storage_error(&format!("open {}", path.display()), e))?;
        let txn = database
            .begin_write()
            .map_err(|e| storage_error("begin", e))?;
        {
            txn.open_table(EVENTS)
                .map_err(|e| storage_error("open", e))?;
            txn.open_table(BY_TENANT)
                .map_err(|e| storage_error("open", e))?;
            txn.open_table(BY_KEY)
                .map_err(|e| storage_error("open", e))?;
        }
        txn.commit().map_err(|e| storage_error("commit", e))?;
        let database = Arc::new(database);
        let writer = GroupCommit::start(
            "idemd-audit-writer",
            "audit log writer",
            QUEUE_DEPTH,
            QUEUE_DEPTH,
            |_| {
                Ok(Writer {
                    database: Arc::clone(&database),
                })
            },
        )?;
        Ok(Self {
            database,
            writer,
            retention,
        })
    }
}

/// The audit log's batcher: the only writer of `audit.redb`.
struct Writer {
    /// The audit database.
    database: Arc<Database>,
}

impl Batcher for Writer {
    type Item = Request;

    /// In queue order: each run of appends in one durable transaction (the
    /// group commit: they ride the same fsync), each sweep in its own.
    fn write(&mut self, batch: &mut Vec<Request>) {
        let mut appends = Vec::new();
        for request in batch.drain(..) {
            match request {
                Request::Append(events, done) => appends.push((events, done)),
                Request::Sweep {
                    cutoff_ms,
                    batch,
                    done,
                } => {
                    self.append(&mut appends);
                    let _ = done.send(sweep(&self.database, cutoff_ms, batch));
                }
            }
        }
        self.append(&mut appends);
    }
}

impl Writer {
    /// Appends the events of `appends` in one transaction and answers each.
    fn append(&self, appends: &mut Vec<(Vec<AuditEvent>, AppendReply)>) {
        if appends.is_empty() {
            return;
        }
        let result = append_all(
            &self.database,
            appends.iter().flat_map(|(events, _)| events),
        );
        for (_, done) in appends.drain(..) {
            let _ = done.send(result.clone());
        }
    }
}

fn append_all<'a>(
    database: &Database,
    events: impl Iterator<Item = &'a AuditEvent>,
) -> Result<(), StoreError> {
    let txn = database
        .begin_write()
        .map_err(|e| storage_error("begin", e))?;
    {
        let mut table = txn
            .open_table(EVENTS)
            .map_err(|e| storage_error("open", e))?;
        let mut by_tenant = txn
            .open_table(BY_TENANT)
            .map_err(|e| storage_error("open", e))?;
        let mut by_key = txn
            .open_table(BY_KEY)
            .map_err(|e| storage_error("open", e))?;
        for event in events {
            let json = serde_json::to_vec(event).map_err(|e| storage_error("encode", e))?;
            let time = time_key(event.cursor());
            table
                .insert(time.as_slice(), json.as_slice())
                .map_err(|e| storage_error("insert", e))?;
            let (tenant_entry, key_entry) = index_keys(event);
            by_tenant
                .insert(tenant_entry.as_slice(), ())
                .map_err(|e| storage_error("insert", e))?;
            by_key
                .insert(key_entry.as_slice(), ())
                .map_err(|e| storage_error("insert", e))?;
        }
    }
    txn.commit().map_err(|e| storage_error("commit", e))
}

fn decode(bytes: &[u8]) -> Result<AuditEvent, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(format!("audit event: {e}")))
}

/// Removes up to `batch` events before `cutoff_ms`, in one transaction:
/// the appends queued behind it wait until it ends, so the caller picks a
/// small batch and calls again for more.
fn sweep(database: &Database, cutoff_ms: i64, batch: usize) -> Result<usize, StoreError> {
    let txn = database
        .begin_write()
        .map_err(|e| storage_error("begin", e))?;
    let removed;
    {
        let mut table = txn
            .open_table(EVENTS)
            .map_err(|e| storage_error("open", e))?;
        let end = time_key(AuditCursor {
            at_ms: cutoff_ms,
            event_id: i64::MIN,
        });
        let mut doomed = Vec::new();
        for entry in table
            .range(..end.as_slice())
            .map_err(|e| storage_error("range", e))?
            .take(batch)
        {
            let (time, value) = entry.map_err(|e| storage_error("read", e))?;
            doomed.push((time.value().to_vec(), decode(value.value())?));
        }
        let mut by_tenant = txn
            .open_table(BY_TENANT)
            .map_err(|e| storage_error("open", e))?;
        let mut by_key = txn
            .open_table(BY_KEY)
            .map_err(|e| storage_error("open", e))?;
        for (time, event) in &doomed {
            table
                .remove(time.as_slice())
                .map_err(|e| storage_error("remove", e))?;
            let (tenant_entry, key_entry) = index_keys(event);
            by_tenant
                .remove(tenant_entry.as_slice())
                .map_err(|e| storage_error("remove", e))?;
            by_key
                .remove(key_entry.as_slice())
                .map_err(|e| storage_error("remove", e))?;
        }
        removed = doomed.len();
    }
    txn.commit().map_err(|e| storage_error("commit", e))?;
    Ok(removed)
}

fn list(
    database: &Database,
    query: &AuditQuery,
    retention: Duration,
) -> Result<Vec<AuditEvent>, StoreError> {
    let oldest = AuditCursor::before(query.now_ms.saturating_sub(retention_ms(retention)));
    let after = query.after.max(oldest);
    let (prefix, index) = match (&query.endpoint, &query.key_sha256) {
        (Some(endpoint), Some(key)) => (key_prefix(&query.tenant, endpoint, key), BY_KEY),
        _ => (tenant_prefix(&query.tenant), BY_TENANT),
    };
    let txn = database
        .begin_read()
        .map_err(|e| storage_error("begin", e))?;
    let index = txn
        .open_table(index)
        .map_err(|e| storage_error("open", e))?;
    let events = txn
        .open_table(EVENTS)
        .map_err(|e| storage_error("open", e))?;
    let start = with_time(&prefix, after);
    let mut found = Vec::new();
    for entry in index
        .range(start.as_slice()..)
        .map_err(|e| storage_error("range", e))?
    {
        let (key, _) = entry.map_err(|e| storage_error("read", e))?;
        let key = key.value();
        if !key.starts_with(&prefix) || key.len() != prefix.len() + 16 {
            break;
        }
        let time = &key[prefix.len()..];
        let Some(value) = events.get(time).map_err(|e| storage_error("get", e))? else {
            // An index entry whose event a concurrent sweep just removed.
            continue;
        };
        let event = decode(value.value())?;
        if event.cursor() <= after {
            continue;
        }
        if query
            .endpoint
            .as_ref()
            .is_some_and(|endpoint| *endpoint != event.endpoint)
        {
            continue;
        }
        found.push(event);
        if found.len() >= query.limit {
            break;
        }
    }
    Ok(found)
}

#[async_trait]
impl AuditLog for EmbeddedAuditLog {
    fn backend_name(&self) -> &'static str {
        "embedded"
    }

    async fn append(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        self.writer
            .send(Request::Append(events.to_vec(), done))
            .await?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn list(&self, query: &AuditQuery) -> Result<Vec<AuditEvent>, StoreError> {
        let database = Arc::clone(&self.database);
        let query = query.clone();
        let retention = self.retention;
        tokio::task::spawn_blocking(move || list(&database, &query, retention))
            .await
            .map_err(|e| storage_error("read task", e))?
    }

    async fn sweep(&self, now_ms: i64, batch: usize) -> Result<usize, StoreError> {
        let (done, answer) = oneshot::channel();
        self.writer
            .send(Request::Sweep {
                cutoff_ms: now_ms.saturating_sub(retention_ms(self.retention)),
                batch,
                done,
            })
            .await?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn close(&self) -> Result<(), StoreError> {
        // The writer commits the queued appends, then exits.
        self.writer.close().await
    }
}
