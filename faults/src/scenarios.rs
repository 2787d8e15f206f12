//! The faults, one function each. Every scenario runs the careful clients
//! against a server, injects its fault, heals it, and hands the history to
//! the shared checker (`history.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::history::{History, Verdict};
use crate::namespace::{Anchor, check};
use crate::server::{Server, tail};
use crate::workload::{self, Load};

/// How much of each fault a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// The subset inside `make test`: seconds per scenario.
    Short,
    /// `make faults`: minutes.
    Full,
}

/// The outcome of one scenario.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// What was injected, in words.
    pub injected: String,
    /// The checker's findings.
    pub verdict: Verdict,
    /// Restart (or recovery) times in ms, one per fault.
    pub recovery_ms: Vec<u64>,
    /// Anything else worth reporting (a refused start's message).
    pub notes: Vec<String>,
    /// Wall time of the scenario.
    pub seconds: f64,
}

impl Report {
    /// Whether the scenario passed.
    pub fn passed(&self) -> bool {
        self.verdict.passed()
    }
}

/// What every scenario starts from: a server, the history, the workers.
pub(crate) struct Run {
    /// The idemd replicas (one on the embedded store).
    pub(crate) servers: Vec<Server>,
    /// What the clients saw.
    pub(crate) history: Arc<History>,
    /// Set when the workers must finish.
    stop: Arc<AtomicBool>,
    /// The workers.
    workers: Option<tokio::task::JoinHandle<()>>,
    /// When the load began.
    pub(crate) started: Instant,
    /// The servers' data directories.
    _dir: tempfile::TempDir,
}

impl Run {
    async fn start(
        bin: &std::path::Path,
        load: &Load,
        log_dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let server = Server::new(bin, &dir.path().join("data"), log_dir, Vec::new())?;
        Self::start_with(vec![server], load, dir).await
    }

