//! [`Connection`]: a subcommand's gRPC connection to a running idemd, from
//! the flags of [`ConnectArgs`] (address, TLS, the caller's credentials).

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

use super::error::{CliError, with_causes};
use crate::config::ConnectArgs;

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
