//! A disk the suite can fill: a small tmpfs in a mount namespace of its
//! own, so the full-disk scenario fills and frees it without touching any
//! file system of the host (`unshare -rm`, unprivileged).

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::plumbing::namespace::Anchor;

/// The namespaces the small disk's programs join.
const DISK_NAMESPACES: [&str; 2] = ["--user", "--mount"];

/// A tmpfs of a given size, mounted in a mount namespace of its own.
pub struct SmallDisk {
    /// Holds the namespace; joined by `nsenter` (the server's wrapper and
    /// every fill and free).
    anchor: Anchor,
    /// Where the tmpfs is mounted (inside the namespace only): the server's
    /// data directory goes below it.
    pub mount: PathBuf,
}

impl SmallDisk {
    /// A tmpfs of `size_mib` MiB mounted on `mount` (created here, empty
    /// outside the namespace).
    pub fn new(mount: &Path, size_mib: u32) -> anyhow::Result<Self> {
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
    pub fn nsenter(&self) -> Vec<String> {
        self.anchor.nsenter(&DISK_NAMESPACES)
    }

    /// Runs `script` in the namespace with `$1` the mount point; fails
    /// unless it exits 0.
    fn sh(&self, script: &str) -> anyhow::Result<std::process::Output> {
        let mount = self.mount.to_string_lossy();
        self.anchor
            .run(&DISK_NAMESPACES, "sh", &["-c", script, "sh", &mount])
    }

    /// Writes a file until the tmpfs is full; returns the bytes still free
    /// (0 unless something freed space meanwhile).
    pub fn fill(&self) -> anyhow::Result<u64> {
        // dd stops at ENOSPC (and says so, non-zero): that is the point.
        self.sh("dd if=/dev/zero of=\"$1/filler\" bs=64k 2>/dev/null; true")?;
        let df = self.sh("df -k --output=avail \"$1\" | tail -n 1")?;
        Ok(String::from_utf8_lossy(&df.stdout)
            .trim()
            .parse::<u64>()
            .unwrap_or(u64::MAX)
            .saturating_mul(1024))
    }

    /// Removes what [`SmallDisk::fill`] wrote.
    pub fn free(&self) -> anyhow::Result<()> {
        self.sh("rm -f \"$1/filler\"")
            .context("freeing the tmpfs")
            .map(drop)
    }
}
