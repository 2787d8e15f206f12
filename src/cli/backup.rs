//! `idemd backup` and `idemd restore`: the operator's side of
//! [`crate::store::embedded::backup`].
//!
//! `backup` is a client of the running server's admin socket (the protocol
//! is [`crate::admin`]): the server, which owns the store, writes the
//! copy. `restore` works on files while no server runs.

use std::io::Write as _;
use std::path::Path;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;

use super::error::CliError;
use crate::admin::{ADMIN_SOCKET, AdminReply, AdminRequest};
use crate::config::{BackupArgs, RestoreArgs};
use crate::store::embedded::{EmbeddedOptions, restore};

/// `idemd backup`: asks the server on `--data-dir` for a backup into `--to`
/// and prints its progress and manifest.
pub async fn backup(args: &BackupArgs) -> Result<(), CliError> {
    let socket = args.data_dir.join(ADMIN_SOCKET);
    let stream = UnixStream::connect(&socket).await.map_err(|e| {
        CliError::Failed(format!(
            "no idemd serving the embedded store in {} ({}: {e}); a stopped store is backed up by copying its data directory",
            args.data_dir.display(),
            socket.display()
        ))
    })?;
    let to = absolute(&args.to)?;
    let (read, mut write) = stream.into_split();
    let mut request = serde_json::to_string(&AdminRequest::Backup { to: to.clone() })
        .map_err(|e| CliError::Usage(e.to_string()))?;
    request.push('\n');
    write
        .write_all(request.as_bytes())
        .await
        .map_err(|e| CliError::Failed(format!("{}: {e}", socket.display())))?;
    let mut lines = BufReader::new(read).lines();
    let started = std::time::Instant::now();
    loop {
        let line = lines
            .next_line()
            .await
            .map_err(|e| CliError::Failed(format!("{}: {e}", socket.display())))?
            .ok_or_else(|| {
                CliError::Failed("the server closed the admin socket before the backup finished (it may have stopped); the backup is incomplete".to_string())
            })?;
        let reply: AdminReply = serde_json::from_str(&line)
            .map_err(|e| CliError::Failed(format!("unreadable answer {line:?}: {e}")))?;
        match reply {
            AdminReply::Progress { records } => {
                eprintln!(
                    "idemd backup: {records} records copied ({:.0} s)",
                    started.elapsed().as_secs_f64()
                );
            }
            AdminReply::Done(summary) => {
                println!(
                    "backup of {} records ({:.1} MiB) written to {} in {:.1} s; every key acknowledged before {} is in it",
                    summary.records,
                    summary.bytes as f64 / 1048576.0,
                    to.display(),
                    (summary.finished_at_ms - summary.started_at_ms) as f64 / 1000.0,
                    format_ms(summary.started_at_ms),
                );
                let _ = std::io::stdout().flush();
                return Ok(());
            }
            AdminReply::Error(error) => return Err(CliError::Refused(error)),
        }
    }
}

/// `idemd restore`: checks the backup and moves it into `--data-dir`.
pub async fn restore(args: &RestoreArgs) -> Result<(), CliError> {
    let options = EmbeddedOptions::new(&args.data_dir);
    eprintln!(
        "idemd restore: checking every page and block of {} (one read of the file)",
        args.from.display()
    );
    let summary = restore::restore(&args.from, &options, args.replace)
        .await
        .map_err(|e| CliError::Refused(e.to_string()))?;
    println!(
        "restored {} records from {} (backup of {}) into {} in {:.1} s{}",
        summary.records,
        args.from.display(),
        format_ms(summary.backup.started_at_ms),
        args.data_dir.display(),
        summary.seconds,
        summary
            .replaced
            .map(|aside| format!("; the replaced files are in {}", aside.display()))
            .unwrap_or_default()
    );
    Ok(())
}

/// `path` made absolute against this process's working directory: the
/// server writes it, from a working directory of its own.
fn absolute(path: &Path) -> Result<std::path::PathBuf, CliError> {
    std::path::absolute(path).map_err(|e| CliError::Usage(format!("--to {}: {e}", path.display())))
}

fn format_ms(ms: i64) -> String {
    let at =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}
