//! The CQL backend: ScyllaDB (first) or Apache Cassandra, through the
//! `scylla` driver.
//!
//! # Data model
//!
//! One row per (tenant, endpoint, key) partition in `records`, written only
//! with lightweight transactions (Paxos): `INSERT … IF NOT EXISTS USING TTL`
//! for a claim, `UPDATE … USING TTL … IF state = ? AND lease_token = ? AND
//! expires_at > ?` for every transition, `DELETE … IF …` for a release. Every
//! rewrite writes the TTL left until the record's `expires_at`, so a record
//! never outlives its dedup window. See `migrations/` for the schema and the
//! reasons behind its table options.
//!
//! # Consistency
//!
//! One setting ([`CqlConsistency`]) picks QUORUM + SERIAL or LOCAL_QUORUM +
//! LOCAL_SERIAL for every statement: mixing serial levels is the classic way
//! to lose linearizability. Plain reads use the regular level; reads that
//! must see the outcome of in-flight Paxos rounds use the serial level.
//!
//! # Uncertain outcomes
//!
//! A CAS write timeout, a client timeout or a connection lost after sending
//! means the write may or may not have been applied. The store then reads the
//! row at SERIAL (which completes any in-flight Paxos round) and compares it
//! with what it tried to write: the random lease token makes "our write" and
//! "someone else's" distinguishable. Only a read that proves the write counts
//! as applied; if the row cannot be read, the caller gets
//! [`StoreError::Uncertain`], never a guess. The driver's default retry policy
//! never retries a CAS timeout and statements stay non-idempotent (no
//! speculative execution), so nothing retries an LWT blindly.
//!
//! # Encryption at rest
//!
//! With a keyring ([`CqlStore::open_with_keyring`]) the `response` blob is
//! sealed (see [`crate::crypto`]) with associated data binding it to the
//! row's (tenant, endpoint, key): a blob copied into another row fails to
//! decrypt. Blobs written in clear before encryption was turned on stay
//! readable. The other columns stay in clear: the LWT conditions, TTLs and
//! the pending index need them.
//!
//! # Pending index
//!
//! `pending_index` is written before the conditional write that makes a
//! record due, deleted eagerly after the write that makes it not due, and
//! verified against `records` on read (see the migration for the reasoning).
//! Nothing correctness-critical lives in one replica's memory, so any number
//! of idemd replicas can share a keyspace.

pub mod migrate;
pub mod rows;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError, WriteType};
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::CqlValue;

use super::embedded::codec;
use super::{
    CasOutcome, Expected, InsertOutcome, PendingPage, PendingQuery, Record, RecordKey, Store,
    StoreError, StoreResult,
};
use crate::crypto::{self, Keyring};
use rows::NamedRow;

/// Milliseconds in a day: the width of one pending-index partition.
const DAY_MS: i64 = 86_400_000;

/// How long an index entry may disagree with its record before it counts as
/// stale: longer than any statement can stay in flight (driver timeouts are
/// seconds), so an entry written just before a conditional write that has
/// not landed yet is never deleted under it.
const INDEX_GRACE_MS: i64 = 60_000;

/// Lower bound on the timeout of the SERIAL reads that resolve uncertain
/// writes, whatever the statement timeout.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

/// SERIAL read attempts when resolving one uncertain write.
const RESOLVE_ATTEMPTS: usize = 3;

/// Index entries examined per ListPending page beyond the page size.
const MAX_PENDING_SCAN_EXTRA: usize = 5_000;

const RECORD_COLUMNS: &str = "state, fingerprint, attempt, lease_token, attempt_id, created_at, \
     updated_at, lease_expires_at, completed_at, expires_at, response, reason";

/// Consistency of every statement: one choice, one serial level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CqlConsistency {
    /// QUORUM writes and reads, SERIAL for Paxos (one datacenter, or
    /// linearizable across datacenters at cross-DC latency).
    #[default]
    Quorum,
    /// LOCAL_QUORUM and LOCAL_SERIAL (multi-datacenter: each DC linearizable
    /// on its own; keys must be owned by one DC's callers).
    LocalQuorum,
}

impl CqlConsistency {
    fn regular(self) -> Consistency {
        match self {
            CqlConsistency::Quorum => Consistency::Quorum,
            CqlConsistency::LocalQuorum => Consistency::LocalQuorum,
        }
    }

    fn serial(self) -> SerialConsistency {
        match self {
            CqlConsistency::Quorum => SerialConsistency::Serial,
            CqlConsistency::LocalQuorum => SerialConsistency::LocalSerial,
        }
    }

