//! The embedded store's faults: one idemd on its own data directory,
//! killed, paused, its log torn, its database pages damaged, its disk
//! filled (a tmpfs in a mount namespace of its own).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::harness::history::{DataLoss, Verdict};
use crate::harness::report::{Report, millis};
use crate::harness::run::{Run, Setup};
use crate::harness::workload::{self, claim_request};
use crate::plumbing::disk::SmallDisk;
use crate::plumbing::grpc::{channel, request};
use crate::plumbing::server::{Server, last_message, tail};

/// `kill -9` of the server every few hundred ms under load, `cycles` times,
/// each followed by a restart on the same data directory.
pub async fn kill9(setup: &Setup<'_>, cycles: usize) -> anyhow::Result<Report> {
    let mut run = Run::start(setup).await?;
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
    )
    .await
}

/// SIGSTOP for longer than the clients' RPC deadline, then SIGCONT.
pub async fn pause(setup: &Setup<'_>, pauses: usize) -> anyhow::Result<Report> {
    let mut run = Run::start(setup).await?;
    let mut recovery = Vec::new();
    let stopped_for = setup.load.rpc_timeout * 3;
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
pub async fn torn_wal(setup: &Setup<'_>) -> anyhow::Result<Report> {
    let mut run = Run::start(setup).await?;
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
    )
    .await
}

/// Scrub rate and interval the damage scenarios give idemd, and how long
/// the store may take beyond the documented bound (the pause between two
/// passes plus one pass over the file) to turn NOT_SERVING: the server
/// polls the store for damage every second, and the health probe here
/// every 50 ms.
const SCRUB_RATE: u64 = 64 * 1024;
const SCRUB_INTERVAL: Duration = Duration::from_secs(2);
const DETECTION_SLACK: Duration = Duration::from_secs(2);

/// The longest a damaged block of the file at `path` goes unnoticed with
/// [`SCRUB_RATE`] and [`SCRUB_INTERVAL`] (docs/reliability.md): the pause
/// before the next pass, then the pass.
fn scrub_bound(path: &std::path::Path) -> anyhow::Result<Duration> {
    let len = std::fs::metadata(path)?.len();
    Ok(SCRUB_INTERVAL + Duration::from_secs_f64(len as f64 / SCRUB_RATE as f64) + DETECTION_SLACK)
}

/// One server on the embedded store whose scrub runs at [`SCRUB_RATE`]
/// every [`SCRUB_INTERVAL`], after 1.5 s of load: what the damage scenarios
/// damage.
async fn scrubbed_run(setup: &Setup<'_>) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let server = Server::new(
        setup.bin,
        &dir.path().join("data"),
        setup.log_dir,
        vec![
            "--store-scrub-rate".into(),
            SCRUB_RATE.to_string(),
            "--store-scrub-interval".into(),
            format!("{}ms", SCRUB_INTERVAL.as_millis()),
        ],
    )?;
    let run = Run::start_with(vec![server], &setup.load, dir).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(run)
}

/// A clean stop, then bytes of the database file overwritten in several
/// pages: the server must refuse to start with a message that says what is
/// wrong, or start, find the damage (on a read, or in the scrub's first
/// pass, which begins at open) within one scrub pass, turn NOT_SERVING and
/// answer `DATA_LOSS`; never serve a wrong response or hand out a key that
/// was taken.
pub async fn corrupt_page(setup: &Setup<'_>) -> anyhow::Result<Report> {
    let mut run = scrubbed_run(setup).await?;
    run.history.phase("stopping");
    // Stop the clients first: the check must see what was acknowledged
    // before the file was damaged, nothing later.
    run.stop_clients().await?;
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
    let bound = scrub_bound(&path)?;
    let exit = run.servers[0]
        .start_expecting_exit(Duration::from_secs(2))
        .await?;
    if let Some(status) = exit {
        let log = run.servers[0].log();
        let message = last_message(&log);
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
            ..run.history.verdict(&Default::default(), DataLoss::Expected)
        };
        return Ok(corrupt_report(verdict, notes, run.started));
    }
    match run.servers[0].until_not_serving(bound).await {
        Some(after) => notes.push(format!(
            "started on the damaged file; NOT_SERVING {} ms after 2 s of start (bound: interval + one scrub pass + {} s = {} ms)",
            after.as_millis(),
            DETECTION_SLACK.as_secs(),
            bound.as_millis()
        )),
        None => run.history.unexpected(format!(
            "started on the damaged file and still SERVING {} ms later: the damage was not found within the scrub's bound",
            bound.as_millis()
        )),
    }
    run.history.phase("check");
    let finals = workload::finals(&run.servers[0].address, &run.history).await?;
    let verdict = run.history.verdict(&finals, DataLoss::Expected);
    let _ = run.servers[0].stop().await;
    Ok(corrupt_report(verdict, notes, run.started))
}

