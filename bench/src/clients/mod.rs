//! One request in flight, through the clients users run.
//!
//! Why this phase exists: the closed-loop matrix drives many requests in
//! flight from this crate's own tonic client, and that once hid a transport
//! defect that idemd and the no-op server shared (TCP_NODELAY missing on
//! accepted sockets: ~44 ms per call at one in flight through ghz, grpc-go,
//! grpcio and every SDK, issue 12). A service calls idemd before each side
//! effect, usually one call at a time, so the figure users feel is the
//! sequential latency through their own gRPC library. Each probe is timed
//! against idemd-embedded and the no-op server in the same run, per client:
//!
//! * `rust`: a tonic client of this crate, one connection, sequential calls.
//! * `ghz`: the common gRPC load tool (grpc-go), discovering the service by
//!   reflection, `--concurrency 1 --connections 1`; it cannot chain a
//!   Complete to a Claim, so it has no `pair` figure.
//! * `go-sdk`: a loop over the Go SDK's raw `Claim` and its executor
//!   (`bench/go`, built against `clients/go`).
//!
//! Probes: a fresh `claim` (unique key, sha256 fingerprint), a `pair`
//! (Claim + Complete of a unique key; the executor's ExecuteOnce for the Go
//! SDK), and replays of a completed key whose stored body is 1 KiB or
//! 16 KiB. ghz also measures fresh Claims at 64 in flight over 4
//! connections (throughput, 10 s by default).

//!
//! One module per client (`rust`, `ghz`, `go`), each timing one sequence of
//! a probe; `probe` holds what they share (the probes, the figures, the
//! command helpers), `measure` runs them all, and `summary` turns the
//! figures into medians, targets and the report's section.

mod ghz;
mod go;
mod measure;
mod probe;
mod rust;
mod summary;

pub use measure::measure;
pub use probe::{ClientsReport, Target, Tools};
pub use summary::targets;