    /// The consistency of a read that must see in-flight Paxos rounds.
    fn serial_read(self) -> Consistency {
        match self {
            CqlConsistency::Quorum => Consistency::Serial,
            CqlConsistency::LocalQuorum => Consistency::LocalSerial,
        }
    }
}

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct CqlOptions {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    /// Keyspace holding the tables (created by `idemd migrate`).
    pub keyspace: String,
    /// Username for password authentication.
    pub username: Option<String>,
    /// Password for password authentication.
    pub password: Option<String>,
    /// PEM CA bundle: enables TLS to the cluster.
    pub tls_ca: Option<PathBuf>,
    /// Consistency of every statement.
    pub consistency: CqlConsistency,
    /// Preferred (local) datacenter for load balancing.
    pub local_datacenter: Option<String>,
    /// Client-side timeout of each statement.
    pub request_timeout: Duration,
    /// Client-side timeout of conditional (Paxos) writes, when it should
    /// differ from `request_timeout`. When it fires, the write's outcome is
    /// resolved by a SERIAL read.
    pub lwt_timeout: Option<Duration>,
    /// The longest ttl any policy allows: how far back ListPending looks.
    pub max_ttl: Duration,
}

impl CqlOptions {
    /// Options for a local test cluster.
    pub fn local(keyspace: &str) -> Self {
        Self {
            nodes: vec!["127.0.0.1:9042".to_string()],
            keyspace: keyspace.to_string(),
            username: None,
            password: None,
            tls_ca: None,
            consistency: CqlConsistency::Quorum,
            local_datacenter: None,
            request_timeout: Duration::from_secs(5),
            lwt_timeout: None,
            max_ttl: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

fn unavailable(context: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{context}: {error}"))
}

/// Keyspace names are interpolated into CQL: only plain identifiers.
pub fn validate_keyspace(keyspace: &str) -> Result<(), String> {
    let valid = !keyspace.is_empty()
        && keyspace.len() <= 48
        && keyspace.starts_with(|c: char| c.is_ascii_alphabetic())
        && keyspace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{keyspace:?} is not a valid keyspace name (letter, then letters, digits or '_', at most 48)"
        ))
    }
}

