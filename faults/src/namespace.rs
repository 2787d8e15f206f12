//! Namespaces of the suite's own, held open by an anchor process.
//!
//! A Linux namespace lives as long as a process is in it. Each scenario
//! that needs one (the full disk's mount namespace, each idemd replica's
//! network namespace in the partitions) starts `unshare … sh -c 'setup &&
//! echo ready && exec sleep'`: the `sleep` is the anchor other programs
//! join with `nsenter --target <its pid>`, and killing it (on drop) ends
//! the namespace once nothing else is inside.

use std::ffi::OsStr;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

/// A process holding namespaces open.
pub struct Anchor {
    /// The `sleep` inside the namespaces.
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

    /// Runs `program args` inside `namespaces`; fails with its stderr
    /// unless it exits 0.
    pub fn run(
        &self,
        namespaces: &[&str],
        program: &str,
        args: &[&str],
    ) -> anyhow::Result<std::process::Output> {
        let prefix = self.nsenter(namespaces);
        let output = Command::new(&prefix[0])
            .args(&prefix[1..])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("nsenter {program}"))?;
        Ok(output)
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `program args` here and fails with its stderr unless it exits 0.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    check(&output, &format!("{program} {}", args.join(" ")))
}

/// Ensures `output` is a success, naming `what` with its stderr otherwise.
pub fn check(output: &std::process::Output, what: &str) -> anyhow::Result<()> {
    if !output.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
