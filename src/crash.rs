//! Crash points for the tests that kill idemd between two writes: the
//! environment variable `IDEMD_CRASH_AT` naming a point aborts the process
//! there, as `kill -9` would (no destructor, no flush). Read once per
//! process; unset (every deployment), a point costs one load.
//!
//! Where they are, and who kills there:
//! * the CQL store, between a claim's index entry and its insert, after the
//!   insert, and between the sealer's writes (`tests/cql/cql_cluster.rs`,
//!   `tests/cql/pending_cql.rs`): a crash must leave nothing ListPending
//!   cannot find;
//! * `idemd restore`, between each step of its swap
//!   (`store::embedded::swap`; the fault suite's `restore-guard`): a crash
//!   must leave either the old store or the restored one, never none;
//! * the embedded store's resize of its database file, between the sums and
//!   the file, and after both (`store::embedded::blocks`; the fault suite's
//!   `resize-kill`): a crash must leave nothing the next open calls damage.
//!
//! Compiled into every build, not only the tests': the fault suite drives
//! the release binary users run, and a hook that only aborts the process
//! that was told to abort gives nothing to anyone who could not already
//! kill it.

use std::sync::OnceLock;

/// `IDEMD_CRASH_AT`, and `IDEMD_CRASH_TENANT` for [`crash_point_in`].
fn wanted() -> &'static (Option<String>, Option<String>) {
    static WANTED: OnceLock<(Option<String>, Option<String>)> = OnceLock::new();
    WANTED.get_or_init(|| {
        (
            std::env::var("IDEMD_CRASH_AT").ok(),
            std::env::var("IDEMD_CRASH_TENANT").ok(),
        )
    })
}

/// Aborts here when `IDEMD_CRASH_AT` names `name`.
pub fn crash_point(name: &str) {
    if wanted().0.as_deref() == Some(name) {
        std::process::abort();
    }
}

/// [`crash_point`] for work done per tenant (the sealer visits every
/// tenant of the keyspace): with `IDEMD_CRASH_TENANT` set, only that
/// tenant's visit aborts.
pub fn crash_point_in(name: &str, tenant: &str) {
    if wanted().1.as_deref() == Some(tenant) {
        crash_point(name);
    }
}