fn tls_config(path: &std::path::Path) -> Result<Arc<rustls::ClientConfig>, StoreError> {
    let pem = std::fs::read(path)
        .map_err(|e| unavailable(&format!("cannot read CQL CA bundle {}", path.display()), e))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| unavailable("invalid certificate in CQL CA bundle", e))?;
        roots
            .add(cert)
            .map_err(|e| unavailable("unusable certificate in CQL CA bundle", e))?;
    }
    if roots.is_empty() {
        return Err(StoreError::Unavailable(format!(
            "no certificates in CQL CA bundle {}",
            path.display()
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| unavailable("TLS configuration", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Connects a session with the options' consistency, timeouts, TLS and
/// credentials.
pub async fn connect(options: &CqlOptions) -> StoreResult<Session> {
    let mut policy = DefaultPolicy::builder();
    if let Some(datacenter) = &options.local_datacenter {
        policy = policy.prefer_datacenter(datacenter.clone());
    }
    let profile = ExecutionProfile::builder()
        .consistency(options.consistency.regular())
        .serial_consistency(Some(options.consistency.serial()))
        .request_timeout(Some(options.request_timeout))
        .load_balancing_policy(policy.build())
        .build();
    let mut builder = SessionBuilder::new()
        .known_nodes(&options.nodes)
        .connection_timeout(Duration::from_secs(5))
        .default_execution_profile_handle(profile.into_handle());
    if let (Some(user), Some(password)) = (&options.username, &options.password) {
        builder = builder.user(user.clone(), password.clone());
    }
    if let Some(ca) = &options.tls_ca {
        builder = builder.tls_context(Some(tls_config(ca)?));
    }
    builder.build().await.map_err(|e| {
        unavailable(
            &format!("cannot connect to CQL nodes {}", options.nodes.join(",")),
            e,
        )
    })
}

/// The prepared statements of the store.
struct Statements {
    select: PreparedStatement,
    select_serial: PreparedStatement,
    insert: PreparedStatement,
    replace: PreparedStatement,
    replace_expired: PreparedStatement,
    delete: PreparedStatement,
    index_put: PreparedStatement,
    index_delete: PreparedStatement,
    index_scan: PreparedStatement,
}

impl Statements {
    async fn prepare(session: &Session, options: &CqlOptions) -> StoreResult<Self> {
        let ks = &options.keyspace;
        let prepare = |cql: String| async move {
            session.prepare(cql).await.map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot prepare statements on keyspace {ks} (has `idemd migrate` run?): {e}"
                ))
            })
        };
        let key_filter = "WHERE tenant = ? AND endpoint = ? AND key = ?";
        let select = prepare(format!(
            "SELECT {RECORD_COLUMNS} FROM {ks}.records {key_filter}"
        ))
        .await?;
        let mut select_serial = select.clone();
        select_serial.set_consistency(options.consistency.serial_read());
        select_serial.set_request_timeout(Some(options.request_timeout.max(RESOLVE_TIMEOUT)));
        let set_all = "state = ?, fingerprint = ?, attempt = ?, lease_token = ?, attempt_id = ?, \
             created_at = ?, updated_at = ?, lease_expires_at = ?, completed_at = ?, \
             expires_at = ?, response = ?, reason = ?";
        let mut statements = Self {
            select,
            select_serial,
            insert: prepare(format!(
                "INSERT INTO {ks}.records (tenant, endpoint, key, {RECORD_COLUMNS}) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS USING TTL ?"
            ))
            .await?,
            replace: prepare(format!(
                "UPDATE {ks}.records USING TTL ? SET {set_all} {key_filter} \
                 IF state = ? AND lease_token = ? AND expires_at > ?"
            ))
            .await?,
            replace_expired: prepare(format!(
                "UPDATE {ks}.records USING TTL ? SET {set_all} {key_filter} IF expires_at <= ?"
            ))
            .await?,
            delete: prepare(format!(
                "DELETE FROM {ks}.records {key_filter} \
                 IF state = ? AND lease_token = ? AND expires_at > ?"
            ))
            .await?,
            index_put: prepare(format!(
                "INSERT INTO {ks}.pending_index (tenant, day, due_at, endpoint, key) \
                 VALUES (?, ?, ?, ?, ?) USING TTL ?"
            ))
            .await?,
            index_delete: prepare(format!(
                "DELETE FROM {ks}.pending_index \
                 WHERE tenant = ? AND day = ? AND due_at = ? AND endpoint = ? AND key = ?"
            ))
            .await?,
            index_scan: prepare(format!(
                "SELECT due_at, endpoint, key FROM {ks}.pending_index \
                 WHERE tenant = ? AND day = ? AND (due_at, endpoint, key) > (?, ?, ?) \
                 AND (due_at) <= (?) LIMIT ?"
            ))
            .await?,
        };
        if let Some(timeout) = options.lwt_timeout {
            for statement in [
                &mut statements.insert,
                &mut statements.replace,
                &mut statements.replace_expired,
                &mut statements.delete,
            ] {
                statement.set_request_timeout(Some(timeout));
            }
        }
        Ok(statements)
    }
}

/// Counters of the backend, for tests and metrics.
#[derive(Debug, Default)]
pub struct CqlStats {
    /// Writes whose outcome was uncertain (then resolved or reported).
    pub uncertain_writes: AtomicU64,
    /// Uncertain writes that could not be resolved.
    pub unresolved_writes: AtomicU64,
}

/// The CQL backend.
pub struct CqlStore {
    /// Shared driver session (connection pools, routing).
    session: Arc<Session>,
    /// Prepared once at start.
    statements: Statements,
    /// How far back ListPending looks, in days.
    max_ttl_days: i64,
    /// Counters.
    stats: Arc<CqlStats>,
    /// Seals and opens the `response` column; `None` writes it in clear.
    keyring: Option<Arc<Keyring>>,
}

impl std::fmt::Debug for CqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqlStore").finish_non_exhaustive()
    }
}

/// Whether a failed statement may have been applied.
enum Failure {
    /// Rejected before it could apply (not sent, refused, invalid).
    NotApplied(StoreError),
    /// Sent and not confirmed: resolve by reading.
    Maybe(String),
}

fn classify(error: ExecutionError) -> Failure {
    let text = error.to_string();
    match &error {
        ExecutionError::BadQuery(_)
        | ExecutionError::EmptyPlan
        | ExecutionError::PrepareError(_)
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::UseKeyspaceError(_) => Failure::NotApplied(StoreError::Unavailable(text)),
        ExecutionError::LastAttemptError(attempt) => match attempt {
            RequestAttemptError::SerializationError(_)
            | RequestAttemptError::CqlRequestSerialization(_)
            | RequestAttemptError::UnableToAllocStreamId => {
                Failure::NotApplied(StoreError::Unavailable(text))
            }
            RequestAttemptError::DbError(db, _) => match db {
                // A CAS timeout is the textbook uncertain outcome.
                DbError::WriteTimeout {
                    write_type: WriteType::Cas,
                    ..
                }
                | DbError::WriteFailure {
                    write_type: WriteType::Cas,
                    ..
                } => Failure::Maybe(text),
                // At the serial level nothing was proposed; at the regular
                // level the Paxos commit (learn) phase failed: committed
                // somewhere, so read to find out.
                DbError::Unavailable {
                    consistency: Consistency::Serial | Consistency::LocalSerial,
                    ..
                } => Failure::NotApplied(StoreError::Unavailable(text)),
                DbError::SyntaxError
                | DbError::Invalid
                | DbError::AlreadyExists { .. }
                | DbError::FunctionFailure { .. }
                | DbError::AuthenticationError
                | DbError::Unauthorized
                | DbError::ConfigError
                | DbError::Overloaded
                | DbError::IsBootstrapping
                | DbError::TruncateError => Failure::NotApplied(StoreError::Unavailable(text)),
                _ => Failure::Maybe(text),
            },
            _ => Failure::Maybe(text),
        },
        _ => Failure::Maybe(text),
    }
}

