//! `idemd keys`: find and resolve stuck keys from a terminal, with the same
//! connection flags as `idemd audit` and the server's roles (ListPending
//! and Reconcile need a `reconciler` or `admin` token).
//!
//! Output is an aligned table, or with `--output json` one JSON object per
//! line: the proto3 JSON form of the record (or of the RPC's answer), so
//! scripts read the same field names as the HTTP/JSON API. Raw keys are
//! printed here, to the operator who asked; the server never logs them.
//!
//! Exit codes ([`CliError`]): 0 done, 1 no such key, 2 a bad flag or file,
//! 3 refused by the server (not pending, wrong role, lease lost, invalid),
//! 4 no answer (connection, server error, store unavailable), 5 a verdict
//! not confirmed. Verdicts (`reconcile`, `release`) ask for confirmation
//! when stdin is a terminal, unless `--yes`.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, SystemTime};

use super::connection::Connection;
use super::error::CliError;
use crate::api::duration;
use crate::config::{KeyRef, KeysArgs, KeysCommand, OutputFormat, VerdictArgs};
use crate::proto::json;
use crate::proto::v1 as pb;
use crate::proto::v1::idempotency_client::IdempotencyClient;

/// Most records asked for per ListPending page.
const PAGE_SIZE: usize = 500;

/// Runs one `idemd keys` subcommand; its output goes to stdout.
pub async fn run(args: &KeysArgs) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    let connection = Connection::open(&args.connect).await?;
    let mut client = IdempotencyClient::new(connection.channel.clone());
    let call = |status: tonic::Status| CliError::from_status(&status);
    match &args.command {
        KeysCommand::Pending {
            endpoint,
            older_than,
            limit,
        } => {
            let mut records = Vec::new();
            let mut page_token = String::new();
            while records.len() < *limit {
                let page_size = (*limit - records.len()).min(PAGE_SIZE);
                let request = connection.request(pb::ListPendingRequest {
                    endpoint: endpoint.clone().unwrap_or_default(),
                    older_than: older_than.map(|d| duration(d.into())),
                    page_size: u32::try_from(page_size).unwrap_or(u32::MAX),
                    page_token: page_token.clone(),
                });
                let page = client
                    .list_pending(request)
                    .await
                    .map_err(call)?
                    .into_inner();
                records.extend(page.records);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            records.truncate(*limit);
            print_records(&mut out, args.output, &records)
        }
        KeysCommand::Get { key, with_response } => {
            let request = connection.request(pb::LookupRequest {
                endpoint: key.endpoint.clone(),
                key: key.key.clone(),
                include_response: *with_response,
            });
            let record = client
                .lookup(request)
                .await
                .map_err(call)?
                .into_inner()
                .record
                .unwrap_or_default();
            match args.output {
                OutputFormat::Json => print_json(&mut out, "idemd.v1.Record", &record),
                OutputFormat::Table => {
                    write_out(&mut out, &table(&["FIELD", "VALUE"], details(&record)))
                }
            }
        }
        KeysCommand::Reconcile {
            key,
            verdict,
            committed_body_file,
            headers,
            lease,
            yes,
        } => {
            let verdict = verdict_of(verdict, committed_body_file.as_deref(), headers, *lease)?;
            let call = Verdict {
                key,
                verdict,
                yes: *yes,
            };
            reconcile(&mut out, args.output, &mut client, &connection, call).await
        }
        KeysCommand::Release { key, yes } => {
            let verdict = pb::reconcile_request::Verdict::Released(pb::Released {});
            let call = Verdict {
                key,
                verdict,
                yes: *yes,
            };
            reconcile(&mut out, args.output, &mut client, &connection, call).await
        }
        KeysCommand::Extend {
            key,
            lease_token,
            lease,
        } => {
            let request = connection.request(pb::ExtendLeaseRequest {
                endpoint: key.endpoint.clone(),
                key: key.key.clone(),
                lease_token: lease_token.clone(),
                lease: lease.map(|d| duration(d.into())),
            });
            let extended = client
                .extend_lease(request)
                .await
                .map_err(call)?
                .into_inner();
            match args.output {
                OutputFormat::Json => {
                    print_json(&mut out, "idemd.v1.ExtendLeaseResponse", &extended)
                }
                OutputFormat::Table => write_out(
                    &mut out,
                    &table(
                        &["ENDPOINT", "KEY", "LEASE_EXPIRES_AT"],
                        vec![vec![
                            key.endpoint.clone(),
                            key.key.clone(),
                            instant(extended.lease_expires_at.as_ref()),
                        ]],
                    ),
                ),
            }
        }
    }
}

