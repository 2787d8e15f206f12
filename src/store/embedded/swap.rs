//! The restore's swap: the checked copy of a backup (in `.restoring/`)
//! takes the place of the store's files in the data directory, and the
//! files it replaces go to a `replaced-<ms>/` directory, so that a kill at
//! any instant leaves either the old store or the restored one, never none
//! and never a mix.
//!
//! A store is several files in the data directory (database, checksums,
//! log segments), so no single rename swaps it. The swap is journaled
//! instead: [`JOURNAL_FILE`] is written (atomically: a temporary file
//! renamed over it, then the directory synced) before the first file
//! moves, says which of two phases runs, and is removed after the last:
//!
//! 1. `aside`: every store file in the data directory moves into the
//!    replaced directory;
//! 2. `in` (written once phase 1 is done): every store file of
//!    `.restoring/` moves into the data directory.
//!
//! Each phase moves what is left to move, so running it again after a kill
//! finishes it. Every open of the directory ([`finish_interrupted`], from
//! `EmbeddedStore::open` and from the next `idemd restore`) finishes a swap
//! it finds before anything else reads the files: the backup was checked
//! whole before the journal was written, so rolling forward is what the
//! operator asked for. Before the journal exists nothing was moved, and a
//! leftover `.restoring/` is only cleared by the next restore.
//!
//! Callers hold the directory's [`super::owner::DirOwner`]: two swaps, or
//! a swap under a serving process, cannot happen.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::blocks::SUMS_FILE;
use super::failure::storage_error;
use super::options::DATABASE_FILE;
use crate::crash::crash_point;
use crate::store::{StoreError, StoreResult};

/// The swap's journal in the data directory.
pub const JOURNAL_FILE: &str = "restore.json";

/// Where a restore stages and checks its copy, inside the data directory
/// (the same file system, so that the swap is renames).
pub const STAGING_DIR: &str = ".restoring";

/// What the journal says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Journal {
    /// The phase running (see the module docs).
    phase: Phase,
    /// The directory the replaced files go to (a name in the data
    /// directory).
    aside: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Phase {
    /// The old files are moving aside.
    Aside,
    /// The restored files are moving in.
    In,
}

/// A swap of the data directory `data_dir`'s store for the one staged in
/// its [`STAGING_DIR`].
#[derive(Debug)]
pub struct Swap {
    /// The data directory.
    data_dir: PathBuf,
    /// Where the replaced files go, if the directory held any.
    aside: PathBuf,
}

impl Swap {
    /// Starts the swap of `data_dir` (whose staged copy is checked): writes
    /// the journal, then runs both phases. Returns where the replaced files
    /// went, if any were replaced.
    pub fn run(data_dir: &Path, aside_name: &str) -> StoreResult<Option<PathBuf>> {
        let swap = Self {
            data_dir: data_dir.to_path_buf(),
            aside: data_dir.join(aside_name),
        };
        swap.write_journal(Phase::Aside)?;
        crash_point("restore-journaled");
        swap.finish(Phase::Aside)
    }

    /// Runs the swap from `phase` to its end (see the module docs).
    fn finish(&self, phase: Phase) -> StoreResult<Option<PathBuf>> {
        if phase == Phase::Aside {
            self.move_old_aside()?;
            self.write_journal(Phase::In)?;
            crash_point("restore-aside");
        }
        self.move_restored_in()?;
        crash_point("restore-in");
        let journal = self.data_dir.join(JOURNAL_FILE);
        std::fs::remove_file(&journal)
            .map_err(|e| storage_error("cannot remove the restore's journal", e))?;
        sync_dir(&self.data_dir)?;
        let staging = self.data_dir.join(STAGING_DIR);
        if staging.exists() {
            std::fs::remove_dir_all(&staging)
                .map_err(|e| storage_error("cannot remove the staging", e))?;
        }
        let replaced = self.aside.is_dir() && !list(&self.aside)?.is_empty();
        Ok(replaced.then(|| self.aside.clone()))
    }

