//! An `idemd` process that scenarios start, kill, pause and restart on the
//! same address and data directory (the embedded store's, or a replica's
//! on the CQL store), with each run's stderr kept for the report.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use tokio::process::{Child, Command};
use tonic::Code;

use crate::plumbing::grpc::{ENDPOINT, channel, request};

/// The server under test.
pub struct Server {
    /// The binary under test.
    bin: PathBuf,
    /// Its data directory, kept across restarts (what a restart must
    /// recover from; scenarios damage files in it).
    pub data_dir: PathBuf,
    /// `127.0.0.1:port` (or another host: [`Server::on_host`]), kept
    /// across restarts so the clients' channels follow the server.
    pub address: String,
    /// Where each run's stderr goes (`server-N.log`): what a refused start
    /// said is judged from it.
    log_dir: PathBuf,
    /// Runs started so far (names the logs, one per run).
    runs: usize,
    /// The running process, if any: what signals and kills reach.
    child: Option<Child>,
    /// Flags beyond address, data dir and logs (the CQL store's).
    extra: Vec<String>,
    /// A command the binary runs under (`nsenter` into a namespace of the
    /// scenario's, `env` with libfaketime); empty: none.
    wrapper: Vec<String>,
    /// Environment variables of the next starts (`IDEMD_CRASH_AT`).
    env: Vec<(String, String)>,
}

/// A port nobody listens on now (the kernel's pick, then released).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

impl Server {
    /// A server that is not started yet.
    pub fn new(
        bin: &Path,
        data_dir: &Path,
        log_dir: &Path,
        extra: Vec<String>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            bin: bin.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            address: format!("127.0.0.1:{}", free_port()?),
            log_dir: log_dir.to_path_buf(),
            runs: 0,
            child: None,
            extra,
            wrapper: Vec::new(),
            env: Vec::new(),
        })
    }

    /// Listens on `host` (an address of a network namespace of the
    /// scenario's) instead of 127.0.0.1; the port stays.
    pub fn on_host(mut self, host: &str) -> Self {
        let port = self.address.rsplit(':').next().unwrap_or("0").to_string();
        self.address = format!("{host}:{port}");
        self
    }

    /// Runs the binary under `wrapper` (which must exec it, keeping its
    /// pid, so signals reach idemd itself).
    pub fn wrapped(mut self, wrapper: Vec<String>) -> Self {
        self.wrapper = wrapper;
        self
    }

    /// Sets the environment of the next starts (replacing what was set
    /// before; empty: none beyond the suite's own).
    pub fn set_env(&mut self, env: Vec<(String, String)>) {
        self.env = env;
    }

    /// Waits up to `limit` for the process to exit on its own: its status,
    /// or `None` if it still runs.
    pub async fn wait_exit(
        &mut self,
        limit: Duration,
    ) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let Some(child) = self.child.as_mut() else {
            return Ok(None);
        };
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(status) => {
                self.child = None;
                Ok(Some(status?))
            }
            Err(_) => Ok(None),
        }
    }

    /// Runs `bin` from the next start on (same address, data directory and
    /// flags): a rolling update's replacement of one replica.
    pub fn replace_binary(&mut self, bin: &Path) {
        self.bin = bin.to_path_buf();
    }

    /// Starts the process and waits until it answers with its store open;
    /// returns how long that took. Fails (with the end of its log) if the
    /// process exits first.
    pub async fn start(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.spawn()?;
        self.wait_ready(started).await
    }

    /// Starts the process without waiting.
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        self.runs += 1;
        let log = std::fs::File::create(self.log_path(self.runs))?;
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&self.bin);
                command
            }
            None => Command::new(&self.bin),
        };
        let child = command
            .args(["--listen", &self.address, "--metrics-listen", "off"])
            .args(["--log-format", "json", "--data-dir"])
            .arg(&self.data_dir)
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn log_path(&self, run: usize) -> PathBuf {
        let port = self.address.rsplit(':').next().unwrap_or("0");
        self.log_dir.join(format!("server-{port}-{run}.log"))
    }

    /// The stderr of the current (or last) run.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path(self.runs)).unwrap_or_default()
    }

    /// Waits until the server answers with its store open; the time since
    /// `started`.
    pub async fn wait_ready(&mut self, started: Instant) -> anyhow::Result<Duration> {
        let mut client = IdempotencyClient::new(channel(&self.address, Duration::from_secs(1))?);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "idemd exited with {status} while starting: {}",
                    tail(&self.log())
                );
            }
            let probe = request(pb::LookupRequest {
                endpoint: ENDPOINT.to_string(),
                key: "ready-probe".to_string(),
                include_response: false,
            });
            match client.lookup(probe).await {
                // The store answered: open.
                Err(status) if status.code() == Code::NotFound => return Ok(started.elapsed()),
                Ok(_) => return Ok(started.elapsed()),
                Err(_) if started.elapsed() < Duration::from_secs(60) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(status) => bail!("idemd not ready after 60 s: {status}"),
            }
        }
    }

    /// Whether the server's health check says NOT_SERVING (`false` for
    /// SERVING or no answer: a server not listening yet says nothing).
    pub async fn not_serving(&self) -> bool {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let Ok(channel) = channel(&self.address, Duration::from_secs(1)) else {
            return false;
        };
        let check = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        matches!(check, Ok(answer) if answer.get_ref().status == ServingStatus::NotServing as i32)
    }

    /// Waits until health says NOT_SERVING (or the process exits), up to
    /// `limit`: how long that took, `None` if it did not happen.
    pub async fn until_not_serving(&mut self, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.not_serving().await || matches!(self.exited(), Ok(Some(_))) {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The exit status, if the process has exited on its own.
    pub fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let Some(child) = self.child.as_mut() else {
            return Ok(None);
        };
        let status = child.try_wait()?;
        if status.is_some() {
            self.child = None;
        }
        Ok(status)
    }

    /// SIGKILL, and waits until the process is gone.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await?;
        }
        Ok(())
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) to the process.
    pub async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .child
            .as_ref()
            .and_then(Child::id)
            .context("no running idemd")?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed");
        }
        Ok(())
    }

    /// SIGTERM, then waits for the exit (a graceful stop).
    pub async fn stop(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        self.signal("TERM").await?;
        let mut child = self.child.take().context("no running idemd")?;
        Ok(tokio::time::timeout(Duration::from_secs(30), child.wait()).await??)
    }

    /// Starts the process and waits for it to exit on its own within
    /// `timeout` (a start that must be refused); `None` if it kept running.
    pub async fn start_expecting_exit(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<Option<std::process::ExitStatus>> {
        self.spawn()?;
        let child = self.child.as_mut().context("spawned")?;
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => {
                self.child = None;
                Ok(Some(status?))
            }
            Err(_) => Ok(None),
        }
    }
}

/// The last lines of a log, for error messages.
pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// The last line idemd wrote in its own words (`idemd: …`, not a JSON
/// log line): what it says when it refuses to start or exits.
pub fn last_message(log: &str) -> String {
    log.lines()
        .rev()
        .find(|line| line.starts_with("idemd:"))
        .unwrap_or_default()
        .to_string()
}
