//! Subcommands that are clients of a running server (`idemd audit`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::metadata::MetadataValue;

use crate::config::AuditArgs;
use crate::proto::v1 as pb;
use crate::proto::v1::audit_client::AuditClient;

/// Parses `--since`: a duration ago or an RFC 3339 instant, as Unix ms.
pub fn parse_since(value: &str, now: SystemTime) -> Result<i64, String> {
    let instant = match humantime::parse_duration(value) {
        Ok(ago) => now.checked_sub(ago).unwrap_or(UNIX_EPOCH),
        Err(_) => humantime::parse_rfc3339_weak(value).map_err(|_| {
            format!("--since: {value:?} is neither a duration (1h, 7d) nor an RFC 3339 instant")
        })?,
    };
    let since = instant.duration_since(UNIX_EPOCH).unwrap_or_default();
    Ok(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

fn format_event(event: &pb::AuditEvent, json: bool) -> String {
    let at = event.at.as_ref().map_or(UNIX_EPOCH, |at| {
        UNIX_EPOCH
            + Duration::from_secs(u64::try_from(at.seconds).unwrap_or(0))
            + Duration::from_nanos(u64::try_from(at.nanos).unwrap_or(0))
    });
    let latency = event.latency.as_ref().map_or(Duration::ZERO, |d| {
        Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0))
            + Duration::from_nanos(u64::try_from(d.nanos).unwrap_or(0))
    });
    if json {
        return serde_json::json!({
            "at": humantime::format_rfc3339_millis(at).to_string(),
            "endpoint": event.endpoint,
            "key_sha256": event.key_sha256,
            "from": event.from_state,
            "to": event.to_state,
            "replayed": event.replayed,
            "attempt": event.attempt,
            "response_status": event.response_status,
            "fingerprint_prefix": event.fingerprint_prefix,
            "latency_us": latency.as_micros(),
        })
        .to_string();
    }
    format!(
        "{}  {}  key:{}  {} -> {}{}  attempt={} status={} fingerprint={} latency={:?}",
        humantime::format_rfc3339_millis(at),
        event.endpoint,
        event.key_sha256.get(..12).unwrap_or(&event.key_sha256),
        event.from_state,
        event.to_state,
        if event.replayed { " (replayed)" } else { "" },
        event.attempt,
        event.response_status,
        event.fingerprint_prefix,
        latency,
    )
}

/// The TLS settings of the connection: TLS exactly when the target is
/// `https://`, which then needs `--ca-file` (no system-roots fallback; see
/// the comment on [`AuditArgs::ca_file`]).
/// Options that would be silently ignored are refused instead: a CA or a
/// client certificate with a plaintext target means the user expected TLS.
fn client_tls(args: &AuditArgs) -> Result<Option<tonic::transport::ClientTlsConfig>, String> {
    let https = args.target.starts_with("https://");
    if !https {
        if args.ca_file.is_some() || args.client_cert.is_some() {
            return Err(format!(
                "--ca-file and --client-cert need an https:// --target (got {})",
                args.target
            ));
        }
        return Ok(None);
    }
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
    };
    let ca_file = args.ca_file.as_deref().ok_or_else(|| {
        format!(
            "--target {} is https: give --ca-file, the CA bundle that signed idemd's certificate",
            args.target
        )
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

/// `idemd audit`: pages through the events and prints them, oldest first.
pub async fn audit(args: &AuditArgs) -> Result<(), String> {
    if args.key.is_some() && args.endpoint.is_none() {
        return Err("--key needs --endpoint (a key is unique within its endpoint)".to_string());
    }
    let since = args
        .since
        .as_deref()
        .map(|value| parse_since(value, SystemTime::now()))
        .transpose()?;
    let endpoint = tonic::transport::Endpoint::from_shared(args.target.clone())
        .map_err(|e| format!("--target {}: {e}", args.target))?;
    let channel = match client_tls(args)? {
        Some(tls) => endpoint
            .tls_config(tls)
            .map_err(|e| format!("--target {}: {e}", args.target))?,
        None => endpoint,
    }
    .connect()
    .await
    .map_err(|e| {
        let message = format!("cannot connect to {}: {e}", args.target);
        with_causes(message, std::error::Error::source(&e))
    })?;
    let mut client = AuditClient::new(channel);
    let mut printed = 0;
    let mut page_token = String::new();
    while printed < args.limit {
        let page_size =
            u32::try_from((args.limit - printed).min(crate::audit::MAX_PAGE)).unwrap_or(u32::MAX);
        let mut request = tonic::Request::new(pb::ListAuditEventsRequest {
            endpoint: args.endpoint.clone().unwrap_or_default(),
            key: args.key.clone().unwrap_or_default(),
            since: since.map(|ms| prost_types::Timestamp {
                seconds: ms.div_euclid(1000),
                nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
            }),
            page_size,
            page_token: page_token.clone(),
        });
        if let Some(token) = &args.token {
            let value = MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| "--token: not a valid header value".to_string())?;
            request.metadata_mut().insert("authorization", value);
        }
        if let Some(tenant) = &args.tenant {
            let value = MetadataValue::try_from(tenant.as_str())
                .map_err(|_| "--tenant: not a valid header value".to_string())?;
            request
                .metadata_mut()
                .insert(crate::auth::TENANT_HEADER, value);
        }
        let response = client
            .list_audit_events(request)
            .await
            .map_err(|status| {
                let message = format!("{:?}: {}", status.code(), status.message());
                with_causes(message, std::error::Error::source(&status))
            })?
            .into_inner();
        for event in &response.events {
            println!("{}", format_event(event, args.json));
        }
        printed += response.events.len();
        if response.next_page_token.is_empty() {
            break;
        }
        page_token = response.next_page_token;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_accepts_durations_and_instants() {
        let now = UNIX_EPOCH + Duration::from_secs(10_000);
        assert_eq!(parse_since("1h", now), Ok(6_400_000));
        assert_eq!(
            parse_since("1970-01-01T00:00:01Z", now),
            Ok(1000),
            "an RFC 3339 instant"
        );
        let error = parse_since("yesterday", now).expect_err("rejected");
        assert!(error.contains("--since"), "{error}");
    }
}
