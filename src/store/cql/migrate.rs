//! Schema migrations for the CQL backend (`idemd migrate`).
//!
//! Migrations are the files in `migrations/` (compiled into the binary),
//! applied in version order. Each is recorded in `schema_migrations` with a
//! lightweight transaction, so that several pods racing at deploy time apply
//! each migration once: the pod whose `INSERT … IF NOT EXISTS` wins applies
//! it and marks it `applied`; the others wait for that mark. Every statement
//! is itself idempotent (`IF NOT EXISTS`), so a winner that dies mid-way
//! leaves nothing a rerun cannot finish: a claim left `applying` for longer
//! than [`STALE_CLAIM`] is taken over with another LWT.
//!
//! The keyspace is created first with the replication given on the command
//! line. On ScyllaDB with tablets, LWT needs a release that supports it
//! (`LWT_WITH_TABLETS`); otherwise the keyspace is created with tablets
//! disabled. Cassandra has no tablets and rejects the option, so it is only
//! added when the cluster advertises the `TABLETS` feature.

use std::time::Duration;

use scylla::client::session::Session;
use scylla::response::query_result::QueryResult;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use super::pending::legacy::{LegacyIndex, LegacyReport};
use super::session::rows;
use super::session::{CqlOptions, connect, validate_keyspace};
use crate::store::StoreError;

/// One migration: version, name, CQL (statements separated by `;`, with
/// `{keyspace}` for the keyspace name).
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in increasing order; never reused.
    pub version: i32,
    /// File name without the version and extension.
    pub name: &'static str,
    /// The file's text.
    pub cql: &'static str,
}

/// Every migration, in order. A test checks this list against `migrations/`.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "records",
        cql: include_str!("../../../migrations/0001_records.cql"),
    },
    Migration {
        version: 2,
        name: "audit",
        cql: include_str!("../../../migrations/0002_audit.cql"),
    },
    Migration {
        version: 3,
        name: "pending_buckets",
        cql: include_str!("../../../migrations/0003_pending_buckets.cql"),
    },
    Migration {
        version: 4,
        name: "cutover",
        cql: include_str!("../../../migrations/0004_cutover.cql"),
    },
];

/// The migration that replaced `pending_index`: from it on, every run also
/// copies what older releases wrote there ([`LegacyIndex::copy_all`]; the
/// replicas' sealers copy what old replicas write after it).
const BUCKETED_PENDING_INDEX: i32 = 3;

/// A claim on a migration older than this is considered abandoned (its
/// owner died) and may be taken over.
pub const STALE_CLAIM: Duration = Duration::from_secs(300);

/// Client-side timeout for schema statements. Schema changes are applied
/// on every node and flushed to disk before the coordinator answers, which
/// takes seconds on a busy or freshly started node: the store's request
/// timeout (sized for single-partition LWTs) would report a change as
/// failed while it is still being applied. Every DDL statement is
/// idempotent, so a rerun after a genuine timeout is safe.
pub const DDL_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs one schema statement with [`DDL_TIMEOUT`].
pub async fn execute_ddl(session: &Session, cql: impl Into<String>) -> Result<(), String> {
    let mut statement = scylla::statement::unprepared::Statement::new(cql.into());
    statement.set_request_timeout(Some(DDL_TIMEOUT));
    session
        .query_unpaged(statement, ())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// What `idemd migrate` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Versions this run applied.
    pub applied: Vec<i32>,
    /// Versions found already applied (by this or another run).
    pub already_applied: Vec<i32>,
    /// What the copy of migration 1's pending index found and copied.
    pub legacy_pending: Option<LegacyReport>,
}

/// Splits a migration into statements: `;`-separated, `--` comments dropped.
pub fn statements(cql: &str, keyspace: &str) -> Vec<String> {
    let without_comments: String = cql
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    without_comments
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.replace("{keyspace}", keyspace))
        .collect()
}

fn unavailable(context: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{context}: {error}"))
}

async fn supported_features(session: &Session) -> Vec<String> {
    // ScyllaDB lists its cluster features here; Cassandra has no such
    // column and fails the query, which means "no tablets".
    let Ok(result) = session
        .query_unpaged("SELECT supported_features FROM system.local", ())
        .await
    else {
        return Vec::new();
    };
    let Ok(rows) = rows::named_rows(result) else {
        return Vec::new();
    };
    match rows.first().and_then(|row| row.get("supported_features")) {
        Some(Some(CqlValue::Text(features))) => {
            features.split(',').map(|f| f.trim().to_string()).collect()
        }
        _ => Vec::new(),
    }
}