fn ttl_seconds(expires_at_ms: i64, now_ms: i64) -> i32 {
    let remaining_ms = (expires_at_ms - now_ms).max(1);
    // Round up: the row must outlive expires_at; reads hide it from then on.
    i32::try_from((remaining_ms + 999) / 1000).unwrap_or(i32::MAX)
}

pub(crate) fn day_of(instant_ms: i64) -> i32 {
    i32::try_from(instant_ms.div_euclid(DAY_MS)).unwrap_or(i32::MAX)
}

fn attempt_value(record: &Record) -> i32 {
    i32::try_from(record.attempt).unwrap_or(i32::MAX)
}

/// Bound values of one statement. Plain tuples stop at 16 elements and do
/// not flatten, and a conditional update binds 19 values.
type Values = Vec<Option<CqlValue>>;

fn text_value(value: &str) -> Option<CqlValue> {
    Some(CqlValue::Text(value.to_string()))
}

/// The primary key columns.
fn key_values(id: &RecordKey) -> Values {
    vec![
        text_value(&id.tenant),
        text_value(&id.endpoint),
        text_value(&id.key),
    ]
}

/// The record columns in `RECORD_COLUMNS` order, the response sealed when
/// there is a keyring.
fn record_values(record: &Record, keyring: Option<&Keyring>) -> StoreResult<Values> {
    let response = match &record.response {
        Some(response) => Some(CqlValue::Blob(
            crypto::seal_response(keyring, &record.id, response)
                .map_err(|e| StoreError::Unavailable(e.to_string()))?,
        )),
        None => None,
    };
    Ok(vec![
        text_value(record.state.as_str()),
        Some(CqlValue::Blob(record.fingerprint.clone())),
        Some(CqlValue::Int(attempt_value(record))),
        text_value(&record.lease_token),
        text_value(&record.attempt_id),
        Some(CqlValue::BigInt(record.created_at_ms)),
        Some(CqlValue::BigInt(record.updated_at_ms)),
        Some(CqlValue::BigInt(record.lease_expires_at_ms)),
        record.completed_at_ms.map(CqlValue::BigInt),
        Some(CqlValue::BigInt(record.expires_at_ms)),
        response,
        text_value(&record.reason),
    ])
}

/// Concatenates groups of bound values.
fn values(groups: impl IntoIterator<Item = Values>) -> Values {
    groups.into_iter().flatten().collect()
}

/// Whether `current` is exactly the state `written` put there: the fields a
/// transition changes, with the random lease token telling our write from
/// any other.
fn is_our_write(current: &Record, written: &Record) -> bool {
    current.state == written.state
        && current.lease_token == written.lease_token
        && current.attempt == written.attempt
        && current.updated_at_ms == written.updated_at_ms
        && current.lease_expires_at_ms == written.lease_expires_at_ms
        && current.fingerprint == written.fingerprint
}

impl CqlStore {
    /// Connects and prepares; fails with a clear message when the schema is
    /// missing (run `idemd migrate`).
    pub async fn open(options: &CqlOptions) -> StoreResult<Self> {
        Self::open_with_keyring(options, None).await
    }

    /// Like [`CqlStore::open`], sealing stored responses with `keyring`
    /// (see the module docs).
    pub async fn open_with_keyring(
        options: &CqlOptions,
        keyring: Option<Arc<Keyring>>,
    ) -> StoreResult<Self> {
        validate_keyspace(&options.keyspace).map_err(StoreError::Unavailable)?;
        let session = connect(options).await?;
        let statements = Statements::prepare(&session, options).await?;
        let max_ttl_days = i64::try_from(options.max_ttl.as_millis())
            .unwrap_or(i64::MAX)
            .div_euclid(DAY_MS)
            + 2;
        Ok(Self {
            session: Arc::new(session),
            statements,
            max_ttl_days,
            stats: Arc::new(CqlStats::default()),
            keyring,
        })
    }