/// A verdict on one key, and whether the operator already confirmed it.
struct Verdict<'a> {
    key: &'a KeyRef,
    verdict: pb::reconcile_request::Verdict,
    yes: bool,
}

/// Confirms (see [`confirm`]), records the verdict and prints the result.
async fn reconcile(
    out: &mut impl Write,
    output: OutputFormat,
    client: &mut IdempotencyClient<tonic::transport::Channel>,
    connection: &Connection,
    Verdict { key, verdict, yes }: Verdict<'_>,
) -> Result<(), CliError> {
    let (name, detail) = describe(&verdict);
    confirm(yes, key, name, &detail)?;
    let request = connection.request(pb::ReconcileRequest {
        endpoint: key.endpoint.clone(),
        key: key.key.clone(),
        verdict: Some(verdict),
    });
    let answer = client
        .reconcile(request)
        .await
        .map_err(|status| CliError::from_status(&status))?
        .into_inner();
    match output {
        OutputFormat::Json => print_json(out, "idemd.v1.ReconcileResponse", &answer),
        OutputFormat::Table => {
            let mut rows = match &answer.record {
                Some(record) => details(record),
                None => vec![
                    row("endpoint", &key.endpoint),
                    row("key", &key.key),
                    row("state", "released (no record: a retry runs the operation)"),
                ],
            };
            if let Some(takeover) = &answer.takeover {
                rows.push(row("lease_token", &takeover.lease_token));
                rows.push(row(
                    "lease_expires_at",
                    &instant(takeover.lease_expires_at.as_ref()),
                ));
                rows.push(row("attempt", &takeover.attempt.to_string()));
            }
            write_out(out, &table(&["FIELD", "VALUE"], rows))
        }
    }
}

/// The verdict the flags name (exactly one, clap checks).
fn verdict_of(
    verdict: &VerdictArgs,
    body_file: Option<&std::path::Path>,
    headers: &[String],
    lease: Option<humantime::Duration>,
) -> Result<pb::reconcile_request::Verdict, CliError> {
    use pb::reconcile_request::Verdict;
    if let Some(status) = verdict.committed_status {
        let body = match body_file {
            Some(path) => std::fs::read(path).map_err(|e| {
                CliError::Usage(format!("--committed-body-file {}: {e}", path.display()))
            })?,
            None => Vec::new(),
        };
        let headers = headers
            .iter()
            .map(|header| {
                let (name, value) = header.split_once(':').ok_or_else(|| {
                    CliError::Usage(format!("--header {header:?}: expected `NAME: VALUE`"))
                })?;
                Ok(pb::Header {
                    name: name.trim().to_string(),
                    value: value.trim().to_string(),
                })
            })
            .collect::<Result<_, CliError>>()?;
        return Ok(Verdict::Committed(pb::StoredResponse {
            status: u32::from(status),
            headers,
            body,
            body_ref: String::new(),
        }));
    }
    if verdict.released {
        return Ok(Verdict::Released(pb::Released {}));
    }
    if let Some(reason) = &verdict.failed {
        return Ok(Verdict::Failed(reason.clone()));
    }
    Ok(Verdict::Takeover(pb::Takeover {
        lease: lease.map(|d| duration(d.into())),
    }))
}

fn describe(verdict: &pb::reconcile_request::Verdict) -> (&'static str, String) {
    use pb::reconcile_request::Verdict;
    match verdict {
        Verdict::Committed(response) => (
            "committed",
            format!(
                "retries will get status {} and {} bytes",
                response.status,
                response.body.len()
            ),
        ),
        Verdict::Released(_) => ("released", "a retry will run it again".to_string()),
        Verdict::Failed(reason) => ("failed", format!("reason {reason:?}")),
        Verdict::Takeover(_) => ("taken over", "you get its lease".to_string()),
    }
}

/// Asks on the terminal before a verdict; `--yes`, or stdin not being a
/// terminal (a script), skips the question.
fn confirm(yes: bool, key: &KeyRef, verdict: &str, detail: &str) -> Result<(), CliError> {
    if yes || !std::io::stdin().is_terminal() {
        return Ok(());
    }
    eprint!(
        "Record {} {:?} as {verdict} ({detail})? [y/N] ",
        key.endpoint, key.key
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::Usage(format!("reading the answer: {e}")))?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(CliError::NotConfirmed),
    }
}

