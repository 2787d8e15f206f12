//! `idemd-bench`: the benchmark suite of issue 7. idemd against a no-op gRPC
//! server of the same proto, Postgres-direct, Redis-direct and the raw CQL
//! driver's LWTs, run side by side by one command so that every claim is a
//! ratio measured in one run on the same (noisy, shared) machine.
//!
//! ```text
//! idemd-bench run --system idemd-embedded --workload fresh [--rate R] [--json out.json]
//! idemd-bench compare [--runs 3] [--pin] [--out-dir bench/results]
//! idemd-bench soak [--soak 10m] [--load-fraction 0.5]
//! idemd-bench peers --peer-load BIN [--diom-bin BIN] [--out-dir bench/results]
//! idemd-bench noop-server --listen 127.0.0.1:0
//! idemd-bench upstream --listen 127.0.0.1:0 --work 1ms
//! ```
//!
//! See `docs/benchmarks.md` for what each figure means and the latest
//! results.
//!
//! # Layout
//!
//! Subcommands (each parses its own flags and prints its verdict):
//!
//! * `suite`: `run`, `compare` and `soak`: starting the systems, the
//!   round-robin matrix, the report's files.
//! * `scale`: `cql-scale`, one busy tenant's day on the CQL store.
//! * `growth`: `growth`, one embedded store filled window after window.
//! * `startup`: `startup`, restart time of the embedded store as it grows,
//!   warm and with the page cache dropped.
//! * `cutover`: `cutover`, the downtime of the move from the embedded
//!   store to CQL (`idemd copy-to-cql`, then the start on the CQL store).
//! * `peers`: `peers`, idemd beside svix/diom through one Go client.
//! * `noop`: `noop-server`, the no-op gRPC baseline.
//! * `upstream`: `upstream`, the proxy benchmark's HTTP upstream.
//!
//! What they measure with, from the top down (a module uses only the ones
//! below it):
//!
//! * `embedded`: what `growth`, `startup` and `cutover` share (the idemd
//!   binary, an in-process fill, the wait for the first Claim).
//! * `chart`: the PNG of the report's medians.
//! * `report`: measurements, medians per system and workload, targets P1–P5,
//!   the markdown page (with the one-in-flight section).
//! * `clients`: the one-in-flight phase through the clients users run
//!   (this crate's tonic client, ghz, the Go SDK).
//! * `load`: the load generator, workloads over one client, closed or open
//!   loop, latency histograms.
//! * `systems`: one client type over idemd (gRPC, HTTP/JSON), the no-op
//!   server, Postgres, Redis and raw CQL LWTs.
//! * `servers`: starting and stopping the servers under test.
//!
//! Leaves, used from anywhere above: `targets` (a goal on a ratio of
//! medians), `sampling` (memory and CPU of process trees from `/proc`),
//! `ids` (names unique to a run).

mod chart;
mod clients;
mod cutover;
mod embedded;
mod growth;
mod ids;
mod load;
mod noop;
mod peers;
mod report;
mod sampling;
mod scale;
mod servers;
mod startup;
mod suite;
mod systems;
mod targets;
mod upstream;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "idemd-bench",
    about = "Benchmark suite: idemd vs no-op gRPC, Postgres, Redis and raw CQL LWTs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One system, one workload; prints the result (and writes JSON).
    Run(suite::RunArgs),
    /// Every system and workload, repeated; writes .md, .json and .png.
    Compare(suite::CompareArgs),
    /// A long open-loop run at a fraction of the measured maximum, watching
    /// RSS and errors over time.
    Soak(suite::SoakArgs),
    /// One busy tenant's day on the CQL store: fills it with Claim+Complete
    /// pairs, leaves one claim stale, checks ListPending, the gauges and the
    /// pending index's partition bound (docs/scylla.md).
    CqlScale(scale::ScaleArgs),
    /// Fills one embedded store at 64 in flight, window after window, on
    /// the gRPC and the HTTP/JSON port: pairs/s, latency, bytes per record
    /// and the writer's stage breakdown per window; restart time and sweep
    /// cost at the end (issue 30, docs/benchmarks.md).
    Growth(growth::GrowthArgs),
    /// Restart time of the embedded store at 10^5, 10^6 and 10^7 records:
    /// warm, after kill -9 under load and after a clean stop with the page
    /// cache dropped (issue 36, docs/benchmarks.md).
    Startup(startup::StartupArgs),
    /// Fills an embedded store with `--records` live records, then times
    /// `idemd copy-to-cql` into the cluster and the start of idemd on it:
    /// the downtime of the move to CQL (docs/deploy.md).
    Cutover(cutover::CutoverArgs),
    /// idemd beside svix/diom, the same workloads through one client in
    /// the same run (skipped, saying so, without `--diom-bin`).
    Peers(peers::PeersArgs),
    /// Serves the no-op baseline (canned responses); prints its address.
    NoopServer {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
    /// Serves the proxy benchmark's upstream (HTTP/1.1, `--work` per
    /// request); prints its address.
    Upstream {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Time each request takes.
        #[arg(long, default_value = "1ms")]
        work: humantime::Duration,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let pin = match &cli.command {
        Command::Run(args) => args.common.pin,
        Command::Compare(args) => args.common.pin,
        Command::Soak(args) => args.common.pin,
        Command::Growth(args) => args.pin,
        Command::NoopServer { .. }
        | Command::Upstream { .. }
        | Command::CqlScale(_)
        | Command::Startup(_) => false,
        Command::Cutover(_) | Command::Peers(_) => false,
    };
    // Before the runtime exists, so that every thread it starts inherits
    // the client core.
    if pin && let Err(error) = servers::pin_self() {
        eprintln!("idemd-bench: {error:#}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idemd-bench: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => suite::run(args).await,
            Command::Compare(args) => suite::compare(args).await,
            Command::Soak(args) => suite::soak(args).await,
            Command::CqlScale(args) => scale::run(args).await,
            Command::Growth(args) => growth::run(args).await,
            Command::Startup(args) => startup::run(args).await,
            Command::Cutover(args) => cutover::run(args).await,
            Command::Peers(args) => peers::run(args).await,
            Command::NoopServer { listen } => noop::serve(listen).await.map(|()| true),
            Command::Upstream { listen, work } => {
                upstream::serve(listen, work.into()).await.map(|()| true)
            }
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("idemd-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}