/// The `CREATE KEYSPACE` statement for this cluster.
pub fn create_keyspace_cql(keyspace: &str, replication: &str, features: &[String]) -> String {
    let has = |name: &str| features.iter().any(|f| f == name);
    let tablets = if has("TABLETS") && !has("LWT_WITH_TABLETS") {
        " AND tablets = {'enabled': false}"
    } else {
        ""
    };
    format!(
        "CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication} AND durable_writes = true{tablets}"
    )
}

/// Creates the keyspace and applies pending migrations. `owner` names this
/// run in `schema_migrations` (host and process id).
pub async fn run(
    options: &CqlOptions,
    replication: &str,
    owner: &str,
) -> Result<MigrationReport, StoreError> {
    run_to(options, replication, owner, i32::MAX).await
}

/// [`run`], applying migrations up to version `last` only: how the upgrade
/// tests build a keyspace as an older release left it.
pub async fn run_to(
    options: &CqlOptions,
    replication: &str,
    owner: &str,
    last: i32,
) -> Result<MigrationReport, StoreError> {
    validate_keyspace(&options.keyspace).map_err(StoreError::Unavailable)?;
    let session = connect(options).await?;
    let keyspace = &options.keyspace;
    let features = supported_features(&session).await;
    execute_ddl(
        &session,
        create_keyspace_cql(keyspace, replication, &features),
    )
    .await
    .map_err(|e| unavailable("create keyspace", e))?;
    execute_ddl(
        &session,
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.schema_migrations (\
             version int PRIMARY KEY, name text, state text, owner text, \
             claimed_at bigint, applied_at bigint)"
        ),
    )
    .await
    .map_err(|e| unavailable("create schema_migrations", e))?;
    session
        .await_schema_agreement()
        .await
        .map_err(|e| unavailable("schema agreement", e))?;

    let ledger = Ledger::prepare(&session, keyspace, options).await?;
    let mut report = MigrationReport::default();
    for migration in MIGRATIONS.iter().filter(|m| m.version <= last) {
        let mine = ledger.claim(&session, migration, owner).await?;
        if !mine {
            tracing::info!(
                version = migration.version,
                name = migration.name,
                "migration already applied"
            );
            report.already_applied.push(migration.version);
            continue;
        }
        for statement in statements(migration.cql, keyspace) {
            execute_ddl(&session, statement)
                .await
                .map_err(|e| unavailable(&format!("migration {}", migration.version), e))?;
        }
        session
            .await_schema_agreement()
            .await
            .map_err(|e| unavailable("schema agreement", e))?;
        session
            .execute_unpaged(&ledger.finish, (now_ms(), migration.version, owner))
            .await
            .map_err(|e| unavailable("record migration", e))?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            owner,
            "migration applied"
        );
        report.applied.push(migration.version);
    }
    if last >= BUCKETED_PENDING_INDEX {
        let grace = i64::try_from(options.seal_grace.as_millis()).unwrap_or(i64::MAX);
        let copied = LegacyIndex::prepare(&session, keyspace)
            .await?
            .copy_all(&session, grace, now_ms())
            .await?;
        if copied.entries > 0 {
            tracing::info!(
                partitions = copied.partitions,
                entries = copied.entries,
                copied = copied.copied,
                "pending entries of an older release copied to the bucketed index"
            );
        }
        report.legacy_pending = Some(copied);
    }
    Ok(report)
}

/// The statements on `schema_migrations`, the ledger that makes one run
/// apply each migration while concurrent runs (every replica of a rollout
/// starts with `migrate`) wait for it.
struct Ledger {
    /// Claims a migration: inserts its row as `applying` if none exists.
    claim: PreparedStatement,
    /// Takes an abandoned claim over (its owner stopped before finishing).
    take_over: PreparedStatement,
    /// Marks a migration applied, if this run still owns it.
    finish: PreparedStatement,
    /// Reads a migration's state at serial consistency.
    read: PreparedStatement,
}

impl Ledger {
    async fn prepare(
        session: &Session,
        keyspace: &str,
        options: &CqlOptions,
    ) -> Result<Self, StoreError> {
        let prepare = |cql: String| async move {
            session
                .prepare(cql)
                .await
                .map_err(|e| unavailable("prepare", e))
        };
        let claim = prepare(format!(
            "INSERT INTO {keyspace}.schema_migrations (version, name, state, owner, claimed_at) \
             VALUES (?, ?, 'applying', ?, ?) IF NOT EXISTS"
        ))
        .await?;
        let take_over = prepare(format!(
            "UPDATE {keyspace}.schema_migrations SET owner = ?, claimed_at = ? \
             WHERE version = ? IF state = 'applying' AND owner = ? AND claimed_at = ?"
        ))
        .await?;
        let finish = prepare(format!(
            "UPDATE {keyspace}.schema_migrations SET state = 'applied', applied_at = ? \
             WHERE version = ? IF owner = ?"
        ))
        .await?;
        let mut read = prepare(format!(
            "SELECT state, owner, claimed_at FROM {keyspace}.schema_migrations WHERE version = ?"
        ))
        .await?;
        read.set_consistency(options.consistency.serial_read());
        Ok(Self {
            claim,
            take_over,
            finish,
            read,
        })
    }

