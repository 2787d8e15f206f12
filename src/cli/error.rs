//! [`CliError`]: why a subcommand failed, and the exit code that says so.

/// Why a client subcommand failed; each kind has its exit code, so scripts
/// can tell "no such key" from "the server said no" from "no server".
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The server has no such key (exit 1).
    #[error("{0}")]
    NotFound(String),
    /// A local problem with the command: a flag, a file (exit 2, like a
    /// flag clap rejects).
    #[error("{0}")]
    Usage(String),
    /// The server refused the request: not pending, wrong role or
    /// endpoint, invalid input, lease lost (exit 3).
    #[error("{0}")]
    Refused(String),
    /// No answer: the connection failed, or the server failed or is
    /// unavailable (exit 4).
    #[error("{0}")]
    Failed(String),
    /// The operator did not confirm a destructive verdict (exit 5).
    #[error("not confirmed; nothing was changed")]
    NotConfirmed,
}

impl CliError {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NotFound(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Refused(_) => 3,
            CliError::Failed(_) => 4,
            CliError::NotConfirmed => 5,
        }
    }

    /// The error of a status the server answered.
    pub fn from_status(status: &tonic::Status) -> Self {
        use tonic::Code;
        let message = with_causes(
            format!("{:?}: {}", status.code(), status.message()),
            std::error::Error::source(status),
        );
        match status.code() {
            Code::NotFound => CliError::NotFound(message),
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::AlreadyExists
            | Code::Aborted
            | Code::OutOfRange
            | Code::ResourceExhausted => CliError::Refused(message),
            _ => CliError::Failed(message),
        }
    }
}

/// A message and the causes below it on one line: tonic's transport
/// errors say only "transport error" at the top; the unknown CA, the
/// refused client certificate or the broken connection is named further
/// down the chain.
pub(super) fn with_causes(message: String, mut cause: Option<&dyn std::error::Error>) -> String {
    let mut text = message;
    while let Some(inner) = cause {
        let inner_text = inner.to_string();
        if !text.ends_with(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        cause = inner.source();
    }
    text
}
