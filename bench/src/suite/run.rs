//! `idemd-bench run`: one system, one workload, one measurement, printed
//! (and written as JSON).

use std::sync::Arc;

use anyhow::{Context, Result, bail};

use super::lineup::{Running, start_system, stop_all};
use super::options::{RunArgs, SystemKind};
use crate::load;
use crate::report::Measurement;
use crate::systems::{Client, Grpc};

/// Runs one measurement; false when it saw errors or violations.
pub async fn run(args: RunArgs) -> Result<bool> {
    let system = match &args.target {
        Some(url) => {
            if !matches!(
                args.system,
                SystemKind::Noop | SystemKind::IdemdEmbedded | SystemKind::IdemdCql
            ) {
                bail!("--target only applies to gRPC systems");
            }
            Running {
                kind: args.system,
                server: None,
                client: Arc::new(Client::Grpc(
                    Grpc::connect(url, args.common.connections).await?,
                )),
                grpc: None,
                sample: Vec::new(),
                connections: args.common.connections,
            }
        }
        None => start_system(args.system, &args.common).await?,
    };
    let mut spec = system.spec(&args.common, args.workload);
    spec.rate = args.rate;
    let concurrency = spec.concurrency;
    let result = load::run(Arc::clone(&system.client), &spec).await;
    let connections = system.connections;
    stop_all(vec![system]).await;
    let result = result?;
    let measurement = Measurement::new(
        args.system.name(),
        args.workload,
        0,
        args.rate,
        concurrency,
        connections,
        &result,
    );
    println!("{}", measurement.line());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&measurement)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(measurement.errors + measurement.errors_outside_window == 0 && measurement.violations == 0)
}
