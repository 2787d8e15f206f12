//! The `idemd` binary: parses configuration, sets up logging, runs the
//! server until SIGTERM/SIGINT.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use idemd::clock::SystemClock;
use idemd::config::{Cli, Command, LogFormat, Settings};

fn init_logging(settings: &Settings) {
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match settings.log_format {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(args)) => args,
        None => cli.serve,
    };
    let settings = match Settings::from_args(&args) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("idemd: invalid configuration: {error}");
            return ExitCode::from(2);
        }
    };
    init_logging(&settings);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idemd: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let server = idemd::server::start(settings, Arc::new(SystemClock)).await?;
        let trigger = server.shutdown_trigger();
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = trigger.send(true);
        });
        server.wait().await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "idemd stopped");
            eprintln!("idemd: {error}");
            ExitCode::FAILURE
        }
    }
}
