//! Running the `idemd` binary as a child process and finding its address.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running `idemd` process.
pub struct Process {
    /// The child.
    pub child: Child,
    /// The gRPC address it logged.
    pub addr: std::net::SocketAddr,
    /// Log lines after start-up.
    pub lines: mpsc::Receiver<String>,
    /// The "idemd serving" log event (what the server reports about itself).
    pub serving: serde_json::Value,
    /// The log lines before it (start-up warnings and modes).
    pub startup: Vec<String>,
}

/// A test's process never outlives it: a replica left running after its
/// test keeps reconnecting to a cluster that is gone, and its CPU is taken
/// from every later test of the run.
impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `program [subcommand]` (an `idemd` binary) on port 0 with JSON logs and
/// `data_dir`.
fn command_on_port_0(
    program: &std::path::Path,
    subcommand: Option<&str>,
    data_dir: &std::path::Path,
) -> Command {
    let mut command = Command::new(program);
    command
        .args(subcommand)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--data-dir",
        ])
        .arg(data_dir)
        // No metrics port unless a test asks for one (`--metrics-listen`
        // overrides the variable): tests run in parallel.
        .env("IDEMD_METRICS_LISTEN", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// This build's `idemd` binary.
pub fn this_idemd() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_idemd"))
}

/// `idemd` on port 0 with JSON logs and `data_dir`, plus `extra` flags.
pub fn idemd_command(data_dir: &std::path::Path, extra: &[&str]) -> Command {
    release_command(this_idemd(), data_dir, extra)
}

/// [`idemd_command`] with another `idemd` binary, e.g. an earlier release's
/// (tests/it/upgrade_embedded.rs), which must take the same flags.
pub fn release_command(
    program: &std::path::Path,
    data_dir: &std::path::Path,
    extra: &[&str],
) -> Command {
    let mut command = command_on_port_0(program, None, data_dir);
    command.args(extra);
    command
}

/// `idemd proxy` in front of `upstream` on port 0, with JSON logs and
/// `data_dir`, no gRPC port and no metrics port (add `--metrics-listen`).
pub fn proxy_command(data_dir: &std::path::Path, upstream: std::net::SocketAddr) -> Command {
    let mut command = command_on_port_0(this_idemd(), Some("proxy"), data_dir);
    // The upstream from its variable, so the `IDEMD_*` path is tested.
    command.env("IDEMD_UPSTREAM", format!("http://{upstream}"));
    command
}

/// Starts `idemd` and waits for its "idemd serving" log line.
pub fn spawn(data_dir: &std::path::Path, extra: &[&str]) -> Process {
    spawn_command(idemd_command(data_dir, extra))
}

/// Starts a command made by [`idemd_command`] (e.g. with extra environment)
/// and waits for its "idemd serving" log line.
pub fn spawn_command(mut command: Command) -> Process {
    let mut child = command.spawn().expect("spawn idemd");
    let stderr = child.stderr.take().expect("stderr");
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut addr = None;
    let mut serving = serde_json::Value::Null;
    let mut seen = Vec::new();
    while addr.is_none() {
        let remaining = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = lines.recv_timeout(remaining) else {
            break;
        };
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
            seen.push(line);
            continue;
        };
        if event["message"] == "idemd serving" {
            addr = event["address"].as_str().and_then(|a| a.parse().ok());
            serving = event;
        }
        seen.push(line);
    }
    match addr {
        Some(addr) => Process {
            child,
            addr,
            lines,
            serving,
            startup: seen,
        },
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "idemd did not log 'idemd serving' with an address within 30 s; its log:\n{}",
                seen.join("\n")
            );
        }
    }
}

/// SIGKILL and reap.
pub fn kill9(mut process: Process) {
    process.child.kill().expect("SIGKILL");
    process.child.wait().expect("reaped");
}

/// Sends SIGTERM.
pub fn sigterm(process: &Process) {
    let status = Command::new("kill")
        .args(["-TERM", &process.child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
}
