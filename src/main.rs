//! The `idemd` binary: parses configuration, sets up logging, runs the
//! server until SIGTERM/SIGINT.

// No function over clippy.toml's `too-many-lines-threshold` (120 code lines).
#![warn(clippy::too_many_lines)]

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use idemd::clock::SystemClock;
use idemd::config::{Cli, Command, LogFormat, MigrateArgs, Settings};

/// mimalloc rather than glibc's malloc: allocation and free were a fifth of
/// the server's CPU per fresh pair, spread over tonic, h2 and the store
/// (docs/benchmarks.md, "Hot paths", has the before/after figures).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Logs go to stderr. Colour (ANSI escapes) only when stderr is a terminal
/// and `NO_COLOR` is unset or empty (no-color.org): day-two commands run
/// as Jobs whose output lands in `kubectl logs` and files, where escape
/// codes are noise (issue 50).
fn init_logging(filter: &str, format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Human => builder.init(),
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| {
            eprintln!("idemd: cannot start the runtime: {error}");
            ExitCode::FAILURE
        })
}

/// `idemd migrate`: create the keyspace, apply pending migrations.
fn migrate(args: &MigrateArgs) -> ExitCode {
    init_logging("info", args.log_format);
    // Policies are irrelevant to migrations; the default policy's max_ttl
    // keeps the options valid.
    let options = match args.cql.options(idemd::engine::Policy::default().max_ttl) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("idemd: invalid configuration: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".to_string());
    let owner = format!("{host}/{}", std::process::id());
    match runtime.block_on(idemd::store::cql::migrate::run(
        &options,
        &args.replication,
        &owner,
    )) {
        Ok(report) => {
            println!(
                "migrations applied by this run: {:?}; already applied: {:?}",
                report.applied, report.already_applied
            );
            if let Some(copied) = report.legacy_pending {
                println!(
                    "pending entries of older releases: {} found in {} pending_index partitions, {} copied to the bucketed index",
                    copied.entries, copied.partitions, copied.copied
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("idemd migrate: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Ends the process after a storage failure of the embedded store's write
/// path, with `message` (what happened and what to do) on stderr.
fn exit_on_storage_failure(message: &str) -> ! {
    tracing::error!("{message}");
    eprintln!("idemd: {message}");
    std::process::exit(1)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match cli.command {
        Some(Command::Serve(args)) => Settings::from_args(&args),
        Some(Command::Proxy(args)) => Settings::from_proxy_args(&args),
        Some(Command::Migrate(args)) => return migrate(&args),
        Some(Command::Audit(args)) => {
            let runtime = match runtime() {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            return match runtime.block_on(idemd::cli::audit(&args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("idemd audit: {error}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Keys(args)) => {
            let runtime = match runtime() {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            return match runtime.block_on(idemd::cli::keys::run(&args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("idemd keys: {error}");
                    ExitCode::from(error.exit_code())
                }
            };
        }
        Some(Command::Backup(args)) => {
            let runtime = match runtime() {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            return match runtime.block_on(idemd::cli::backup::backup(&args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("idemd backup: {error}");
                    ExitCode::from(error.exit_code())
                }
            };
        }
        Some(Command::Restore(args)) => {
            init_logging("warn", LogFormat::Human);
            let runtime = match runtime() {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            return match runtime.block_on(idemd::cli::backup::restore(&args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("idemd restore: {error}");
                    ExitCode::from(error.exit_code())
                }
            };
        }
        Some(Command::CopyToCql(args)) => {
            init_logging("warn", args.log_format);
            let runtime = match runtime() {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            return match runtime.block_on(idemd::cli::copy_to_cql::run(&args)) {
                Ok(_) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("idemd copy-to-cql: {error}");
                    ExitCode::from(error.exit_code())
                }
            };
        }
        None => Settings::from_args(&cli.serve),
    };
    let settings = match settings {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("idemd: invalid configuration: {error}");
            return ExitCode::from(2);
        }
    };
    init_logging(&settings.log, settings.log_format);
    // A process that a supervisor restarts recovers from a failed write
    // path by its restart's replay; see `idemd::store::embedded`.
    idemd::store::embedded::exit_on_storage_failure(exit_on_storage_failure);
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let result = runtime.block_on(async {
        // Tracing is an aid, not a dependency: a bad OTLP setting is logged
        // and the server runs without traces.
        let telemetry = match idemd::telemetry::init_from_env() {
            Ok(guard) => guard,
            Err(error) => {
                tracing::error!(%error, "traces are off");
                None
            }
        };
        let server = idemd::server::start(settings, Arc::new(SystemClock)).await?;
        let trigger = server.shutdown_trigger();
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = trigger.send(true);
        });
        let served = server.wait().await;
        if let Some(guard) = telemetry {
            // Flushing blocks on the exporter, which needs the runtime.
            let _ = tokio::task::spawn_blocking(move || guard.shutdown()).await;
        }
        served
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A file named by a flag that cannot be used (tokens, certificates,
        // mappings, keyring) is a configuration error like a bad flag.
        Err(error) if error.is_configuration() => {
            tracing::error!(%error, "invalid configuration");
            eprintln!("idemd: invalid configuration: {error}");
            ExitCode::from(2)
        }
        Err(error) => {
            tracing::error!(%error, "idemd stopped");
            eprintln!("idemd: {error}");
            ExitCode::FAILURE
        }
    }
}