    /// Counters (uncertain writes).
    pub fn stats(&self) -> &CqlStats {
        &self.stats
    }

    async fn read(&self, id: &RecordKey, serial: bool) -> StoreResult<Option<Record>> {
        let statement = if serial {
            &self.statements.select_serial
        } else {
            &self.statements.select
        };
        let result = self
            .session
            .execute_unpaged(statement, (&id.tenant, &id.endpoint, &id.key))
            .await
            .map_err(|e| unavailable("read", e))?;
        let rows = rows::named_rows(result)?;
        match rows.first() {
            None => Ok(None),
            Some(row) => rows::record_from_row(id, row, self.keyring.as_deref()),
        }
    }

    /// SERIAL read after an uncertain write, retried a few times.
    async fn resolve_read(&self, id: &RecordKey, why: &str) -> StoreResult<Option<Record>> {
        self.stats.uncertain_writes.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(crate::metrics::STORE_UNCERTAIN, "backend" => "cql").increment(1);
        let mut last_error = String::new();
        for attempt in 0..RESOLVE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            match self.read(id, true).await {
                Ok(record) => return Ok(record),
                Err(error) => last_error = error.to_string(),
            }
        }
        self.stats.unresolved_writes.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            backend = "cql",
            cause = why,
            "uncertain write could not be resolved"
        );
        Err(StoreError::Uncertain(format!(
            "{why}; the verifying SERIAL read failed too: {last_error}"
        )))
    }

    async fn conditional(
        &self,
        statement: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<(bool, Option<NamedRow>), Failure> {
        let result = self
            .session
            .execute_unpaged(statement, values)
            .await
            .map_err(classify)?;
        let rows = rows::named_rows(result).map_err(Failure::NotApplied)?;
        let Some(row) = rows.into_iter().next() else {
            return Err(Failure::NotApplied(StoreError::Corrupt(
                "conditional statement returned no row".to_string(),
            )));
        };
        let applied = rows::applied(&row).map_err(Failure::NotApplied)?;
        Ok((applied, Some(row)))
    }

    async fn index_put(&self, record: &Record, now_ms: i64) -> StoreResult<()> {
        let Some(due) = record.pending_since_ms() else {
            return Ok(());
        };
        self.session
            .execute_unpaged(
                &self.statements.index_put,
                (
                    &record.id.tenant,
                    day_of(due),
                    due,
                    &record.id.endpoint,
                    &record.id.key,
                    ttl_seconds(record.expires_at_ms, now_ms),
                ),
            )
            .await
            .map_err(|e| unavailable("pending index write", e))?;
        Ok(())
    }

    /// Best effort: a failure only leaves a stale entry, which readers skip
    /// and delete later.
    async fn index_delete(&self, id: &RecordKey, due: i64) {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.index_delete,
                (&id.tenant, day_of(due), due, &id.endpoint, &id.key),
            )
            .await;
        if let Err(error) = result {
            tracing::debug!(%error, "pending index cleanup failed; left for lazy removal");
        }
    }

    /// After a write that replaced `old` by `new` (or deleted it): drop the
    /// index entry that no longer describes the record.
    async fn index_after_write(&self, old: Option<&Record>, new: Option<&Record>) {
        let old_due = old.and_then(Record::pending_since_ms);
        let new_due = new.and_then(Record::pending_since_ms);
        if let (Some(old_due), Some(old)) = (old_due, old)
            && Some(old_due) != new_due
        {
            self.index_delete(&old.id, old_due).await;
        }
    }

    async fn try_insert(&self, record: &Record, now_ms: i64) -> StoreResult<Option<InsertOutcome>> {
        let id = &record.id;
        let bound = values([
            key_values(id),
            record_values(record, self.keyring.as_deref())?,
            vec![Some(CqlValue::Int(ttl_seconds(
                record.expires_at_ms,
                now_ms,
            )))],
        ]);
        match self.conditional(&self.statements.insert, bound).await {
            Ok((true, _)) => Ok(Some(InsertOutcome::Inserted)),
            Ok((false, row)) => {
                let existing = match row
                    .as_ref()
                    .map(|row| rows::record_from_row(id, row, self.keyring.as_deref()))
                {
                    Some(Ok(Some(existing))) => Some(existing),
                    _ => self.read(id, true).await?,
                };
                match existing {
                    Some(existing) if existing.is_live(now_ms) => {
                        Ok(Some(InsertOutcome::Exists(existing)))
                    }
                    // The row is logically expired but its TTL has not run
                    // out yet: overwrite it conditionally.
                    Some(expired) => self.replace_expired(record, &expired, now_ms).await,
                    // Gone between the insert and the read: try again.
                    None => Ok(None),
                }
            }
            Err(Failure::NotApplied(error)) => Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                Some(current) if is_our_write(&current, record) => {
                    Ok(Some(InsertOutcome::Inserted))
                }
                Some(current) if current.is_live(now_ms) => {
                    Ok(Some(InsertOutcome::Exists(current)))
                }
                // Not applied (a SERIAL read completes in-flight rounds):
                // safe to try again.
                _ => Ok(None),
            },
        }
    }

    async fn replace_expired(
        &self,
        record: &Record,
        expired: &Record,
        now_ms: i64,
    ) -> StoreResult<Option<InsertOutcome>> {
        let id = &record.id;
        let bound = values([
            vec![Some(CqlValue::Int(ttl_seconds(
                record.expires_at_ms,
                now_ms,
            )))],
            record_values(record, self.keyring.as_deref())?,
            key_values(id),
            vec![Some(CqlValue::BigInt(now_ms))],
        ]);
        match self
            .conditional(&self.statements.replace_expired, bound)
            .await
        {
            Ok((true, _)) => {
                self.index_after_write(Some(expired), Some(record)).await;
                Ok(Some(InsertOutcome::Inserted))
            }
            Ok((false, _)) => Ok(None),
            Err(Failure::NotApplied(error)) => Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                Some(current) if is_our_write(&current, record) => {
                    Ok(Some(InsertOutcome::Inserted))
                }
                _ => Ok(None),
            },
        }
    }
}

