//! Starting and stopping the servers under test, and reading their memory
//! and CPU from `/proc`.
//!
//! Every server the bench starts is a child process in a scratch directory
//! it removes afterwards: idemd (embedded or CQL store), the no-op server
//! (this binary's `noop-server`), Postgres (initdb + postgres, as the
//! `postgres` user when running as root) and Redis. Cassandra is started
//! outside (`scripts/with-cassandra.sh`); only its pid is read, to sample it.
//!
//! With `--pin`, servers run under `taskset -c 0` and the bench pins itself
//! to core 1 (see `pin_self`), so client and server never share a core.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::process::{Child, Command};

/// A server process the bench started, stopped (SIGTERM, then SIGKILL) by
/// [`Server::stop`].
pub struct Server {
    /// What it is, for messages.
    pub name: String,
    /// Its process (the postmaster for Postgres).
    child: Child,
    /// Scratch directory removed on stop.
    dir: Option<PathBuf>,
}

impl Server {
    /// The server's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Fails when the process has already exited (e.g. it could not bind).
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited during start-up ({status})", self.name);
        }
        Ok(())
    }

    /// SIGTERM, up to 20 s for a clean exit, then SIGKILL; removes the
    /// scratch directory.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
            if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
                .await
                .is_err()
            {
                eprintln!(
                    "idemd-bench: {} did not stop in 20 s; killing it",
                    self.name
                );
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
            }
        }
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    }
}

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A fresh scratch directory under the system temp dir.
pub fn scratch_dir(prefix: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("idemd-bench-{prefix}-{}", crate::load::run_id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// `taskset -c 0 program` when pinned, `program` otherwise.
fn command(program: &str, pin: bool) -> Command {
    if pin {
        let mut command = Command::new("taskset");
        command.args(["-c", "0", program]);
        command
    } else {
        Command::new(program)
    }
}

/// Spawns a prepared idemd `command` with its stderr to `log`, killed
/// when dropped.
fn spawn_idemd(command: &mut Command, log: std::fs::File, bin: &Path) -> Result<Child> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

/// Pins this process (and so every thread it starts later) to core 1.
/// Call before the runtime starts.
pub fn pin_self() -> Result<()> {
    let status = std::process::Command::new("taskset")
        .args(["-p", "-c", "1", &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .context("running taskset (util-linux)")?;
    if !status.success() {
        bail!("taskset -p -c 1 failed: {status}");
    }
    Ok(())
}

/// Whether this process runs as root (Postgres refuses to).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("Uid:"))
                .and_then(|line| line.split_whitespace().nth(1).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

/// Starts idemd on a free port; `store_args` selects the backend.
pub async fn start_idemd(
    bin: &Path,
    store_args: &[String],
    pin: bool,
) -> Result<(Server, SocketAddr)> {
    let dir = scratch_dir("idemd")?;
    let port = free_port()?;
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let log = std::fs::File::create(dir.join("idemd.log"))?;
    let mut idemd = command(&bin.to_string_lossy(), pin);
    idemd
        .arg("--listen")
        .arg(address.to_string())
        .arg("--data-dir")
        .arg(dir.join("data"))
        // As users run it: metrics on (on a free port; the recorder is
        // part of every request's cost) and the default log level.
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(store_args);
    let child = spawn_idemd(&mut idemd, log, bin)?;
    let name = if store_args.iter().any(|a| a == "cql") {
        "idemd-cql"
    } else {
        "idemd-embedded"
    };
    Ok((
        Server {
            name: name.into(),
            child,
            dir: Some(dir),
        },
        address,
    ))
}

/// Starts idemd (embedded store) on `data_dir`, which it keeps on stop
/// (the growth run restarts it on the same files), with `args` added.
pub async fn start_idemd_on(
    bin: &Path,
    data_dir: &Path,
    log: &Path,
    args: &[String],
    pin: bool,
) -> Result<Server> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut idemd = command(&bin.to_string_lossy(), pin);
    idemd.arg("--data-dir").arg(data_dir).args(args);
    let child = spawn_idemd(&mut idemd, log, bin)?;
    Ok(Server {
        name: "idemd-embedded".into(),
        child,
        dir: None,
    })
}

/// `idemd migrate` against the CQL nodes (idempotent).
pub async fn migrate_cql(bin: &Path, nodes: &[String]) -> Result<()> {
    let output = Command::new(bin)
        .arg("migrate")
        .arg("--cql-nodes")
        .arg(nodes.join(","))
        .output()
        .await
        .with_context(|| format!("running {} migrate", bin.display()))?;
    if !output.status.success() {
        bail!(
            "idemd migrate failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Starts this binary's `noop-server` on a free port.
pub async fn start_noop(pin: bool) -> Result<(Server, SocketAddr)> {
    let exe = std::env::current_exe()?;
    let port = free_port()?;
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let child = command(&exe.to_string_lossy(), pin)
        .arg("noop-server")
        .arg("--listen")
        .arg(address.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    Ok((
        Server {
            name: "noop".into(),
            child,
            dir: None,
        },
        address,
    ))
}

/// Runs a `bench/scripts/*.sh` installer and returns its last stdout line.
async fn installer(script: &str) -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(script);
    let output = Command::new("bash")
        .arg(&path)
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {}", path.display()))?;
    if !output.status.success() {
        bail!("{} failed ({})", path.display(), output.status);
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{} printed nothing", path.display()))
}

/// Starts Postgres in a scratch directory: initdb, then `postgres` in the
/// foreground as a child, synchronous_commit and fsync on. Returns the
/// connection string.
pub async fn start_postgres(pin: bool) -> Result<(Server, String)> {
    let bindir = PathBuf::from(installer("postgres.sh").await?);
    let dir = scratch_dir("postgres")?;
    let data = dir.join("data");
    let root = is_root();
    // Postgres will not run as root: drop to the `postgres` user that
    // Debian's package creates, without a wrapper process (setpriv execs).
    let as_user = |program: PathBuf| -> Command {
        if root {
            let mut c = command("setpriv", pin);
            c.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--reset-env",
            ]);
            c.arg(program);
            c
        } else {
            command(&program.to_string_lossy(), pin)
        }
    };
    if root {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .await?;
        if !status.success() {
            bail!("chown of {} failed", dir.display());
        }
    }
    let output = as_user(bindir.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-U", "bench", "--auth=trust", "-E", "UTF8", "--no-sync"])
        .stdin(Stdio::null())
        .output()
        .await
        .context("running initdb")?;
    if !output.status.success() {
        bail!("initdb failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let port = free_port()?;
    let log = std::fs::File::create(dir.join("postgres.log"))?;
    let child = as_user(bindir.join("postgres"))
        .arg("-D")
        .arg(&data)
        .arg("-p")
        .arg(port.to_string())
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "synchronous_commit=on",
            "-c",
            "fsync=on",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=256MB",
        ])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting postgres")?;
    let mut server = Server {
        name: "postgres".into(),
        child,
        dir: Some(dir),
    };
    let conninfo = format!("host=127.0.0.1 port={port} user=bench dbname=postgres");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        server.check_alive()?;
        if tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
            .await
            .is_ok()
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("postgres did not accept connections within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((server, conninfo))
}

/// Starts redis-server in a scratch directory with the baseline's
/// durability (append-only file, fsync every second). Returns its URL.
pub async fn start_redis(pin: bool) -> Result<(Server, String)> {
    let program = installer("redis.sh").await?;
    let dir = scratch_dir("redis")?;
    let port = free_port()?;
    let child = command(&program, pin)
        .args(["--bind", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--dir")
        .arg(&dir)
        .args([
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting redis-server")?;
    let mut server = Server {
        name: "redis".into(),
        child,
        dir: Some(dir),
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        server.check_alive()?;
        if let Ok(client) = redis::Client::open(url.as_str())
            && client.get_multiplexed_async_connection().await.is_ok()
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("redis did not accept connections within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((server, url))
}

/// The pid of the local Cassandra node started by `scripts/cassandra.sh`.
pub fn cassandra_pid(repo: &Path) -> Option<u32> {
    let home = std::env::var_os("IDEMD_CASSANDRA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".cache/cassandra"));
    std::fs::read_to_string(home.join("nodes/node1/cassandra.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------
// /proc sampling
// ---------------------------------------------------------------------------

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
