//! The tasks that run beside serving (the sweeper, the store's upkeep, the
//! damage watch, the admin socket, the pending gauges, the file watcher),
//! started together once the engine exists and stopped together at
//! shutdown, before the store closes.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tonic_health::server::HealthReporter;

use super::admin;
use crate::auth::Authenticator;
use crate::config::{Settings, StoreSettings};
use crate::engine::Engine;
use crate::metrics::LabelGuard;
use crate::reload::Reloader;
use crate::store::Store;

/// The running background tasks; `None` where the settings turn one off.
pub(super) struct Background {
    /// Deletes expired records every `sweep_interval`.
    sweeper: JoinHandle<()>,
    /// Turns health NOT_SERVING when the store finds damage.
    damage_watch: JoinHandle<()>,
    /// The embedded store's admin socket (`idemd backup`).
    admin: Option<JoinHandle<()>>,
    /// The store's upkeep (CQL: the pending index's sealer).
    maintenance: Option<JoinHandle<()>>,
    /// The pending gauges, only when metrics are exported.
    pending_gauges: Option<JoinHandle<()>>,
    /// Re-reads the watched files.
    watcher: Option<JoinHandle<()>>,
}

impl Background {
    /// Starts every task the settings ask for.
    pub(super) fn start(
        settings: &Settings,
        engine: &Arc<Engine>,
        store: &Arc<dyn Store>,
        health: &HealthReporter,
        (auth, labels): (&Authenticator, Arc<LabelGuard>),
        reloader: Reloader,
    ) -> Self {
        // Backups of the embedded store are asked for on its data
        // directory's admin socket; serving goes on without it (logged) if
        // it cannot bind.
        let admin = match &settings.store {
            StoreSettings::Embedded => admin::serve(&settings.data_dir, Arc::clone(store))
                .map_err(|error| tracing::error!(%error, data_dir = %settings.data_dir.display(), "admin socket unavailable: `idemd backup` cannot reach this server"))
                .ok(),
            StoreSettings::Cql(_) => None,
        };
        Self {
            sweeper: tokio::spawn(sweep_forever(Arc::clone(engine), settings.sweep_interval)),
            damage_watch: tokio::spawn(admin::not_serving_on_damage(
                Arc::clone(store),
                health.clone(),
            )),
            admin,
            maintenance: engine
                .store_maintenance_interval()
                .map(|every| tokio::spawn(maintain_forever(Arc::clone(engine), every))),
            // The pending gauges cost store reads: only when metrics are
            // exported.
            pending_gauges: settings.metrics_listen.map(|_| {
                tokio::spawn(refresh_pending_gauges(
                    Arc::clone(engine),
                    auth.clone(),
                    labels,
                ))
            }),
            watcher: (!reloader.is_empty()).then(|| tokio::spawn(reloader.run())),
        }
    }

    /// Stops every task (none holds anything the store's close needs).
    pub(super) fn abort(self) {
        self.sweeper.abort();
        self.damage_watch.abort();
        for task in [
            self.admin,
            self.maintenance,
            self.pending_gauges,
            self.watcher,
        ]
        .into_iter()
        .flatten()
        {
            task.abort();
        }
    }
}

/// How often the pending gauges are recomputed from the pending index.
const PENDING_GAUGE_INTERVAL: Duration = Duration::from_secs(15);

/// Most pending records read per tenant per refresh (the gauges saturate
/// beyond it; ListPending shows the rest).
const PENDING_GAUGE_MAX_RECORDS: usize = 10_000;

/// Keeps `idemd_pending_records` and `idemd_pending_oldest_age_seconds`
/// current for every tenant this replica knows (from the tokens file and
/// from traffic).
async fn refresh_pending_gauges(engine: Arc<Engine>, auth: Authenticator, labels: Arc<LabelGuard>) {
    let mut ticker = tokio::time::interval(PENDING_GAUGE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let mut tenants = auth.tenants();
        tenants.extend(labels.tenants());
        tenants.sort();
        tenants.dedup();
        for tenant in tenants
            .into_iter()
            .filter(|t| t != crate::metrics::OVERFLOW_VALUE)
        {
            match engine
                .pending_summary(&tenant, PENDING_GAUGE_MAX_RECORDS)
                .await
            {
                Ok(summary) => {
                    for (state, count) in summary.counts {
                        metrics::gauge!(crate::metrics::PENDING_RECORDS, "tenant" => tenant.clone(), "state" => state)
                            .set(count as f64);
                    }
                    metrics::gauge!(crate::metrics::PENDING_OLDEST_AGE, "tenant" => tenant.clone())
                        .set(summary.oldest_age.as_secs_f64());
                }
                Err(error) => tracing::warn!(%tenant, %error, "refreshing pending gauges failed"),
            }
        }
    }
}

/// The store's upkeep (CQL: sealing the pending index), on every replica;
/// the store makes concurrent runs safe.
async fn maintain_forever(engine: Arc<Engine>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(error) = engine.maintain_store().await {
            tracing::warn!(%error, "store maintenance failed");
        }
    }
}

async fn sweep_forever(engine: Arc<Engine>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match engine.sweep_expired().await {
            Ok(0) => {}
            Ok(removed) => tracing::debug!(removed, "swept expired records"),
            Err(error) => tracing::warn!(%error, "sweeping expired records failed"),
        }
    }
}
