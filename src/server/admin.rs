//! What the server does for its operators beside the API: the admin
//! socket `idemd backup` talks to, and turning health NOT_SERVING when the
//! store finds damage in its files.
//!
//! # The admin socket
//!
//! The server's end of the protocol [`crate::admin`] defines (the CLI,
//! `idemd backup`, is the other end): one backup at a time, written by the
//! process that owns the store.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tonic_health::ServingStatus;

use crate::admin::{ADMIN_SOCKET, AdminReply, AdminRequest};
use crate::store::Store;

/// Fully qualified name of the service, as health checks know it.
pub const SERVICE_NAME: &str = "idemd.v1.Idempotency";

/// Longest request line accepted.
const MAX_REQUEST: usize = 64 * 1024;

/// Listens on the admin socket of `data_dir` and answers there until the
/// task is aborted. A socket left by an earlier process is replaced (the
/// store's lock, taken before this, makes this process the only owner).
pub(super) fn serve(
    data_dir: &Path,
    store: Arc<dyn Store>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let path = data_dir.join(ADMIN_SOCKET);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let running = Arc::new(tokio::sync::Mutex::new(()));
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let store = Arc::clone(&store);
            let running = Arc::clone(&running);
            tokio::spawn(async move {
                if let Err(error) = answer(stream, store, running).await {
                    tracing::warn!(%error, "admin socket: connection failed");
                }
            });
        }
    }))
}

/// Answers one connection's request.
async fn answer(
    stream: UnixStream,
    store: Arc<dyn Store>,
    running: Arc<tokio::sync::Mutex<()>>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST as u64));
    reader.read_line(&mut line).await?;
    let reply = |reply: &AdminReply| {
        let mut text = serde_json::to_string(reply).unwrap_or_else(|_| "{}".to_string());
        text.push('\n');
        text
    };
    let request = match serde_json::from_str::<AdminRequest>(&line) {
        Ok(request) => request,
        Err(error) => {
            let text = reply(&AdminReply::Error(format!("not a request: {error}")));
            return write.write_all(text.as_bytes()).await;
        }
    };
    let AdminRequest::Backup { to } = request;
    if !to.is_absolute() {
        let text = reply(&AdminReply::Error(format!(
            "{}: the backup directory must be an absolute path (the server's working directory is not the client's)",
            to.display()
        )));
        return write.write_all(text.as_bytes()).await;
    }
    let Ok(_one) = running.try_lock() else {
        let text = reply(&AdminReply::Error(
            "a backup is already running".to_string(),
        ));
        return write.write_all(text.as_bytes()).await;
    };
    tracing::info!(to = %to.display(), "backup started");
    let (progress, mut copied) = tokio::sync::mpsc::unbounded_channel();
    let report: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |records| {
        let _ = progress.send(records);
    });
    let backup = store.backup(&to, report);
    tokio::pin!(backup);
    let outcome = loop {
        tokio::select! {
            outcome = &mut backup => break outcome,
            Some(records) = copied.recv() => {
                let text = reply(&AdminReply::Progress { records });
                // A client that went away does not stop the backup.
                let _ = write.write_all(text.as_bytes()).await;
            }
        }
    };
    let text = match outcome {
        Ok(summary) => {
            tracing::info!(to = %to.display(), records = summary.records, bytes = summary.bytes, "backup done");
            reply(&AdminReply::Done(summary))
        }
        Err(error) => {
            tracing::error!(to = %to.display(), %error, "backup failed");
            reply(&AdminReply::Error(error.to_string()))
        }
    };
    write.write_all(text.as_bytes()).await
}

/// How often the store is asked whether it found damage in its files.
const DAMAGE_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Turns health NOT_SERVING once the store finds damage in its files (it
/// then answers every call with `DATA_LOSS`): load balancers stop sending
/// traffic, and probes say why the node is out.
pub(super) async fn not_serving_on_damage(
    store: Arc<dyn Store>,
    health: tonic_health::server::HealthReporter,
) {
    let mut ticker = tokio::time::interval(DAMAGE_WATCH_INTERVAL);
    loop {
        ticker.tick().await;
        if let Some(report) = store.damage() {
            tracing::error!(%report, "store damaged: health NOT_SERVING, every call answers DATA_LOSS");
            set_health(&health, ServingStatus::NotServing).await;
            return;
        }
    }
}

/// Sets both names health is asked by (the server, `""`, and the service)
/// to `status`: every transition (start-up, serving, shutdown, damage)
/// moves them together.
pub(super) async fn set_health(
    health: &tonic_health::server::HealthReporter,
    status: ServingStatus,
) {
    health.set_service_status("", status).await;
    health.set_service_status(SERVICE_NAME, status).await;
}
