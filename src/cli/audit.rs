//! `idemd audit`: prints audit events from a running server.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::connection::Connection;
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
    let at = event
        .at
        .as_ref()
        .map_or(UNIX_EPOCH, crate::api::system_time);
    let latency = event
        .latency
        .as_ref()
        .map_or(Duration::ZERO, crate::api::std_duration);
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
    let connection = Connection::open(&args.connect)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = AuditClient::new(connection.channel.clone());
    let mut printed = 0;
    let mut page_token = String::new();
    while printed < args.limit {
        let page_size =
            u32::try_from((args.limit - printed).min(crate::audit::MAX_PAGE)).unwrap_or(u32::MAX);
        let request = connection.request(pb::ListAuditEventsRequest {
            endpoint: args.endpoint.clone().unwrap_or_default(),
            key: args.key.clone().unwrap_or_default(),
            since: since.map(|ms| prost_types::Timestamp {
                seconds: ms.div_euclid(1000),
                nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
            }),
            page_size,
            page_token: page_token.clone(),
        });
        let response = client
            .list_audit_events(request)
            .await
            .map_err(|status| super::error::CliError::from_status(&status).to_string())?
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
