//! Where the processes of one measurement run under `--pin`.
//!
//! * Every system but the CQL ones: its server on core 0 (started under
//!   `taskset`), the bench on core 1 (`servers::pin_self` at start-up), so
//!   client and server never share a core.
//! * The CQL systems (`raw-lwt`, `raw-lwt-indexed`, `idemd-cql`): for the
//!   length of their measurement, Cassandra alone on core 1 and everything
//!   that talks to it (the bench, and idemd-cql's server) on core 0. A
//!   deployment gives the database machines of its own. With the one node
//!   floating over both cores, whatever CPU idemd and its gRPC client use
//!   is taken from the node, which is CPU-bound at 16 in flight. P4c would
//!   then charge that contention to idemd's statements, which cost the
//!   store the same per pair (docs/benchmarks.md, "What a pair costs the
//!   store"). Every CQL system gets the same placement, so the raw driver
//!   loop is held to the same single core for its client.
//!
//! [`StoreApart`] puts everything back when dropped, so a failed run does
//! not leave Cassandra on one core for the systems measured after it.

use anyhow::Result;

use crate::servers::{cassandra_pid, set_affinity};

use super::lineup::repo_root;

/// Cassandra on core 1, the bench and the CQL system's server on core 0,
/// until dropped.
pub(super) struct StoreApart {
    /// The node moved to core 1; back on both cores when dropped.
    cassandra: u32,
    /// The server under test (idemd-cql), moved to core 0; back on both
    /// cores when dropped (it was started unpinned).
    server: Option<u32>,
}

impl StoreApart {
    /// Applies the placement; `server` is the system's own process, if
    /// it has one (the raw driver loops run inside the bench). `None`
    /// when no local node was started by `scripts/cassandra.sh` (a remote
    /// cluster has cores of its own already): nothing moves.
    pub(super) fn enter(server: Option<u32>) -> Result<Option<Self>> {
        let Some(cassandra) = cassandra_pid(&repo_root()) else {
            eprintln!(
                "idemd-bench: no local Cassandra pid file; the CQL systems run without the placement"
            );
            return Ok(None);
        };
        // Constructed first, so a failure below still restores what moved.
        let apart = Self { cassandra, server };
        set_affinity(cassandra, "1")?;
        set_affinity(std::process::id(), "0")?;
        if let Some(server) = server {
            set_affinity(server, "0")?;
        }
        Ok(Some(apart))
    }
}

impl Drop for StoreApart {
    fn drop(&mut self) {
        let moves = [
            (Some(self.cassandra), "0-1"),
            (Some(std::process::id()), "1"),
            (self.server, "0-1"),
        ];
        for (pid, cores) in moves {
            if let Some(pid) = pid
                && let Err(error) = set_affinity(pid, cores)
            {
                eprintln!("idemd-bench: restoring the placement: {error:#}");
            }
        }
    }
}
