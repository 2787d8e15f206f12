//! Namespaces of the suite's own, held open by an anchor process, and the
//! commands run in them.
//!
//! A Linux namespace lives as long as a process is in it. Each scenario
//! that needs one (the full disk's mount namespace, each member's network
//! namespace in the partitions) starts `unshare … sh -c 'setup && echo
//! ready && exec sleep'`: the `sleep` is the anchor other programs join
//! with `nsenter --target <its pid>`, and killing it (on drop) ends the
//! namespace once nothing else is inside.
//!
//! Every command here fails unless it exits 0 ([`checked`]): the plumbing
//! of a fault must not fail silently, or the scenario would pass without
//! its fault. Probes, whose non-zero exit is an answer, say so by calling
//! [`Anchor::probe`].

use std::ffi::{OsStr, OsString};
use std::io::BufRead;
use std::process::{Child, Command, ExitStatus, Output, Stdio};

use anyhow::{Context, bail};

/// A process holding namespaces open.
pub struct Anchor {
    /// The `sleep` inside the namespaces: its pid is what `nsenter` and
    /// `ip link … netns` name, and killing it ends them.
    child: Child,
}

impl Anchor {
    /// Runs `unshare <unshare> sh -c '<setup> && echo ready && exec sleep
    /// 86400' sh <args>` and waits for `ready` (the namespaces exist and
    /// `setup` succeeded); `what` names the failure.
    pub fn new(unshare: &[&str], setup: &str, args: &[&OsStr], what: &str) -> anyhow::Result<Self> {
        let mut child = Command::new("unshare")
            .args(unshare)
            .args(["sh", "-c"])
            .arg(format!("{setup} && echo ready && exec sleep 86400"))
            .arg("sh")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("unshare (util-linux): {what}"))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            std::io::BufReader::new(stdout).read_line(&mut line)?;
        }
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what}: setting up the namespace failed");
        }
        Ok(Self { child })
    }

    /// The anchor's pid (what `ip link … netns <pid>` takes).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The command prefix that runs a program inside the anchor's
    /// `namespaces` (`nsenter` flags: `--user`, `--mount`, `--net`).
    pub fn nsenter(&self, namespaces: &[&str]) -> Vec<String> {
        let mut prefix = vec!["nsenter".to_string(), "--preserve-credentials".to_string()];
        prefix.extend(namespaces.iter().map(|n| (*n).to_string()));
        prefix.extend([
            "--target".to_string(),
            self.pid().to_string(),
            "--".to_string(),
        ]);
        prefix
    }

    /// Runs `program args` inside `namespaces`; fails with the command, its
    /// exit status and its stderr unless it exits 0.
    pub fn run(&self, namespaces: &[&str], program: &str, args: &[&str]) -> anyhow::Result<Output> {
        checked(
            &mut self.command(namespaces, program, args),
            &format!("{program} {} (in {})", args.join(" "), namespaces.join(" ")),
        )
    }

    /// Runs `program args` inside `namespaces` and says whether it exited
    /// 0: for probes, where a non-zero exit is the answer (a port that does
    /// not open), not a failure. Fails only if `nsenter` cannot be started.
    pub fn probe(&self, namespaces: &[&str], program: &str, args: &[&str]) -> anyhow::Result<bool> {
        let output = self
            .command(namespaces, program, args)
            .output()
            .with_context(|| format!("nsenter {program}"))?;
        Ok(output.status.success())
    }

    /// `program args` under this anchor's `nsenter`, stdin closed.
    fn command(&self, namespaces: &[&str], program: &str, args: &[&str]) -> Command {
        let prefix = self.nsenter(namespaces);
        let mut command = Command::new(&prefix[0]);
        command
            .args(&prefix[1..])
            .arg(program)
            .args(args)
            .stdin(Stdio::null());
        command
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `program args` here; fails with its exit status and stderr unless
/// it exits 0.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    checked(&mut command, &format!("{program} {}", args.join(" "))).map(drop)
}

/// Runs `command` to its end and returns its output if it exited 0;
/// otherwise an error naming `what`, the exit status and the stderr.
pub fn checked(command: &mut Command, what: &str) -> anyhow::Result<Output> {
    let output = command
        .output()
        .with_context(|| format!("starting {what}"))?;
    check(&output, what)?;
    Ok(output)
}

/// Ensures `output` is a success, naming `what`, the exit status and the
/// stderr otherwise.
pub fn check(output: &Output, what: &str) -> anyhow::Result<()> {
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Runs this very program again with `args` in a user and network namespace
/// of its own (`unshare --user --map-root-user --net`, unprivileged), where
/// it is root of an empty network; waits for it to exit. `what` names the
/// failure to start it.
pub async fn rerun_in_network_namespace(
    args: &[OsString],
    what: &str,
) -> anyhow::Result<ExitStatus> {
    let exe = std::env::current_exe().context("the path of this program")?;
    tokio::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--"])
        .arg(exe)
        .args(args)
        .stdin(Stdio::null())
        .status()
        .await
        .with_context(|| format!("unshare (util-linux): {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that exits non-zero is an error naming the command, its
    /// status and its stderr: what `Anchor::run` returns for a command in
    /// a namespace (it runs through `checked`; making the namespace needs
    /// unprivileged user namespaces, which a unit test cannot count on).
    #[test]
    fn a_command_that_exits_non_zero_is_an_error() {
        let mut failing = Command::new("sh");
        failing.args(["-c", "echo 'no such device' >&2; exit 3"]);
        let error = checked(&mut failing, "sh -c <setup>").expect_err("exit 3 is a failure");
        let message = format!("{error:#}");
        for part in ["sh -c <setup>", "exit status: 3", "no such device"] {
            assert!(message.contains(part), "{part:?} missing from {message:?}");
        }
        let output = checked(Command::new("echo").arg("fine"), "echo").expect("exit 0");
        assert_eq!(output.stdout, b"fine\n");
        assert!(run("false", &[]).is_err(), "namespace::run checks as well");
    }
}
