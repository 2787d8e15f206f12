//! Starting and stopping the servers under test (their memory and CPU are
//! read by `sampling`).
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

impl Server {
    /// SIGKILL, as a crash would stop it; keeps its files (the restart
    /// after it is what is measured).
    pub async fn kill(mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
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
    let dir = std::env::temp_dir().join(format!("idemd-bench-{prefix}-{}", crate::ids::run_id()));
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
    set_affinity(std::process::id(), "1")
}

/// Moves every thread of `pid` (and the threads it starts later) onto
/// `cores` (a `taskset` list such as `0` or `0-1`).
pub fn set_affinity(pid: u32, cores: &str) -> Result<()> {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cores, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .context("running taskset (util-linux)")?;
    if !status.success() {
        bail!("taskset -a -p -c {cores} {pid} failed: {status}");
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

/// svix/diom's bearer token in the bench's config (loopback only).
pub const DIOM_TOKEN: &str = "adm_idemd_bench_0123456789";

/// Starts svix/diom's `diom-server` (single node, its default durable
/// configuration) on a free port, in a scratch directory holding its TOML
/// config and data; waits until it accepts connections.
pub async fn start_diom(bin: &Path, pin: bool) -> Result<(Server, SocketAddr)> {
    let dir = scratch_dir("diom")?;
    let address: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    std::fs::write(
        dir.join("diom.toml"),
        format!(
            "listen_address = \"{address}\"\nadmin_token = \"{DIOM_TOKEN}\"\n\
             log_level = \"info\"\nenvironment = \"dev\"\n"
        ),
    )?;
    let log = std::fs::File::create(dir.join("diom.log"))?;
    let child = command(&bin.to_string_lossy(), pin)
        .args(["-C", "diom.toml"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut server = Server {
        name: "diom".into(),
        child,
        dir: Some(dir),
    };
    let since = Instant::now();
    while tokio::net::TcpStream::connect(address).await.is_err() {
        server.check_alive()?;
        if since.elapsed() > Duration::from_secs(60) {
            bail!("diom did not listen on {address} within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((server, address))
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