fn print_records(
    out: &mut impl Write,
    output: OutputFormat,
    records: &[pb::Record],
) -> Result<(), CliError> {
    if output == OutputFormat::Json {
        for record in records {
            print_json(out, "idemd.v1.Record", record)?;
        }
        return Ok(());
    }
    let now = SystemTime::now();
    let rows = records
        .iter()
        .map(|record| {
            vec![
                record.endpoint.clone(),
                record.key.clone(),
                state(record),
                record.attempt.to_string(),
                age(record.created_at.as_ref(), now),
                record.reason.clone(),
            ]
        })
        .collect();
    write_out(
        out,
        &table(
            &["ENDPOINT", "KEY", "STATE", "ATTEMPT", "AGE", "REASON"],
            rows,
        ),
    )
}

/// A record as FIELD / VALUE rows.
fn details(record: &pb::Record) -> Vec<Vec<String>> {
    let mut rows = vec![
        row("endpoint", &record.endpoint),
        row("key", &record.key),
        row("state", &state(record)),
        row("attempt", &record.attempt.to_string()),
        row("fingerprint", &hex::encode(&record.fingerprint)),
        row("created_at", &instant(record.created_at.as_ref())),
    ];
    if record.lease_expires_at.is_some() {
        rows.push(row(
            "lease_expires_at",
            &instant(record.lease_expires_at.as_ref()),
        ));
    }
    if record.completed_at.is_some() {
        rows.push(row("completed_at", &instant(record.completed_at.as_ref())));
    }
    rows.push(row("expires_at", &instant(record.expires_at.as_ref())));
    if !record.reason.is_empty() {
        rows.push(row("reason", &record.reason));
    }
    if let Some(response) = &record.response {
        rows.push(row("response.status", &response.status.to_string()));
        for header in &response.headers {
            rows.push(row(
                "response.header",
                &format!("{}: {}", header.name, header.value),
            ));
        }
        let body = match std::str::from_utf8(&response.body) {
            Ok(text) => text.to_string(),
            Err(_) => {
                use base64::Engine as _;
                format!(
                    "base64:{}",
                    base64::engine::general_purpose::STANDARD.encode(&response.body)
                )
            }
        };
        rows.push(row("response.body", &body));
    }
    rows
}

fn row(field: &str, value: &str) -> Vec<String> {
    vec![field.to_string(), value.to_string()]
}

fn state(record: &pb::Record) -> String {
    let name = pb::State::try_from(record.state).map_or("STATE_UNSPECIFIED", |s| s.as_str_name());
    name.trim_start_matches("STATE_").to_string()
}

fn instant(at: Option<&prost_types::Timestamp>) -> String {
    at.map_or_else(String::new, |at| {
        humantime::format_rfc3339_millis(crate::api::system_time(at)).to_string()
    })
}

fn age(at: Option<&prost_types::Timestamp>, now: SystemTime) -> String {
    at.and_then(|at| now.duration_since(crate::api::system_time(at)).ok())
        .map_or_else(String::new, |age| {
            humantime::format_duration(Duration::from_secs(age.as_secs())).to_string()
        })
}

/// Columns padded to their widest cell; the last column is not padded.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (index, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if index == last {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_string() + "\n"
    };
    let mut text = line(headers.to_vec());
    for row in &rows {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    text
}

fn print_json<T: prost::Message>(
    out: &mut impl Write,
    name: &str,
    message: &T,
) -> Result<(), CliError> {
    let value = json::to_json(name, message).map_err(|e| CliError::Failed(e.to_string()))?;
    write_out(out, &format!("{value}\n"))
}

fn write_out(out: &mut impl Write, text: &str) -> Result<(), CliError> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| CliError::Failed(format!("writing the output: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_every_column_but_the_last() {
        let text = table(
            &["KEY", "STATE", "REASON"],
            vec![
                vec!["k-1".into(), "UNKNOWN".into(), "timeout".into()],
                vec!["a-longer-key".into(), "FAILED".into(), "".into()],
            ],
        );
        assert_eq!(
            text,
            "KEY           STATE    REASON\nk-1           UNKNOWN  timeout\na-longer-key  FAILED\n"
        );
    }

    #[test]
    fn statuses_map_to_exit_codes() {
        let code = |status: tonic::Status| CliError::from_status(&status).exit_code();
        assert_eq!(code(tonic::Status::not_found("no")), 1);
        assert_eq!(code(tonic::Status::failed_precondition("not pending")), 3);
        assert_eq!(code(tonic::Status::permission_denied("role")), 3);
        assert_eq!(code(tonic::Status::unavailable("down")), 4);
        assert_eq!(CliError::NotConfirmed.exit_code(), 5);
    }
}
