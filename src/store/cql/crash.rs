//! Crash points for the tests that kill idemd between two writes
//! (`tests/cql/cql_cluster.rs`): with the `cql-tests` feature, the
//! environment variable `IDEMD_CRASH_AT` naming a point aborts the process
//! there, as `kill -9` would. Compiled out of every other build. The points
//! are where a crash must leave nothing ListPending cannot find: between a
//! claim's index entry and its insert, after the insert, and between the
//! sealer's writes.

/// Aborts here when `IDEMD_CRASH_AT` names `name`.
pub(super) fn crash_point(name: &str) {
    #[cfg(feature = "cql-tests")]
    if std::env::var("IDEMD_CRASH_AT").is_ok_and(|at| at == name) {
        std::process::abort();
    }
    #[cfg(not(feature = "cql-tests"))]
    let _ = name;
}

/// [`crash_point`] for work done per tenant (the sealer visits every
/// tenant of the keyspace): with `IDEMD_CRASH_TENANT` set, only that
/// tenant's visit aborts.
pub(super) fn crash_point_in(name: &str, tenant: &str) {
    #[cfg(feature = "cql-tests")]
    if std::env::var("IDEMD_CRASH_TENANT").is_ok_and(|t| t == tenant) {
        crash_point(name);
    }
    #[cfg(not(feature = "cql-tests"))]
    let _ = (name, tenant);
}