    /// Phase 1: every store file of the data directory into the replaced
    /// directory (the old log too: its frames belong to the old file).
    fn move_old_aside(&self) -> StoreResult<()> {
        let old: Vec<PathBuf> = list(&self.data_dir)?
            .into_iter()
            .filter(|path| is_store_file(path))
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.aside)
            .map_err(|e| storage_error("cannot move the replaced store aside", e))?;
        move_into(&old, &self.aside, "restore-aside-first")
            .map_err(|e| storage_error("cannot move the replaced store aside", e))?;
        sync_dir(&self.aside)?;
        sync_dir(&self.data_dir)
    }

    /// Phase 2: every staged file into the data directory.
    fn move_restored_in(&self) -> StoreResult<()> {
        let staging = self.data_dir.join(STAGING_DIR);
        // Only the store's files: the check's open left its own owner file
        // there, which must not replace the one this process holds locked
        // (a rename over it would let a second owner lock the new file).
        let staged: Vec<PathBuf> = if staging.is_dir() {
            list(&staging)?
                .into_iter()
                .filter(|path| is_store_file(path))
                .collect()
        } else {
            Vec::new()
        };
        move_into(&staged, &self.data_dir, "restore-in-first")
            .map_err(|e| storage_error("cannot move the restored store into place", e))?;
        sync_dir(&self.data_dir)
    }

    /// Replaces the journal with one at `phase`, durably.
    fn write_journal(&self, phase: Phase) -> StoreResult<()> {
        let journal = Journal {
            phase,
            aside: self
                .aside
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let text = serde_json::to_vec_pretty(&journal)
            .map_err(|e| storage_error("cannot write the restore's journal", e))?;
        write_durably(&self.data_dir, JOURNAL_FILE, &text)
            .map_err(|e| storage_error("cannot write the restore's journal", e))
    }
}

/// Finishes a swap a kill interrupted in `data_dir` (see the module docs);
/// returns whether there was one. The caller owns the directory.
pub fn finish_interrupted(data_dir: &Path) -> StoreResult<bool> {
    let path = data_dir.join(JOURNAL_FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(storage_error("cannot read the restore's journal", e)),
    };
    let journal: Journal = serde_json::from_slice(&text).map_err(|e| {
        StoreError::Corrupt(format!(
            "{} (an interrupted `idemd restore`) cannot be read: {e}; the files it moved are in {} and {}",
            path.display(),
            STAGING_DIR,
            data_dir.display()
        ))
    })?;
    if journal.aside.is_empty() || journal.aside.contains(['/', '\\']) {
        return Err(StoreError::Corrupt(format!(
            "{}: no valid directory for the replaced files",
            path.display()
        )));
    }
    tracing::warn!(
        data_dir = %data_dir.display(),
        phase = ?journal.phase,
        "finishing an `idemd restore` that was interrupted (its backup was checked before it began)"
    );
    let swap = Swap {
        data_dir: data_dir.to_path_buf(),
        aside: data_dir.join(&journal.aside),
    };
    swap.finish(journal.phase)?;
    Ok(true)
}

/// Renames each of `files` into `dir` under its own name; `after_first`
/// is the crash point between the first rename and the rest.
fn move_into(files: &[PathBuf], dir: &Path, after_first: &str) -> std::io::Result<()> {
    for (moved, path) in files.iter().enumerate() {
        if let Some(name) = path.file_name() {
            std::fs::rename(path, dir.join(name))?;
        }
        if moved == 0 {
            crash_point(after_first);
        }
    }
    Ok(())
}

/// Replaces `dir/name` with `bytes` so that a crash leaves the old file or
/// the new one, whole: a temporary file written and synced, renamed over
/// it, the directory synced.
pub(super) fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = dir.join(format!("{name}.tmp"));
    std::fs::write(&temporary, bytes)?;
    std::fs::File::open(&temporary)?.sync_all()?;
    std::fs::rename(&temporary, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Whether `path` is one of a store's files (database, checksums, log).
pub(super) fn is_store_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| {
            name == DATABASE_FILE || name == SUMS_FILE || name.starts_with("idemd.wal")
        })
}

/// The entries of `dir`.
pub(super) fn list(dir: &Path) -> StoreResult<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| storage_error(&format!("cannot list {}", dir.display()), e))?;
    entries
        .map(|entry| {
            entry
                .map(|entry| entry.path())
                .map_err(|e| storage_error(&format!("cannot list {}", dir.display()), e))
        })
        .collect()
}

/// Makes `dir`'s entries (renames, creations) durable.
pub(super) fn sync_dir(dir: &Path) -> StoreResult<()> {
    std::fs::File::open(dir)
        .and_then(|file| file.sync_all())
        .map_err(|e| storage_error(&format!("cannot sync {}", dir.display()), e))
}