    /// Starts `servers` and the workers, which spread over them.
    pub(crate) async fn start_with(
        mut servers: Vec<Server>,
        load: &Load,
        dir: tempfile::TempDir,
    ) -> anyhow::Result<Self> {
        for server in &mut servers {
            server.start().await?;
        }
        let history = Arc::new(History::default());
        history.phase("load");
        let addresses = Arc::new(servers.iter().map(|s| s.address.clone()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let workers = tokio::spawn(workload::run(
            addresses,
            load.clone(),
            Arc::clone(&history),
            Arc::clone(&stop),
        ));
        Ok(Self {
            servers,
            history,
            stop,
            workers: Some(workers),
            started: Instant::now(),
            _dir: dir,
        })
    }

    /// Healed: a second of load without faults, then every worker finishes
    /// its call; then the final reads and the verdict.
    pub(crate) async fn finish(
        mut self,
        name: &str,
        injected: String,
        recovery_ms: Vec<u64>,
        notes: Vec<String>,
        tolerate_data_loss: bool,
    ) -> anyhow::Result<Report> {
        self.history.phase("healed");
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.stop.store(true, Ordering::Relaxed);
        if let Some(workers) = self.workers.take() {
            workers.await?;
        }
        self.history.phase("check");
        let finals = workload::finals(&self.servers[0].address, &self.history).await?;
        let verdict = self.history.verdict(&finals, tolerate_data_loss);
        for server in &mut self.servers {
            let _ = server.stop().await;
        }
        Ok(Report {
            scenario: name.to_string(),
            injected,
            verdict,
            recovery_ms,
            notes,
            seconds: self.started.elapsed().as_secs_f64(),
        })
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `kill -9` of the server every few hundred ms under load, `cycles` times,
/// each followed by a restart on the same data directory.
pub async fn kill9(
    bin: &std::path::Path,
    load: &Load,
    log_dir: &std::path::Path,
    cycles: usize,
) -> anyhow::Result<Report> {
    let mut run = Run::start(bin, load, log_dir).await?;
    let mut recovery = Vec::new();
    for _ in 0..cycles {
        tokio::time::sleep(Duration::from_millis(200 + rand::random::<u64>() % 600)).await;
        run.servers[0].kill9().await?;
        recovery.push(millis(run.servers[0].start().await?));
    }
    run.finish(
        "kill9",
        format!("{cycles} × SIGKILL under load, restart on the same data dir"),
        recovery,
        Vec::new(),
        false,
    )
    .await
}

/// SIGSTOP for longer than the clients' RPC deadline, then SIGCONT.
pub async fn pause(
    bin: &std::path::Path,
    load: &Load,
    log_dir: &std::path::Path,
    pauses: usize,
) -> anyhow::Result<Report> {
    let mut run = Run::start(bin, load, log_dir).await?;
    let mut recovery = Vec::new();
    let stopped_for = load.rpc_timeout * 3;
    for _ in 0..pauses {
        tokio::time::sleep(Duration::from_millis(500)).await;
        run.history.phase("paused");
        run.servers[0].signal("STOP").await?;
        tokio::time::sleep(stopped_for).await;
        run.servers[0].signal("CONT").await?;
        run.history.phase("resumed");
        // Recovered once a fresh call is answered by the store.
        recovery.push(millis(run.servers[0].wait_ready(Instant::now()).await?));
        tokio::time::sleep(Duration::from_millis(500)).await;
        run.history.phase("load");
    }
    run.finish(
        "pause",
        format!(
            "{pauses} × SIGSTOP for {} ms (3× the clients' RPC deadline), then SIGCONT",
            millis(stopped_for)
        ),
        recovery,
        Vec::new(),
        false,
    )
    .await
}

/// The offset where the write-ahead log's current frames end (see
/// `idemd::store::embedded::wal` for the format): frames are followed while
/// their sequence numbers are consecutive; what follows is stale.
fn wal_end(bytes: &[u8]) -> anyhow::Result<(usize, u64)> {
    if bytes.len() < 16 || &bytes[..8] != b"IDEMDWAL" {
        bail!("not an idemd write-ahead log");
    }
    let mut at = 16;
    let mut last: Option<u64> = None;
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into()?) as usize;
        let seq = u64::from_le_bytes(bytes[at + 8..at + 16].try_into()?);
        if at + 16 + len > bytes.len() || last.is_some_and(|last| seq != last + 1) {
            break;
        }
        last = Some(seq);
        at += 16 + len;
    }
    Ok((at, last.unwrap_or(0)))
}

/// `kill -9` under load, then a torn append written where the log's frames
/// end (what a power cut in the middle of an unacknowledged append leaves):
/// the server must start, keep every acknowledged write and ignore the torn
/// frame.
pub async fn torn_wal(
    bin: &std::path::Path,
    load: &Load,
    log_dir: &std::path::Path,
) -> anyhow::Result<Report> {
    let mut run = Run::start(bin, load, log_dir).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    run.servers[0].kill9().await?;
    // The log has two segments (idemd.wal, idemd.wal.1; a checkpoint
    // switches between them): the torn frame goes where the newest frames
    // end.
    let mut newest = None;
    for name in ["idemd.wal", "idemd.wal.1"] {
        let path = run.servers[0].data_dir.join(name);
        if !path.exists() {
            continue;
        }
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let (end, last) = wal_end(&bytes)?;
        if newest
            .as_ref()
            .is_none_or(|(_, _, _, newest)| last > *newest)
        {
            newest = Some((path, bytes, end, last));
        }
    }
    let Some((path, mut bytes, end, last)) = newest else {
        bail!(
            "no write-ahead log in {}",
            run.servers[0].data_dir.display()
        );
    };
    // A frame header claiming the next sequence and 4 KiB, a bad checksum,
    // and only 100 bytes of payload.
    let mut torn = Vec::new();
    torn.extend_from_slice(&0xdead_beef_u32.to_le_bytes());
    torn.extend_from_slice(&4096u32.to_le_bytes());
    torn.extend_from_slice(&(last + 1).to_le_bytes());
    torn.extend(std::iter::repeat_n(0xa5u8, 100));
    bytes.truncate(end);
    bytes.extend_from_slice(&torn);
    std::fs::write(&path, &bytes)?;
    let recovery = vec![millis(run.servers[0].start().await?)];
    run.finish(
        "torn-wal",
        format!(
            "SIGKILL, then a torn frame (seq {}) written at the log's end, {} offset {end}",
            last + 1,
            path.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ),
        recovery,
        Vec::new(),
        false,
    )
    .await
}

/// A clean stop, then bytes of the database file overwritten in several
/// pages: the server must refuse to start with a message that says what is
/// wrong, or answer `DATA_LOSS` for what it cannot read, and never serve a
/// wrong response or hand out a key that was taken.
pub async fn corrupt_page(
    bin: &std::path::Path,
    load: &Load,
    log_dir: &std::path::Path,
) -> anyhow::Result<Report> {
    let mut run = Run::start(bin, load, log_dir).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    run.history.phase("stopping");
    // Stop the clients first: the check must see what was acknowledged
    // before the file was damaged, nothing later.
    run.stop.store(true, Ordering::Relaxed);
    if let Some(workers) = run.workers.take() {
        workers.await?;
    }
    run.servers[0].stop().await?;
    let path = run.servers[0].data_dir.join("idemd.redb");
    let mut bytes = std::fs::read(&path)?;
    let pages = bytes.len() / 4096;
    let mut damaged = Vec::new();
    // Every fourth page past the header pages, 512 bytes in each.
    for page in (2..pages).step_by(4) {
        let at = page * 4096 + 1024;
        for byte in &mut bytes[at..at + 512] {
            *byte ^= 0x5a;
        }
        damaged.push(page);
    }
    std::fs::write(&path, &bytes)?;
    let mut notes = vec![format!("{} of {pages} pages damaged", damaged.len())];
    let exit = run.servers[0]
        .start_expecting_exit(Duration::from_secs(5))
        .await?;
    let (recovery, tolerate) = match exit {
        Some(status) => {
            let log = run.servers[0].log();
            let message = log
                .lines()
                .rev()
                .find(|line| line.starts_with("idemd:"))
                .unwrap_or_default()
                .to_string();
            notes.push(format!("refused to start ({status}): {message}"));
            if status.success() {
                bail!("idemd exited 0 on a corrupt database");
            }
            // A refusal must say what is wrong and where, not panic.
            if !(message.contains("damaged") || message.contains("corrupt"))
                || log.contains("panicked at")
            {
                run.history.unexpected(format!(
                    "refused to start without a clear message: {}",
                    tail(&log)
                ));
            }
            // Nothing served, nothing wrong: there are no final reads to
            // compare, so only what the clients saw before counts.
            let verdict = Verdict {
                lost: Vec::new(),
                ..run.history.verdict(&Default::default(), true)
            };
            return Ok(corrupt_report(verdict, Vec::new(), notes, run.started));
        }
        None => {
            notes.push(
                "started on the damaged file; unreadable records must answer DATA_LOSS".into(),
            );
            (Vec::new(), true)
        }
    };
    run.history.phase("check");
    let finals = workload::finals(&run.servers[0].address, &run.history).await?;
    let verdict = run.history.verdict(&finals, tolerate);
    let _ = run.servers[0].stop().await;
    Ok(corrupt_report(verdict, recovery, notes, run.started))
}

fn corrupt_report(
    verdict: Verdict,
    recovery_ms: Vec<u64>,
    notes: Vec<String>,
    started: Instant,
) -> Report {
    Report {
        scenario: "corrupt-page".into(),
        injected: "clean stop, then 512 bytes overwritten in every fourth page of idemd.redb"
            .into(),
        verdict,
        recovery_ms,
        notes,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// A mount namespace of the scenario's own holding a small tmpfs: the
/// embedded store's "disk", which the scenario can fill and free without
/// touching any file system of the host (`unshare -rm`, unprivileged).
struct SmallDisk {
    /// Holds the namespace; joined by `nsenter`.
    anchor: Anchor,
    /// Where the tmpfs is mounted (inside the namespace only).
    mount: std::path::PathBuf,
}

/// The namespaces the small disk's programs join.
const DISK_NAMESPACES: [&str; 2] = ["--user", "--mount"];

impl SmallDisk {
    fn new(mount: &std::path::Path, size_mib: u32) -> anyhow::Result<Self> {
        std::fs::create_dir_all(mount)?;
        let anchor = Anchor::new(
            &["--user", "--map-root-user", "--mount"],
            &format!("mount -t tmpfs -o size={size_mib}m idemd-faults \"$1\""),
            &[mount.as_os_str()],
            "the full-disk scenario needs unprivileged user and mount namespaces (a tmpfs of its own)",
        )?;
        Ok(Self {
            anchor,
            mount: mount.to_path_buf(),
        })
    }

    /// The command prefix that runs a program inside the namespace.
    fn nsenter(&self) -> Vec<String> {
        self.anchor.nsenter(&DISK_NAMESPACES)
    }

    fn sh(&self, script: &str) -> anyhow::Result<std::process::Output> {
        let mount = self.mount.to_string_lossy();
        self.anchor
            .run(&DISK_NAMESPACES, "sh", &["-c", script, "sh", &mount])
    }

    /// Writes a file until the tmpfs is full; returns the bytes still free
    /// (0 unless something freed space meanwhile).
    fn fill(&self) -> anyhow::Result<u64> {
        // dd stops at ENOSPC (and says so, non-zero): that is the point.
        self.sh("dd if=/dev/zero of=\"$1/filler\" bs=64k 2>/dev/null; true")?;
        let df = self.sh("df -k --output=avail \"$1\" | tail -n 1")?;
        Ok(String::from_utf8_lossy(&df.stdout)
            .trim()
            .parse::<u64>()
            .unwrap_or(u64::MAX)
            .saturating_mul(1024))
    }

    fn free(&self) -> anyhow::Result<()> {
        check(&self.sh("rm -f \"$1/filler\"")?, "freeing the tmpfs")
    }
}

/// Claims a fresh key (outside the history): whether a write went through.
async fn write_probe(address: &str, n: u64) -> bool {
    let Ok(channel) = workload::channel(address, Duration::from_secs(1)) else {
        return false;
    };
    let mut client = idemd::proto::v1::idempotency_client::IdempotencyClient::new(channel);
    let key = format!("disk-probe-{}-{n}", std::process::id());
    client
        .claim(workload::request(workload::claim_request(&key, &key)))
        .await
        .is_ok()
}

/// The file system of the embedded store fills up under load (a tmpfs of
/// `size_mib`, filled by another file), stays full for a while, then space
/// returns, `rounds` times. Writes must fail with a clear status, nothing
/// acknowledged may be lost, and idemd must serve again once space is
/// back: by itself, or after a restart when it exited saying what to do.
pub async fn full_disk(
    bin: &std::path::Path,
    load: &Load,
    log_dir: &std::path::Path,
    rounds: usize,
) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let disk = SmallDisk::new(&dir.path().join("disk"), 48)?;
    let server =
        Server::new(bin, &disk.mount.join("data"), log_dir, Vec::new())?.wrapped(disk.nsenter());
    let mut run = Run::start_with(vec![server], load, dir).await?;
    let mut recovery = Vec::new();
    let mut notes = Vec::new();
    let mut probes = 0u64;
    for round in 1..=rounds {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        run.history.phase("full");
        let left = disk.fill()?;
        // Under load on a full disk: the log outgrows its file, a
        // checkpoint needs new pages.
        let mut exited = None;
        let full_since = Instant::now();
        while full_since.elapsed() < Duration::from_secs(3) && exited.is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            exited = run.servers[0].exited()?;
        }
        let refused = !write_probe(&run.servers[0].address, probes).await;
        probes += 1;
        if exited.is_none() {
            exited = run.servers[0].exited()?;
        }
        disk.free()?;
        run.history.phase("freed");
        let freed = Instant::now();
        match exited {
            Some(status) => {
                let log = run.servers[0].log();
                let message = log
                    .lines()
                    .rev()
                    .find(|line| line.starts_with("idemd:"))
                    .unwrap_or_default()
                    .to_string();
                if status.success()
                    || !message.contains("Free space")
                    || log.contains("panicked at")
                {
                    run.history.unexpected(format!(
                        "exited ({status}) on a full disk without saying what to do: {}",
                        tail(&log)
                    ));
                }
                notes.push(format!(
                    "round {round}: {left} bytes left; exited ({status}): {message}"
                ));
                // What the operator does: space freed, start it again.
                recovery.push(millis(run.servers[0].start().await?));
            }
            None => {
                let mut resumed = false;
                while freed.elapsed() < Duration::from_secs(30) {
                    if write_probe(&run.servers[0].address, probes).await {
                        resumed = true;
                        break;
                    }
                    probes += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                probes += 1;
                if !resumed {
                    run.history.unexpected(format!(
                        "round {round}: writes did not resume within 30 s of freeing space: {}",
                        tail(&run.servers[0].log())
                    ));
                }
                notes.push(format!(
                    "round {round}: {left} bytes left; kept running, writes {} while full, resumed without a restart",
                    if refused { "refused" } else { "still accepted" }
                ));
                recovery.push(millis(freed.elapsed()));
            }
        }
        run.history.phase("load");
    }
    let report = run
        .finish(
            "full-disk",
            format!("{rounds} × the store's 48 MiB tmpfs filled under load for 3 s, then freed"),
            recovery,
            notes,
            false,
        )
        .await;
    drop(disk);
    report
}