/// Damage while idemd serves, in the file's last data page, which no
/// request reads and the scrub (slowed to [`SCRUB_RATE`]) has not reached
/// since it was written: the scrub must find it within its bound, health
/// turn NOT_SERVING, and no answer before or after be wrong.
pub async fn damage_unscrubbed(setup: &Setup<'_>) -> anyhow::Result<Report> {
    let mut run = scrubbed_run(setup).await?;
    // No more requests: nothing but the scrub may meet the damage; and
    // after the last checkpoint no write may overwrite it.
    run.history.phase("stopping");
    run.stop_clients().await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let path = run.servers[0].data_dir.join("idemd.redb");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)?;
    let pages = file.metadata()?.len() / 4096;
    // The last page holding data: the scrub reaches it last.
    let mut page = pages.saturating_sub(1);
    let mut bytes = vec![0u8; 4096];
    use std::os::unix::fs::FileExt as _;
    while page > 1 {
        file.read_exact_at(&mut bytes, page * 4096)?;
        if bytes.iter().any(|b| *b != 0) {
            break;
        }
        page -= 1;
    }
    for byte in &mut bytes[1024..1536] {
        *byte ^= 0x5a;
    }
    file.write_all_at(&bytes[1024..1536], page * 4096 + 1024)?;
    file.sync_data()?;
    let damaged_at = Instant::now();
    let bound = scrub_bound(&path)?;
    let mut notes = vec![format!("page {page} of {pages} damaged while serving")];
    run.history.phase("damaged");
    match run.servers[0].until_not_serving(bound).await {
        Some(_) => notes.push(format!(
            "NOT_SERVING {} ms after the damage (bound: interval + one scrub pass + {} s = {} ms); {}",
            damaged_at.elapsed().as_millis(),
            DETECTION_SLACK.as_secs(),
            bound.as_millis(),
            last_damage(&run.servers[0].log())
        )),
        None => run.history.unexpected(format!(
            "still SERVING {} ms after the damage: the scrub did not find it within its bound",
            bound.as_millis()
        )),
    }
    run.history.phase("check");
    let finals = workload::finals(&run.servers[0].address, &run.history).await?;
    let verdict = run.history.verdict(&finals, DataLoss::Expected);
    let _ = run.servers[0].stop().await;
    Ok(Report {
        scenario: "damage-unscrubbed".into(),
        injected:
            "512 bytes overwritten in the file's last data page while serving, scrub at 64 KiB/s every 2 s"
                .into(),
        verdict,
        recovery_ms: Vec::new(),
        notes,
        seconds: run.started.elapsed().as_secs_f64(),
    })
}

