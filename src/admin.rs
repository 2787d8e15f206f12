//! The admin protocol between `idemd` serving the embedded store and the
//! operator commands that ask it for work only the owner of the store can
//! do (`idemd backup`): a module of its own, below both, so that neither
//! the server nor the CLI imports the other's internals.
//!
//! A backup copies every tenant's records, so it is not an API call: a
//! tenant's admin token must not read other tenants' keys. It is asked for
//! on a Unix socket in the data directory ([`ADMIN_SOCKET`], mode 0600):
//! who can connect is who can read the store's files anyway, and nothing
//! is reachable from the network. One JSON object per line: the request
//! `{"backup":{"to":"/abs/dir"}}`, then `{"progress":{"records":N}}` lines
//! and one `{"done":{…manifest…}}` or `{"error":"…"}`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::store::BackupSummary;

/// File name of the admin socket in the data directory.
pub const ADMIN_SOCKET: &str = "admin.sock";

/// A request on the admin socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminRequest {
    /// Back up the store into the new directory `to` (absolute).
    Backup {
        /// Where the backup goes.
        to: PathBuf,
    },
}

/// A line of the answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminReply {
    /// Records copied so far.
    Progress {
        /// Records copied.
        records: u64,
    },
    /// The backup is complete: its manifest.
    Done(BackupSummary),
    /// It failed: why.
    Error(String),
}
