//! Memory and CPU of the processes under test, read from `/proc`: one
//! reading of a process tree, a sampler that watches one over a
//! measurement window, and the wait for every server to go idle before the
//! next one.
//!
//! A leaf: the load generator samples the servers it drives, the suite
//! settles them, and neither needs to know how they were started.

use std::time::{Duration, Instant};

/// Clock ticks per second of /proc/<pid>/stat times (USER_HZ: 100 on every
/// Linux build this runs on; `getconf CLK_TCK` confirms it once).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// `(ppid, utime + stime)` of one process.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces.
    let after = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... utime(11) stime(12).
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// VmRSS of one process in bytes.
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `pid` and its descendants (Postgres runs a process per connection).
fn process_tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
                && let Some((ppid, _)) = stat(child)
            {
                parents.push((child, ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut index = 0;
    while index < tree.len() {
        let parent = tree[index];
        tree.extend(
            parents
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(c, _)| *c),
        );
        index += 1;
    }
    tree
}

/// Proportional set size of one process in bytes (shared pages divided
/// among the processes sharing them).
fn pss(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = rollup.lines().find(|l| l.starts_with("Pss:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One reading of a process tree: memory and CPU ticks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reading {
    /// VmRSS of a single process; for a tree of several (Postgres: a
    /// backend per connection, all mapping the same shared buffers) the sum
    /// of PSS, which counts shared pages once instead of once per process.
    pub rss_bytes: u64,
    /// Sum of utime + stime.
    pub cpu_ticks: u64,
}

/// Reads the tree rooted at `pid`.
pub fn read_tree(pid: u32) -> Reading {
    let mut reading = Reading::default();
    let tree = process_tree(pid);
    let single = tree.len() == 1;
    for member in tree {
        reading.rss_bytes += if single { rss(member) } else { pss(member) }.unwrap_or(0);
        reading.cpu_ticks += stat(member).map(|(_, t)| t).unwrap_or(0);
    }
    reading
}

/// Samples a process tree every 200 ms until dropped/finished.
pub struct Sampler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(Reading, u64)>,
    started: Instant,
}

/// What a sampler saw over its lifetime.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Highest total RSS seen.
    pub peak_rss_bytes: u64,
    /// Average cores busy (CPU seconds / wall seconds).
    pub cpu_cores: f64,
}

impl Sampler {
    /// Starts sampling `pid`'s tree.
    pub fn start(pid: u32) -> Self {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let first = read_tree(pid);
        let task = tokio::spawn(async move {
            let mut peak = first.rss_bytes;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stopped.changed() => break,
                }
                peak = peak.max(read_tree(pid).rss_bytes);
            }
            let last = read_tree(pid);
            let ticks = last.cpu_ticks.saturating_sub(first.cpu_ticks);
            (
                Reading {
                    rss_bytes: last.rss_bytes,
                    cpu_ticks: ticks,
                },
                peak.max(last.rss_bytes),
            )
        });
        Self {
            stop,
            task,
            started: Instant::now(),
        }
    }

    /// Stops and summarises.
    pub async fn finish(self, ticks_per_second: f64) -> Usage {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let _ = self.stop.send(true);
        match self.task.await {
            Ok((last, peak)) => Usage {
                peak_rss_bytes: peak,
                cpu_cores: last.cpu_ticks as f64 / ticks_per_second / wall,
            },
            Err(_) => Usage::default(),
        }
    }
}

/// Waits (at most `limit`) until the processes in `pids` use less than
/// `idle_cores` of CPU over a 500 ms window, then flushes dirty pages with
/// sync(2). Returns how long it waited.
///
/// Why: every system runs next to the others' servers, and Cassandra
/// flushes memtables and compacts for seconds after a write-heavy run,
/// on both cores and the disk. Measured right after, an fsyncing system
/// (idemd-embedded, Postgres) stalled behind that writeback (P3b: ~1 s
/// without answers in 2 of 3 suite runs, none when Cassandra was idle).
/// Settling before each measurement makes a figure describe the system,
/// not its predecessor's leftovers.
pub async fn settle(pids: &[u32], idle_cores: f64, limit: Duration) -> Duration {
    let started = std::time::Instant::now();
    let ticks_per_second = clock_ticks();
    let busy = |pids: &[u32]| -> u64 { pids.iter().map(|&pid| read_tree(pid).cpu_ticks).sum() };
    let window = Duration::from_millis(500);
    while started.elapsed() < limit && !pids.is_empty() {
        let before = busy(pids);
        tokio::time::sleep(window).await;
        let cores =
            (busy(pids).saturating_sub(before)) as f64 / ticks_per_second / window.as_secs_f64();
        if cores < idle_cores {
            break;
        }
    }
    // Dirty pages written by whoever ran before would otherwise be written
    // back during the next measurement, under its fsyncs.
    let _ = tokio::task::spawn_blocking(|| std::process::Command::new("sync").status()).await;
    started.elapsed()
}
