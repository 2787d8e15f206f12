//! The faults, one family per module, each scenario one function: it
//! starts a run (`harness::run`), injects its fault through the plumbing,
//! heals it, and hands the history to the shared checker, adding its own
//! bounds where the fault allows some failures.
//!
//! * `embedded`: one idemd on the embedded store: kill -9, SIGSTOP, a torn
//!   log tail, damaged database pages, a full disk.
//! * `restore`: `idemd restore` over a serving idemd, and killed at each
//!   step of its swap.
//! * `image`: idemd started on images of its disk (ext4 on a loop device)
//!   taken under load, on the same boot and another.
//! * `resize`: the embedded store killed inside a resize of its file.
//! * `cql`: a 3-node Cassandra cluster under two replicas: a node killed,
//!   a node paused, the quorum lost, the whole cluster restarted.
//! * `skew`: one of two replicas with its wall clock moved.
//! * `cutover`: the move from the embedded store to the cluster under load.
//! * `partition`: links cut between the nodes and the replicas.

pub mod cql;
pub mod cutover;
pub mod embedded;
pub mod image;
pub mod partition;
pub mod resize;
pub mod restore;
pub mod skew;