/// How many times an insert is retried when the row vanished or expired
/// between statements.
const INSERT_ROUNDS: usize = 5;

#[async_trait]
impl Store for CqlStore {
    fn backend_name(&self) -> &'static str {
        "cql"
    }

    async fn get(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
        Ok(self.read(id, false).await?.filter(|r| r.is_live(now_ms)))
    }

    async fn insert_if_absent(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        // Index first: a crash after this leaves an extra entry, never a
        // record that ListPending cannot find.
        self.index_put(record, now_ms).await?;
        for _ in 0..INSERT_ROUNDS {
            if let Some(outcome) = self.try_insert(record, now_ms).await? {
                if let (InsertOutcome::Exists(_), Some(due)) = (&outcome, record.pending_since_ms())
                {
                    self.index_delete(&record.id, due).await;
                }
                return Ok(outcome);
            }
        }
        Err(StoreError::Unavailable(
            "the key kept changing between statements; nothing was claimed".to_string(),
        ))
    }

    async fn replace_if(
        &self,
        record: &Record,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let id = &record.id;
        self.index_put(record, now_ms).await?;
        let bound = values([
            vec![Some(CqlValue::Int(ttl_seconds(
                record.expires_at_ms,
                now_ms,
            )))],
            record_values(record, self.keyring.as_deref())?,
            key_values(id),
            vec![
                text_value(expected.state.as_str()),
                text_value(&expected.lease_token),
                Some(CqlValue::BigInt(now_ms)),
            ],
        ]);
        let applied = match self.conditional(&self.statements.replace, bound).await {
            Ok((applied, _)) => applied,
            Err(Failure::NotApplied(error)) => return Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                Some(current) if is_our_write(&current, record) => true,
                current => {
                    return Ok(CasOutcome::Conflict {
                        current: current.filter(|r| r.is_live(now_ms)),
                    });
                }
            },
        };
        if applied {
            if expected.pending_since_ms != record.pending_since_ms()
                && let Some(old_due) = expected.pending_since_ms
            {
                self.index_delete(id, old_due).await;
            }
            return Ok(CasOutcome::Applied);
        }
        // Not applied: the result may not carry the row (Cassandra returns
        // only the condition columns), so read it at SERIAL.
        let current = self.read(id, true).await?;
        Ok(CasOutcome::Conflict {
            current: current.filter(|r| r.is_live(now_ms)),
        })
    }

    async fn delete_if(
        &self,
        id: &RecordKey,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let values = (
            &id.tenant,
            &id.endpoint,
            &id.key,
            expected.state.as_str(),
            &expected.lease_token,
            now_ms,
        );
        let applied = match self.conditional(&self.statements.delete, values).await {
            Ok((applied, _)) => applied,
            Err(Failure::NotApplied(error)) => return Err(error),
            Err(Failure::Maybe(why)) => match self.resolve_read(id, &why).await? {
                // Gone: our delete (only the token holder may delete).
                None => true,
                Some(current) if current.is_live(now_ms) && expected.is_met_by(&current) => {
                    // Provably not applied; the caller may retry.
                    return Ok(CasOutcome::Conflict {
                        current: Some(current),
                    });
                }
                current => {
                    return Ok(CasOutcome::Conflict {
                        current: current.filter(|r| r.is_live(now_ms)),
                    });
                }
            },
        };
        if applied {
            if let Some(old_due) = expected.pending_since_ms {
                self.index_delete(id, old_due).await;
            }
            return Ok(CasOutcome::Applied);
        }
        let current = self.read(id, true).await?;
        Ok(CasOutcome::Conflict {
            current: current.filter(|r| r.is_live(now_ms)),
        })
    }

    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage> {
        let today = day_of(now_ms);
        let oldest = day_of(now_ms) - i32::try_from(self.max_ttl_days).unwrap_or(i32::MAX);
        let (mut day, mut cursor) = match &query.page_token {
            Some(token) => decode_token(token).ok_or(StoreError::InvalidPageToken)?,
            None => (oldest, (i64::MIN, String::new(), String::new())),
        };
        if day < oldest {
            day = oldest;
            cursor = (i64::MIN, String::new(), String::new());
        }
        let mut page = PendingPage::default();
        let mut scanned = 0usize;
        let scan_limit = query.page_size.saturating_add(MAX_PENDING_SCAN_EXTRA);
        let fetch = i32::try_from(query.page_size.clamp(50, 1000)).unwrap_or(1000);
        while day <= today {
            let result = self
                .session
                .execute_unpaged(
                    &self.statements.index_scan,
                    (
                        &query.tenant,
                        day,
                        cursor.0,
                        &cursor.1,
                        &cursor.2,
                        now_ms,
                        fetch,
                    ),
                )
                .await
                .map_err(|e| unavailable("pending index read", e))?;
            let entries = rows::named_rows(result)?;
            let exhausted = entries.len() < usize::try_from(fetch).unwrap_or(usize::MAX);
            let mut parsed = Vec::with_capacity(entries.len());
            for entry in &entries {
                parsed.push(index_entry(entry)?);
            }
            // Verify the entries against the records, concurrently.
            let checks = parsed.iter().map(|(due, endpoint, key)| {
                let id = RecordKey {
                    tenant: query.tenant.clone(),
                    endpoint: endpoint.clone(),
                    key: key.clone(),
                };
                async move {
                    let record = self.read(&id, false).await;
                    (*due, id, record)
                }
            });
            for (due, id, record) in futures::future::join_all(checks).await {
                cursor = (due, id.endpoint.clone(), id.key.clone());
                scanned += 1;
                let record = record?.filter(|r| r.is_live(now_ms));
                match classify_entry(due, record.as_ref(), now_ms) {
                    EntryVerdict::Pending => {
                        let record = record.ok_or_else(|| {
                            StoreError::Corrupt("pending entry without record".to_string())
                        })?;
                        let endpoint_ok = query
                            .endpoint
                            .as_ref()
                            .is_none_or(|e| *e == record.id.endpoint);
                        let age_ok = query
                            .created_at_or_before_ms
                            .is_none_or(|limit| record.created_at_ms <= limit);
                        if endpoint_ok && age_ok {
                            page.records.push(record);
                        }
                    }
                    EntryVerdict::Stale => self.index_delete(&id, due).await,
                    EntryVerdict::Keep => {}
                }
                if page.records.len() >= query.page_size || scanned >= scan_limit {
                    page.next_page_token = Some(encode_token(day, &cursor));
                    return Ok(page);
                }
            }
            if exhausted {
                day += 1;
                cursor = (i64::MIN, String::new(), String::new());
            }
        }
        Ok(page)
    }

    async fn sweep_expired(&self, _now_ms: i64, _max_records: usize) -> StoreResult<usize> {
        // Native TTL removes expired rows; reads already hide them.
        Ok(0)
    }

    async fn close(&self) -> StoreResult<()> {
        // Every write is acknowledged by the cluster before it returns;
        // nothing is buffered here.
        Ok(())
    }
}

