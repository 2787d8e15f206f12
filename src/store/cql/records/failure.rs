//! What a failed record LWT says about its outcome: rejected before it
//! could apply, or sent and not confirmed. The first is an error the caller
//! may retry; the second is resolved by a SERIAL read ([`super`], "Uncertain
//! outcomes"), never guessed. Only the record LWTs need the distinction: the
//! pending index's writes are plain (a retry is harmless) and a failed
//! cursor LWT is simply tried again at the next step, so they map any
//! failure to `StoreError::Unavailable`. The table is apart from the code
//! that acts on it because it follows the driver's error types and changes
//! with them.

use scylla::errors::{DbError, ExecutionError, RequestAttemptError, WriteType};
use scylla::statement::Consistency;

use crate::store::StoreError;

/// Whether a failed statement may have been applied.
pub(super) enum Failure {
    /// Rejected before it could apply (not sent, refused, invalid).
    NotApplied(StoreError),
    /// Sent and not confirmed: resolve by reading.
    Maybe(String),
}

pub(super) fn classify(error: ExecutionError) -> Failure {
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