/// `idemd backup` of the serving store under load, then `kill -9`,
/// `idemd restore` of the backup into a fresh data directory and a server
/// started on it: every key acknowledged before the backup began must be
/// there as it was acknowledged (0 lost, 0 changed).
pub async fn backup_restore(setup: &Setup<'_>) -> anyhow::Result<Report> {
    let mut run = Run::start(setup).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    run.history.phase("backup");
    let acknowledged = run.history.acknowledged_now();
    let scratch = tempfile::tempdir()?;
    let backup_dir = scratch.path().join("backup");
    let started = Instant::now();
    let said = backup(setup.bin, &run.servers[0].data_dir, &backup_dir).await?;
    let backup_ms = started.elapsed().as_millis();
    // More writes after the backup, then a crash: the restore must not
    // depend on the old store's files. The clients stop first: the calls
    // they would retry belong to the lost store, not to the restored one.
    run.history.phase("after-backup");
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.stop_clients().await?;
    run.servers[0].kill9().await?;
    run.history.phase("restore");
    let restored_dir = scratch.path().join("restored");
    let restore = tokio::process::Command::new(setup.bin)
        .arg("restore")
        .arg("--from")
        .arg(&backup_dir)
        .arg("--data-dir")
        .arg(&restored_dir)
        .output()
        .await?;
    if !restore.status.success() {
        bail!(
            "idemd restore failed ({}): {}",
            restore.status,
            String::from_utf8_lossy(&restore.stderr)
        );
    }
    let mut server = Server::new(setup.bin, &restored_dir, setup.log_dir, Vec::new())?;
    server.start().await?;
    run.history.phase("check");
    let finals = workload::finals(&server.address, &run.history).await?;
    let verdict = run.history.verdict_as_of(&acknowledged, &finals);
    let _ = server.stop().await;
    Ok(Report {
        scenario: "backup-restore".into(),
        injected: "idemd backup under load, kill -9, idemd restore into a fresh directory".into(),
        verdict,
        recovery_ms: Vec::new(),
        notes: vec![
            format!(
                "{} keys acknowledged before the backup began; backup took {backup_ms} ms: {said}",
                acknowledged.len()
            ),
            String::from_utf8_lossy(&restore.stdout).trim().to_string(),
        ],
        seconds: run.started.elapsed().as_secs_f64(),
    })
}

/// `idemd backup` of the server serving `data_dir` into `to`: what it
/// printed, or an error with its stderr.
pub(super) async fn backup(
    bin: &std::path::Path,
    data_dir: &std::path::Path,
    to: &std::path::Path,
) -> anyhow::Result<String> {
    let backup = tokio::process::Command::new(bin)
        .arg("backup")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--to")
        .arg(to)
        .output()
        .await?;
    if !backup.status.success() {
        bail!(
            "idemd backup failed ({}): {}",
            backup.status,
            String::from_utf8_lossy(&backup.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&backup.stdout).trim().to_string())
}

/// What the server logged about the damage (who found it), shortened.
fn last_damage(log: &str) -> String {
    log.lines()
        .rev()
        .find(|line| line.contains("does not match its checksum"))
        .map(|line| {
            let found = ["found by the scrub", "found by a read"]
                .into_iter()
                .find(|who| line.contains(who))
                .unwrap_or("found");
            found.to_string()
        })
        .unwrap_or_else(|| "no damage report".to_string())
}

/// `corrupt-page`'s report, refused start or not (no recovery time: the
/// damage is not something to recover from).
fn corrupt_report(verdict: Verdict, notes: Vec<String>, started: Instant) -> Report {
    Report {
        scenario: "corrupt-page".into(),
        injected: "clean stop, then 512 bytes overwritten in every fourth page of idemd.redb"
            .into(),
        verdict,
        recovery_ms: Vec::new(),
        notes,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Claims a fresh key (outside the history): whether a write went through.
async fn write_probe(address: &str, n: u64) -> bool {
    let Ok(channel) = channel(address, Duration::from_secs(1)) else {
        return false;
    };
    let mut client = idemd::proto::v1::idempotency_client::IdempotencyClient::new(channel);
    let key = format!("disk-probe-{}-{n}", std::process::id());
    client
        .claim(request(claim_request(&key, &key)))
        .await
        .is_ok()
}

/// The file system of the embedded store fills up under load (a tmpfs of
/// `size_mib`, filled by another file), stays full for a while, then space
/// returns, `rounds` times. Writes must fail with a clear status, nothing
/// acknowledged may be lost, and idemd must serve again once space is
/// back: by itself, or after a restart when it exited saying what to do.
pub async fn full_disk(setup: &Setup<'_>, rounds: usize) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let disk = SmallDisk::new(&dir.path().join("disk"), 48)?;
    let server = Server::new(
        setup.bin,
        &disk.mount.join("data"),
        setup.log_dir,
        Vec::new(),
    )?
    .wrapped(disk.nsenter());
    let mut run = Run::start_with(vec![server], &setup.load, dir).await?;
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
                let message = last_message(&log);
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
        )
        .await;
    drop(disk);
    report
}
