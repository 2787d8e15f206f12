//! One owner per data directory, as PostgreSQL's `postmaster.pid`: every
//! process that opens a data directory for writing (`idemd serve`,
//! `idemd restore`, `idemd copy-to-cql`) first takes an exclusive lock on
//! [`OWNER_FILE`] in it and holds it until the process ends, and writes who
//! it is into the file so that the next one can say who holds it.
//!
//! Why not redb's own lock: redb locks `idemd.redb`, the file, not the
//! directory. A restore swaps the files under the directory, so it never
//! opens the live file and never met that lock: a restore over a serving
//! idemd was accepted, the server went on acknowledging into files moved
//! away, and after its restart those keys were granted again (issue 50).
//! The directory's lock is taken before anything in the directory is read
//! or moved, by every writer, whatever file it touches.
//!
//! The lock is `flock(2)` on an open file description (std's
//! [`std::fs::File::try_lock`]): the kernel releases it when the process
//! ends, however it ends (`kill -9`, a crash, power loss), so a stale file
//! never blocks a start; the pid written in it is only what the error
//! message shows. A second open of the same directory in one process
//! conflicts too (each open is its own description).

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// Why a directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// Another process (or another open in this one) owns it; the message
    /// names the holder.
    #[error("{0}")]
    Held(String),
    /// The owner file could not be created, opened, locked or written.
    #[error("{0}")]
    Io(String),
}

impl From<OwnerError> for StoreError {
    fn from(error: OwnerError) -> Self {
        StoreError::Unavailable(error.to_string())
    }
}

/// The lock file in a data directory (never moved by a restore, never part
/// of a backup).
pub const OWNER_FILE: &str = "idemd.pid";

/// Held ownership of a data directory: released when dropped (or when the
/// process ends).
#[derive(Debug)]
pub struct DirOwner {
    /// The locked file, open for as long as the ownership lasts: closing it
    /// releases the lock.
    file: File,
    /// The directory owned, for messages.
    dir: PathBuf,
}

impl DirOwner {
    /// Takes `dir` (created if missing) for this process, as `role` (what
    /// the next one is told holds it: "idemd serve", "idemd restore").
    /// Refuses, naming the holder, when another process (or another open
    /// in this one) has it; never waits.
    pub fn acquire(dir: &Path, role: &str) -> Result<Self, OwnerError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            OwnerError::Io(format!("cannot create data dir {}: {e}", dir.display()))
        })?;
        let path = dir.join(OWNER_FILE);
        let io = |what: &str, e: std::io::Error| {
            OwnerError::Io(format!("cannot {what} {}: {e}", path.display()))
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("open", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(OwnerError::Held(held_message(dir, &holder)));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", e)),
        }
        let since = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        let record = format!("{}\n{role}\n{since}\n", std::process::id());
        file.set_len(0).map_err(|e| io("write", e))?;
        file.rewind().map_err(|e| io("write", e))?;
        file.write_all(record.as_bytes())
            .map_err(|e| io("write", e))?;
        Ok(Self {
            file,
            dir: dir.to_path_buf(),
        })
    }

    /// The directory owned.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for DirOwner {
    fn drop(&mut self) {
        // Closing the file releases the lock; unlocking first makes the
        // release explicit. The file stays (an empty name is no claim).
        let _ = self.file.unlock();
    }
}

/// "DIR is in use by idemd serve (pid N since T)": what a refused writer
/// is told, from what the holder wrote.
fn held_message(dir: &Path, holder: &str) -> String {
    let mut lines = holder.lines();
    let who = match (lines.next(), lines.next(), lines.next()) {
        (Some(pid), Some(role), Some(since)) => format!("{role} (pid {pid}, since {since})"),
        _ => "another process".to_string(),
    };
    format!(
        "{} is in use by {who}: a data directory has one owner; stop it first",
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second owner is refused with the first one's pid and role, and
    /// the directory is free again once the first is dropped. Fails without
    /// the lock (both acquire).
    #[test]
    fn a_second_owner_is_refused_naming_the_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        let first = DirOwner::acquire(dir.path(), "idemd serve").expect("first");
        let refused = DirOwner::acquire(dir.path(), "idemd restore").expect_err("second");
        let message = refused.to_string();
        assert!(
            message.contains("in use by idemd serve")
                && message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        drop(first);
        DirOwner::acquire(dir.path(), "idemd restore").expect("free again");
    }

    /// The file left by a process that ended (a stale pid) is no claim.
    #[test]
    fn a_stale_owner_file_does_not_block() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(OWNER_FILE), "1\nidemd serve\nlong ago\n").expect("write");
        let owner = DirOwner::acquire(dir.path(), "idemd serve").expect("acquire");
        let written = std::fs::read_to_string(dir.path().join(OWNER_FILE)).expect("read");
        assert!(written.starts_with(&format!("{}\n", std::process::id())));
        assert_eq!(owner.dir(), dir.path());
    }
}
