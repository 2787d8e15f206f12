//! Where an embedded store lives and how it is opened: the ground floor
//! that the store's own files (the writer, the backup, the export, the
//! swap) read, so that none of them imports the front door
//! ([`super::EmbeddedStore`]'s module) for a constant or the options.

use std::path::PathBuf;
use std::sync::Arc;

use super::blocks::ScrubOptions;
use crate::crypto::Keyring;

/// File name of the database inside the data directory.
pub const DATABASE_FILE: &str = "idemd.redb";

/// Default page cache of the embedded store (redb's cache). Fresh keys are
/// written at random places in the B-trees, so a bigger cache mostly holds
/// pages that will not be touched again soon; the OS page cache, which is not
/// charged to idemd's resident memory, backs it (every block read from it is
/// checked against its sum with the CPU's CRC instruction, a fraction of a
/// microsecond). 8 MiB rather than 16 brought the resident peak at 1,000
/// requests in flight from 64 to 54-58 MiB; 4 MiB rather than 8, with the
/// completed-record cache at 4 MiB too, from 71 to 61.5 MiB, with no
/// measurable change in fresh pairs/s (docs/benchmarks.md, P5).
pub const DEFAULT_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Tunables of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// Directory holding the database file; created if missing.
    pub data_dir: PathBuf,
    /// Page cache size in bytes (redb's cache; bounds memory use).
    pub cache_bytes: usize,
    /// Encryption at rest of stored responses; `None` stores them in clear
    /// (values sealed earlier then fail to read, naming their key id).
    pub keyring: Option<Arc<Keyring>>,
    /// Pace of the background check of every block ([`super::blocks`]).
    pub scrub: ScrubOptions,
    /// Who opens the store, written into the directory's owner file
    /// ([`super::owner`]) so that a process refused the directory is told who
    /// holds it.
    pub role: &'static str,
}

impl EmbeddedOptions {
    /// Defaults for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            cache_bytes: DEFAULT_CACHE_BYTES,
            keyring: None,
            scrub: ScrubOptions::default(),
            role: SERVE_ROLE,
        }
    }
}

/// The role of a process that opens the store to serve (the default).
pub const SERVE_ROLE: &str = "idemd serve";