    /// Whether this run (`owner`) is to apply `migration`: it claimed it,
    /// or took over a claim abandoned for [`STALE_CLAIM`]. `false` once
    /// another run applied it; an error when another run holds it past
    /// the wait.
    async fn claim(
        &self,
        session: &Session,
        migration: &Migration,
        owner: &str,
    ) -> Result<bool, StoreError> {
        let result = session
            .execute_unpaged(
                &self.claim,
                (migration.version, migration.name, owner, now_ms()),
            )
            .await
            .map_err(|e| unavailable("claim migration", e))?;
        if applied(result)? {
            return Ok(true);
        }
        // Someone else claimed it: wait for it to be applied, or take over
        // an abandoned claim.
        let deadline = tokio::time::Instant::now() + STALE_CLAIM + Duration::from_secs(60);
        loop {
            let result = session
                .execute_unpaged(&self.read, (migration.version,))
                .await
                .map_err(|e| unavailable("read migration state", e))?;
            let rows = rows::named_rows(result)?;
            let row = rows
                .first()
                .ok_or_else(|| StoreError::Corrupt("claimed migration row vanished".to_string()))?;
            if rows::text_or_none(row, "state").as_deref() == Some("applied") {
                return Ok(false);
            }
            let claimed_at = match row.get("claimed_at") {
                Some(Some(CqlValue::BigInt(at))) => *at,
                _ => 0,
            };
            let stale_ms = i64::try_from(STALE_CLAIM.as_millis()).unwrap_or(i64::MAX);
            if now_ms() - claimed_at > stale_ms {
                let previous_owner = rows::text_or_none(row, "owner").unwrap_or_default();
                let result = session
                    .execute_unpaged(
                        &self.take_over,
                        (
                            owner,
                            now_ms(),
                            migration.version,
                            previous_owner,
                            claimed_at,
                        ),
                    )
                    .await
                    .map_err(|e| unavailable("take over migration", e))?;
                if applied(result)? {
                    return Ok(true);
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(StoreError::Unavailable(format!(
                    "migration {} is claimed by another run that did not finish",
                    migration.version
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Whether a lightweight transaction's result says it applied.
fn applied(result: QueryResult) -> Result<bool, StoreError> {
    Ok(rows::named_rows(result)?
        .first()
        .map(rows::applied)
        .transpose()?
        .unwrap_or(false))
}

fn now_ms() -> i64 {
    use crate::clock::Clock as _;
    crate::clock::SystemClock.now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_file_is_registered_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("migrations dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.ends_with(".cql"))
            .collect();
        files.sort();
        let registered: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.cql", m.version, m.name))
            .collect();
        assert_eq!(files, registered);
        assert!(MIGRATIONS.windows(2).all(|w| w[0].version < w[1].version));
    }

    #[test]
    fn statements_split_and_substitute() {
        let parsed = statements(
            "-- c;omment\nCREATE TABLE {keyspace}.a (x int PRIMARY KEY);\n\n-- end\n",
            "ks",
        );
        assert_eq!(
            parsed,
            vec!["CREATE TABLE ks.a (x int PRIMARY KEY)".to_string()]
        );
        assert_eq!(statements(MIGRATIONS[0].cql, "ks").len(), 2);
    }

    #[test]
    fn tablets_are_disabled_only_where_lwt_needs_it() {
        let cassandra = create_keyspace_cql(
            "ks",
            "{'class': 'SimpleStrategy', 'replication_factor': 1}",
            &[],
        );
        assert!(!cassandra.contains("tablets"));
        let old_scylla = create_keyspace_cql("ks", "{}", &["TABLETS".to_string()]);
        assert!(old_scylla.contains("tablets = {'enabled': false}"));
        let new_scylla = create_keyspace_cql(
            "ks",
            "{}",
            &["TABLETS".to_string(), "LWT_WITH_TABLETS".to_string()],
        );
        assert!(!new_scylla.contains("tablets"));
    }
}