/// What an index entry says about its record.
#[derive(Debug, PartialEq, Eq)]
enum EntryVerdict {
    /// The record is due and this is its entry.
    Pending,
    /// The entry no longer describes the record: delete it.
    Stale,
    /// Not due, but a write may be in flight: leave it.
    Keep,
}

fn classify_entry(due: i64, record: Option<&Record>, now_ms: i64) -> EntryVerdict {
    let old_enough = due < now_ms - INDEX_GRACE_MS;
    match record {
        Some(record) if record.state == super::RecordState::Completed => EntryVerdict::Stale,
        Some(record) => match record.pending_since_ms() {
            Some(since) if since == due && record.needs_decision(now_ms) => EntryVerdict::Pending,
            // The record moved past this entry (a later due instant, written
            // before the write that set it).
            Some(since) if since > due => EntryVerdict::Stale,
            _ if old_enough => EntryVerdict::Stale,
            _ => EntryVerdict::Keep,
        },
        // Absent: released, expired, or a claim still in flight.
        None if old_enough => EntryVerdict::Stale,
        None => EntryVerdict::Keep,
    }
}

fn index_entry(row: &NamedRow) -> StoreResult<(i64, String, String)> {
    let bad = || StoreError::Corrupt("malformed pending index entry".to_string());
    let due = match row.get("due_at") {
        Some(Some(CqlValue::BigInt(due))) => *due,
        _ => return Err(bad()),
    };
    let text = |name: &str| match row.get(name) {
        Some(Some(CqlValue::Text(value))) => Ok(value.clone()),
        _ => Err(bad()),
    };
    Ok((due, text("endpoint")?, text("key")?))
}

