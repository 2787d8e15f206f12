//! How the store prepares its statements: once, at start, on the options'
//! keyspace, each owner ([`super::records`], [`super::pending`]) its own.
//! What every owner follows:
//!
//! * A missing schema fails the start with one message naming the keyspace
//!   and `idemd migrate`, whichever statement found it.
//! * Every statement that is not an LWT may run twice without harm: a read,
//!   or a plain write of fixed values (a later write of the same row comes
//!   from a later request, after this one returned). Owners mark such
//!   statements idempotent ([`idempotent`]), which gives them the session's
//!   speculative executions (`session::SPECULATIVE_AFTER`): a coordinator
//!   that stopped answering (a paused node) costs them a few hundred
//!   milliseconds, not the request timeout. An LWT is never sent twice: its
//!   outcome after a timeout is decided by a SERIAL read.
//! * Reads of the pending index are paged ([`paged`]).

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use crate::store::{StoreError, StoreResult};

/// Rows per page of the index reads: small enough that a page of live rows
/// is cheap, large enough that a slice rarely needs two.
pub(super) const INDEX_PAGE_ROWS: i32 = 500;

/// Prepares statements on one keyspace.
pub(super) struct Preparer<'a> {
    /// The session the statements run on.
    session: &'a Session,
    /// The keyspace every statement names (validated before).
    pub(super) keyspace: &'a str,
}

impl<'a> Preparer<'a> {
    /// A preparer on `keyspace`.
    pub(super) fn new(session: &'a Session, keyspace: &'a str) -> Self {
        Self { session, keyspace }
    }

    /// Prepares `cql`; fails, naming the keyspace, when the schema is
    /// missing.
    pub(super) async fn prepare(&self, cql: String) -> StoreResult<PreparedStatement> {
        self.session.prepare(cql).await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot prepare statements on keyspace {} (has `idemd migrate` run?): {e}",
                self.keyspace
            ))
        })
    }
}

/// `statement`, paged by [`INDEX_PAGE_ROWS`].
pub(super) fn paged(mut statement: PreparedStatement) -> PreparedStatement {
    statement.set_page_size(INDEX_PAGE_ROWS);
    statement
}

/// Marks statements that are not LWTs as safe to send twice (see the
/// module docs).
pub(super) fn idempotent<'a>(statements: impl IntoIterator<Item = &'a mut PreparedStatement>) {
    for statement in statements {
        statement.set_is_idempotent(true);
    }
}
