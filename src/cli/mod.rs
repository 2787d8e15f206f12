//! Operator subcommands. `idemd audit` and `idemd keys` are clients of a
//! running server: gRPC clients like any other (the embedded store has one
//! owner, and the tenant must come from credentials), sharing the
//! connection flags of [`ConnectArgs`]. `idemd backup` asks a running
//! server through the admin socket in its data directory instead (a
//! backup is every tenant's data, not an API call); `idemd restore` and
//! `idemd copy-to-cql` need the server stopped: they work on the embedded
//! store's files themselves ([`backup`], [`copy_to_cql`]). All share the
//! exit codes of [`CliError`].

pub mod audit;
pub mod backup;
pub mod copy_to_cql;
pub mod keys;

pub use audit::{audit, parse_since};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

use crate::config::ConnectArgs;

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

/// A connection to the server and the credentials every request carries.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The gRPC channel.
    pub channel: Channel,
    /// `authorization: Bearer <token>`, from `--token`.
    token: Option<MetadataValue<Ascii>>,
    /// `x-tenant-id`, from `--tenant` (servers with auth off).
    tenant: Option<MetadataValue<Ascii>>,
}

impl Connection {
    /// Connects as `args` say.
    pub async fn open(args: &ConnectArgs) -> Result<Self, CliError> {
        let token = args
            .token
            .as_ref()
            .map(|token| {
                MetadataValue::try_from(format!("Bearer {token}"))
                    .map_err(|_| CliError::Usage("--token: not a valid header value".into()))
            })
            .transpose()?;
        let tenant = args
            .tenant
            .as_ref()
            .map(|tenant| {
                MetadataValue::try_from(tenant.as_str())
                    .map_err(|_| CliError::Usage("--tenant: not a valid header value".into()))
            })
            .transpose()?;
        let endpoint = tonic::transport::Endpoint::from_shared(args.target.clone())
            .map_err(|e| CliError::Usage(format!("--target {}: {e}", args.target)))?;
        let channel = match client_tls(args)? {
            Some(tls) => endpoint
                .tls_config(tls)
                .map_err(|e| CliError::Usage(format!("--target {}: {e}", args.target)))?,
            None => endpoint,
        }
        .connect()
        .await
        .map_err(|e| {
            let message = format!("cannot connect to {}: {e}", args.target);
            CliError::Failed(with_causes(message, std::error::Error::source(&e)))
        })?;
        Ok(Self {
            channel,
            token,
            tenant,
        })
    }

    /// A request carrying the connection's credentials.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        if let Some(tenant) = &self.tenant {
            request
                .metadata_mut()
                .insert(crate::auth::TENANT_HEADER, tenant.clone());
        }
        request
    }
}

/// The TLS settings of the connection: TLS exactly when the target is
/// `https://`, which then needs `--ca-file` (no system-roots fallback; see
/// the comment on [`ConnectArgs::ca_file`]).
/// Options that would be silently ignored are refused instead: a CA or a
/// client certificate with a plaintext target means the user expected TLS.
fn client_tls(args: &ConnectArgs) -> Result<Option<tonic::transport::ClientTlsConfig>, CliError> {
    let https = args.target.starts_with("https://");
    if !https {
        if args.ca_file.is_some() || args.client_cert.is_some() {
            return Err(CliError::Usage(format!(
                "--ca-file and --client-cert need an https:// --target (got {})",
                args.target
            )));
        }
        return Ok(None);
    }
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| CliError::Usage(format!("{flag} {}: {e}", path.display())))
    };
    let ca_file = args.ca_file.as_deref().ok_or_else(|| {
        CliError::Usage(format!(
            "--target {} is https: give --ca-file, the CA bundle that signed idemd's certificate",
            args.target
        ))
    })?;
    let mut tls = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(read("--ca-file", ca_file)?),
    );
    if let (Some(cert), Some(key)) = (&args.client_cert, &args.client_key) {
        tls = tls.identity(tonic::transport::Identity::from_pem(
            read("--client-cert", cert)?,
            read("--client-key", key)?,
        ));
    }
    Ok(Some(tls))
}

/// A message and the causes below it on one line: tonic's transport
/// errors say only "transport error" at the top; the unknown CA, the
/// refused client certificate or the broken connection is named further
/// down the chain.
fn with_causes(message: String, mut cause: Option<&dyn std::error::Error>) -> String {
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
