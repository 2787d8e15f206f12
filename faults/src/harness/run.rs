//! One scenario's run: its servers started, the careful clients spread
//! over them, and at the end the heal, the final reads and the verdict.
//! A scenario injects its fault between [`Run::start`] and
//! [`Run::finish`]; everything around the fault is the same for all.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::harness::history::{DataLoss, History};
use crate::harness::report::Report;
use crate::harness::workload::{self, Load};
use crate::plumbing::server::Server;

/// What every scenario runs against, from the command line.
#[derive(Debug, Clone)]
pub struct Setup<'a> {
    /// The idemd binary under test.
    pub bin: &'a Path,
    /// The careful clients' settings (the CQL scenarios' wait longer).
    pub load: Load,
    /// Where each server's log goes (kept with `--log-dir`).
    pub log_dir: &'a Path,
}

/// What every scenario starts from: a server, the history, the workers.
pub struct Run {
    /// The idemd replicas (one on the embedded store): what the scenario
    /// kills, pauses and restarts.
    pub servers: Vec<Server>,
    /// What the clients saw: the scenario marks its phases in it.
    pub history: Arc<History>,
    /// Set when the workers must finish.
    stop: Arc<AtomicBool>,
    /// The workers, joined once they have finished their calls.
    workers: Option<tokio::task::JoinHandle<()>>,
    /// When the load began: the report's wall time.
    pub started: Instant,
    /// The servers' data directories, removed with the run.
    _dir: tempfile::TempDir,
}

impl Run {
    /// One server on the embedded store in a fresh data directory, and the
    /// workers on it.
    pub async fn start(setup: &Setup<'_>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let server = Server::new(
            setup.bin,
            &dir.path().join("data"),
            setup.log_dir,
            Vec::new(),
        )?;
        Self::start_with(vec![server], &setup.load, dir).await
    }

    /// Starts `servers` and the workers, which spread over them; `dir`
    /// (the servers' data) lives as long as the run.
    pub async fn start_with(
        servers: Vec<Server>,
        load: &Load,
        dir: tempfile::TempDir,
    ) -> anyhow::Result<Self> {
        let all: Vec<usize> = (0..servers.len()).collect();
        Self::start_some(servers, &all, load, dir).await
    }

    /// [`Self::start_with`], starting only the servers at `started`; the
    /// workers know every server's address from the start and the scenario
    /// starts the others later (`cutover`: the cluster's replica).
    pub async fn start_some(
        mut servers: Vec<Server>,
        started: &[usize],
        load: &Load,
        dir: tempfile::TempDir,
    ) -> anyhow::Result<Self> {
        for i in started {
            servers[*i].start().await?;
        }
        let history = Arc::new(History::default());
        history.phase("load");
        let addresses = Arc::new(servers.iter().map(|s| s.address.clone()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let workers = tokio::spawn(workload::run(
            addresses,
            load.clone(),
            Arc::clone(&history),
            Arc::clone(&stop),
        ));
        Ok(Self {
            servers,
            history,
            stop,
            workers: Some(workers),
            started: Instant::now(),
            _dir: dir,
        })
    }

    /// Stops the workers and waits until each has finished its call in
    /// progress (retrying within the heal budget): after this, the history
    /// holds everything the clients will ever see.
    pub async fn stop_clients(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(workers) = self.workers.take() {
            workers.await?;
        }
        Ok(())
    }

    /// Healed: a second of load without faults, then every worker finishes
    /// its call; then the final reads, the verdict (a key answered
    /// `DATA_LOSS` counts as lost: only `corrupt-page` damages data on
    /// purpose, and it judges without this) and the servers stopped.
    pub async fn finish(
        mut self,
        scenario: &str,
        injected: String,
        recovery_ms: Vec<u64>,
        notes: Vec<String>,
    ) -> anyhow::Result<Report> {
        self.history.phase("healed");
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.stop_clients().await?;
        self.history.phase("check");
        let finals = workload::finals(&self.servers[0].address, &self.history).await?;
        let verdict = self.history.verdict(&finals, DataLoss::IsLoss);
        for server in &mut self.servers {
            let _ = server.stop().await;
        }
        Ok(Report {
            scenario: scenario.to_string(),
            injected,
            verdict,
            recovery_ms,
            notes,
            seconds: self.started.elapsed().as_secs_f64(),
        })
    }
}