fn encode_token(day: i32, cursor: &(i64, String, String)) -> Vec<u8> {
    let id = RecordKey {
        tenant: String::new(),
        endpoint: cursor.1.clone(),
        key: cursor.2.clone(),
    };
    let mut out = day.to_be_bytes().to_vec();
    out.extend_from_slice(&codec::pending_position(cursor.0, &id));
    out
}

fn decode_token(token: &[u8]) -> Option<(i32, (i64, String, String))> {
    let (day, rest) = token.split_first_chunk::<4>()?;
    let (due, id) = codec::decode_pending_position("", rest).ok()?;
    Some((i32::from_be_bytes(*day), (due, id.endpoint, id.key)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RecordState;

    fn record(state: RecordState, lease: i64, updated: i64) -> Record {
        Record {
            id: RecordKey {
                tenant: "t".into(),
                endpoint: "e".into(),
                key: "k".into(),
            },
            state,
            fingerprint: vec![],
            attempt: 1,
            lease_token: "tok".into(),
            attempt_id: String::new(),
            created_at_ms: 0,
            updated_at_ms: updated,
            lease_expires_at_ms: lease,
            completed_at_ms: None,
            expires_at_ms: i64::MAX,
            response: None,
            reason: String::new(),
        }
    }

    #[test]
    fn index_entries_are_verified_against_records() {
        let now = 1_000_000;
        let expired_lease = record(RecordState::InProgress, 900_000, 0);
        assert_eq!(
            classify_entry(900_000, Some(&expired_lease), now),
            EntryVerdict::Pending
        );
        // An older lease entry after ExtendLease moved it.
        let extended = record(RecordState::InProgress, 990_000, 0);
        assert_eq!(
            classify_entry(900_000, Some(&extended), now),
            EntryVerdict::Stale
        );
        // An entry written for an extension whose write has not landed yet.
        let not_yet = record(RecordState::InProgress, 800_000, 0);
        assert_eq!(
            classify_entry(999_000, Some(&not_yet), now),
            EntryVerdict::Keep
        );
        assert_eq!(
            classify_entry(999_000 - INDEX_GRACE_MS - 1, Some(&not_yet), now + 200_000),
            EntryVerdict::Stale
        );
        let done = record(RecordState::Completed, 900_000, 950_000);
        assert_eq!(
            classify_entry(900_000, Some(&done), now),
            EntryVerdict::Stale
        );
        let unknown = record(RecordState::Unknown, 900_000, 950_000);
        assert_eq!(
            classify_entry(950_000, Some(&unknown), now),
            EntryVerdict::Pending
        );
        assert_eq!(
            classify_entry(900_000, Some(&unknown), now),
            EntryVerdict::Stale
        );
        // Absent record: a claim may be in flight, unless the entry is old.
        assert_eq!(classify_entry(999_000, None, now), EntryVerdict::Keep);
        assert_eq!(
            classify_entry(now - INDEX_GRACE_MS - 1, None, now),
            EntryVerdict::Stale
        );
    }

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let cursor = (123_456, "POST /x".to_string(), "k-1".to_string());
        assert_eq!(
            decode_token(&encode_token(20_000, &cursor)),
            Some((20_000, cursor))
        );
        assert_eq!(decode_token(&[1, 2]), None);
        assert_eq!(decode_token(&[0, 0, 0, 1, 9]), None);
    }

    #[test]
    fn ttl_covers_the_remaining_window() {
        assert_eq!(ttl_seconds(10_000, 0), 10);
        assert_eq!(ttl_seconds(10_001, 0), 11);
        assert_eq!(ttl_seconds(5, 10), 1, "never zero (zero means no TTL)");
    }

    #[test]
    fn keyspace_names_are_identifiers() {
        assert!(validate_keyspace("idemd_prod").is_ok());
        assert!(validate_keyspace("1bad").is_err());
        assert!(validate_keyspace("bad;drop").is_err());
        assert!(validate_keyspace("").is_err());
    }
}
