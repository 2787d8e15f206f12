//! Process life cycle: start-up, background tasks and graceful shutdown.
//!
//! Start-up order matters for orchestrators: the port is bound and
//! `grpc.health.v1` answers `NOT_SERVING` first; the store is opened next and
//! only then does health turn `SERVING` (Idempotency RPCs arriving before
//! that get `UNAVAILABLE`). On shutdown (SIGTERM/SIGINT, or
//! [`RunningServer::shutdown`]) health turns `NOT_SERVING`, the listener stops
//! accepting, in-flight RPCs get up to `drain_timeout` to finish, and the
//! store is closed, which commits every accepted write before the process
//! exits 0.
//!
//! Start-up is a sequence of named steps, each a function here:
//! `authenticator` and `watch_files` (every file read, before a port is
//! bound), `Listeners::bind` (every port), `serve_listeners` (health
//! NOT_SERVING, the gRPC router, the HTTP front doors), the store's open,
//! `build_engine`, health SERVING, `background` (the tasks beside
//! serving), and at the end `drain_and_close`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tonic_health::ServingStatus;

use crate::api::IdempotencyService;
use crate::audit::AuditLog;
use crate::audit::cql::CqlAuditLog;
use crate::audit::embedded::EmbeddedAuditLog;
use crate::auth::client_cert::{ClientTenants, MappingFileError};
use crate::auth::{Access, Authenticator};
use crate::clock::SharedClock;
use crate::config::{Settings, StoreSettings};
use crate::crypto::Keyring;
use crate::engine::Engine;
use crate::metrics::LabelGuard;
use crate::proto::v1 as pb;
use crate::reload::{ReloadEvents, Reloader};
use crate::store::cql::CqlStore;
use crate::store::cql::cutover::CutoverMark;
use crate::store::embedded::moved::MovedMarker;
use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::store::instrumented::InstrumentedStore;
use crate::store::{Store, StoreError};
use crate::tls::TlsServer;
use crate::web::Connection;
use background::Background;
use slot::EngineSlot;

pub mod admin;
mod background;
mod slot;

pub use admin::SERVICE_NAME;

/// A request on one of the HTTP front doors.
type HttpRequest = http::Request<hyper::body::Incoming>;

/// Largest gRPC message accepted: the largest stored response (4 MiB) or
/// request body (1 MiB) plus headroom for the other fields.
pub const MAX_MESSAGE_BYTES: usize = 5 * 1024 * 1024;

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The tokens file is invalid.
    #[error("auth tokens: {0}")]
    Auth(#[from] crate::auth::TokenFileError),
    /// The client-tenants mapping is invalid.
    #[error("tls client tenants: {0}")]
    ClientTenants(#[from] MappingFileError),
    /// The store could not be opened or closed.
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
    /// The gRPC transport failed.
    #[error("grpc transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Reflection could not be configured.
    #[error("reflection: {0}")]
    Reflection(String),
    /// A background task panicked.
    #[error("server task failed: {0}")]
    Task(String),
    /// A TLS file or setting is unusable.
    #[error("tls: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The encryption keyring is invalid.
    #[error("{0}")]
    Keyring(#[from] crate::crypto::KeyringError),
    /// The settings are invalid ([`Settings::validate`]).
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
}

impl ServerError {
    /// Whether the error is in the configuration (invalid settings, or a
    /// file a flag names is unusable) rather than in the
    /// environment (a busy port, an unreachable store): `idemd` exits 2 for
    /// these, as for an invalid flag.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            ServerError::Auth(_)
                | ServerError::ClientTenants(_)
                | ServerError::Tls(_)
                | ServerError::Keyring(_)
                | ServerError::Config(_)
        )
    }
}

/// A server that is running.
pub struct RunningServer {
    /// The gRPC port actually bound (useful with port 0); for `idemd
    /// proxy` without a gRPC port, the proxy's.
    pub local_addr: SocketAddr,
    /// The HTTP/JSON API's address, when it is on.
    pub http_addr: Option<SocketAddr>,
    /// The proxy's address, for `idemd proxy`.
    pub proxy_addr: Option<SocketAddr>,
    /// Triggers graceful shutdown.
    shutdown: watch::Sender<bool>,
    /// The serving task; resolves after the store is closed.
    task: JoinHandle<Result<(), ServerError>>,
    /// Outcomes of re-reading the watched files.
    reloads: ReloadEvents,
}

impl RunningServer {
    /// Asks the server to shut down gracefully and waits until it has.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        let _ = self.shutdown.send(true);
        self.wait().await
    }

    /// Outcomes of re-reading watched files (tokens, client tenants,
    /// certificates) from now on: tests wait on these instead of sleeping
    /// past the poll interval.
    pub fn reload_events(&self) -> ReloadEvents {
        self.reloads.clone()
    }

    /// A handle that triggers shutdown (e.g. from a signal handler).
    pub fn shutdown_trigger(&self) -> watch::Sender<bool> {
        self.shutdown.clone()
    }

    /// Waits until the server has stopped.
    pub async fn wait(self) -> Result<(), ServerError> {
        self.task
            .await
            .map_err(|e| ServerError::Task(e.to_string()))?
    }
}

/// The authenticator the settings ask for: tokens, client-certificate
/// tenants (mTLS), both, or neither (auth off), and the certificate mapping
/// to watch for changes. The rules are in [`crate::tls`].
fn authenticator(
    settings: &Settings,
) -> Result<(Authenticator, Option<ClientTenants>), ServerError> {
    // Combinations (a mapping without a client CA, ...) were refused by
    // `Settings::validate`.
    let mapping = settings
        .tls
        .as_ref()
        .and_then(|tls| tls.client_tenants.as_deref());
    let mut auth = match &settings.auth_tokens {
        Some(path) => Authenticator::from_file(path)?,
        None => Authenticator::disabled(),
    };
    let client_tenants = match mapping {
        Some(path) => Some(ClientTenants::from_file(path)?),
        None => None,
    };
    if let Some(client_tenants) = &client_tenants {
        auth = auth.with_client_tenants(client_tenants.clone());
    }
    let auth = auth.allowing_unauthenticated_remote(settings.allow_unauthenticated_remote);
    match auth.access() {
        Access::Credentials => {}
        Access::LoopbackOnly => tracing::info!(
            access = Access::LoopbackOnly.as_str(),
            "authentication is off (no --auth-tokens or --tls-client-tenants): protected mode, serving loopback callers only; callers from other addresses get PERMISSION_DENIED (set --allow-unauthenticated-remote to serve them without authentication)"
        ),
        Access::UnauthenticatedRemote => tracing::warn!(
            access = Access::UnauthenticatedRemote.as_str(),
            "AUTHENTICATION IS OFF AND REMOTE CALLERS ARE SERVED (--allow-unauthenticated-remote): any caller that reaches a port picks its tenant with x-tenant-id and can read, claim or release every tenant's keys; use only on a network you trust"
        ),
    }
    Ok((auth, client_tenants))
}

/// One watcher for every file read at start-up (see `crate::reload`): the
/// TLS certificates, the tokens, the client-certificate tenants and the
/// keyring. A keyring the store factory loads itself is not reloaded, but
/// one that does not load fails start-up here, before a port is bound.
fn watch_files(
    settings: &Settings,
    tls: Option<&TlsServer>,
    auth: &Authenticator,
    client_tenants: Option<ClientTenants>,
    keyring: Option<Arc<Keyring>>,
) -> Result<Reloader, ServerError> {
    let mut reloader = Reloader::new(settings.reload_interval);
    if let Some(tls) = tls {
        reloader.add(Arc::new(tls.clone()));
    }
    if let Some(source) = auth.tokens_source() {
        reloader.add(source);
    }
    if let Some(client_tenants) = client_tenants {
        reloader.add(Arc::new(client_tenants));
    }
    match keyring {
        Some(keyring) => reloader.add(keyring),
        None if settings.encryption_keys.is_some() => {
            settings.load_keyring()?;
        }
        None => {}
    }
    Ok(reloader)
}

/// Opens the store the settings name, sealing stored responses with the
/// keyring of `--encryption-keys` when it is set.
pub async fn open_store(settings: &Settings) -> Result<Arc<dyn Store>, ServerError> {
    open_store_with(settings, settings.load_keyring()?).await
}

/// Opens the store the settings name, sealing stored responses with
/// `keyring` (the instance the reloader keeps current).
async fn open_store_with(
    settings: &Settings,
    keyring: Option<Arc<Keyring>>,
) -> Result<Arc<dyn Store>, ServerError> {
    match &settings.store {
        StoreSettings::Embedded => {
            // A store `idemd copy-to-cql` moved is refused unless told
            // (store::embedded::moved): its keys live in the cluster now.
            if let Some(mark) =
                MovedMarker::before_serving(&settings.data_dir, settings.allow_moved_store)?
            {
                tracing::warn!(
                    keyspace = %mark.keyspace,
                    moved_at = %mark.moved_at,
                    "serving an embedded store that was moved to a CQL keyspace (--allow-moved-store); its mark is removed"
                );
            }
            let mut options = EmbeddedOptions::new(settings.data_dir.clone());
            options.cache_bytes = settings.store_cache_bytes;
            options.scrub = settings.store_scrub;
            options.keyring = keyring;
            let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(&options))
                .await
                .map_err(|e| ServerError::Task(e.to_string()))??;
            Ok(Arc::new(store))
        }
        StoreSettings::Cql(options) => {
            let store = CqlStore::open_with_keyring(options, keyring).await?;
            // A keyspace `idemd copy-to-cql` is still filling is refused
            // (store::cql::cutover): its keys are not all there yet.
            if let Some(mark) = CutoverMark::read(store.session(), &options.keyspace).await? {
                let _ = store.close().await;
                return Err(StoreError::Unavailable(mark.refusal(&options.keyspace)).into());
            }
            Ok(Arc::new(store))
        }
    }
}

/// Opens the audit log beside the store the settings name, when some
/// endpoint is audited (otherwise there is nothing to write, and the
/// embedded backend creates no file).
pub async fn open_audit(settings: &Settings) -> Result<Option<Arc<dyn AuditLog>>, ServerError> {
    if !settings.policies.any_audited() {
        return Ok(None);
    }
    let retention = settings.audit_retention;
    let audit: Arc<dyn AuditLog> = match &settings.store {
        StoreSettings::Embedded => {
            let data_dir = settings.data_dir.clone();
            Arc::new(
                tokio::task::spawn_blocking(move || EmbeddedAuditLog::open(&data_dir, retention))
                    .await
                    .map_err(|e| ServerError::Task(e.to_string()))??,
            )
        }
        StoreSettings::Cql(options) => Arc::new(CqlAuditLog::open(options, retention).await?),
    };
    Ok(Some(audit))
}

/// Binds, opens the store the settings name and starts serving. Returns
/// once the store is open and the service is `SERVING`.
pub async fn start(settings: Settings, clock: SharedClock) -> Result<RunningServer, ServerError> {
    // One keyring instance, the store's: the reloader swaps its keys on
    // SIGHUP and when the file changes, so rotation needs no restart.
    settings.validate()?;
    let keyring = settings.load_keyring()?;
    let for_store = settings.clone();
    let store_keyring = keyring.clone();
    let open = async move { open_store_with(&for_store, store_keyring).await };
    start_inner(settings, clock, open, keyring).await
}

/// Like [`start`], with the store produced by `open_store`, which is polled
/// once the port is bound and health answers `NOT_SERVING`. The store's
/// keyring, if any, is the factory's: it is not reloaded.
pub async fn start_with_store<F>(
    settings: Settings,
    clock: SharedClock,
    open_store: F,
) -> Result<RunningServer, ServerError>
where
    F: std::future::Future<Output = Result<Arc<dyn Store>, ServerError>> + Send + 'static,
{
    start_inner(settings, clock, open_store, None).await
}

async fn start_inner<F>(
    settings: Settings,
    clock: SharedClock,
    open_store: F,
    keyring: Option<Arc<Keyring>>,
) -> Result<RunningServer, ServerError>
where
    F: std::future::Future<Output = Result<Arc<dyn Store>, ServerError>> + Send + 'static,
{
    // Settings built in code (tests, embedders) get the checks
    // `Settings::from_args` applies to flags.
    settings.validate()?;
    // TLS files and the authenticator first: a bad certificate or mapping
    // fails start-up, naming the file, before the port is bound.
    let tls = match &settings.tls {
        Some(tls) => Some(TlsServer::new(tls)?),
        None => None,
    };
    let (auth, client_tenants) = authenticator(&settings)?;
    let reloader = watch_files(&settings, tls.as_ref(), &auth, client_tenants, keyring)?;
    let reloads = reloader.events();
    if let Some(address) = settings.metrics_listen {
        // Metrics are secondary to serving: a busy metrics port is logged
        // loudly, not fatal.
        if let Err(error) = crate::metrics::install_exporter(address) {
            tracing::error!(%address, %error, "metrics exporter not started");
        }
    }
    // Every port is bound before the store opens, so a busy port fails
    // start-up at once and orchestrators see the ports early.
    let listeners = Listeners::bind(&settings).await?;
    let (grpc_addr, http_addr, proxy_addr) = listeners.addresses();
    let local_addr = grpc_addr
        .or(proxy_addr)
        .or(http_addr)
        .ok_or_else(|| ServerError::Task("no listener".to_string()))?;
    let slot = EngineSlot::new(settings.limits.max_in_flight);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (mut serving, health) = serve_listeners(
        listeners,
        &settings,
        tls.as_ref(),
        &auth,
        &slot,
        &shutdown_rx,
    )
    .await?;

    let store: Arc<dyn Store> = match open_store.await {
        Ok(store) => Arc::new(InstrumentedStore::new(store)),
        Err(error) => {
            serving.abort_all();
            return Err(error);
        }
    };
    let audit = match open_audit(&settings).await {
        Ok(audit) => audit,
        Err(error) => {
            serving.abort_all();
            return Err(error);
        }
    };
    let engine = build_engine(&settings, &store, audit.as_ref(), clock).await;
    let labels = Arc::new(LabelGuard::new(
        settings.metrics_label_caps.0,
        settings.metrics_label_caps.1,
    ));
    let service = IdempotencyService::new(Arc::clone(&engine), auth.clone(), Arc::clone(&labels));
    if slot.service.set(service).is_err() {
        return Err(ServerError::Task("engine initialized twice".to_string()));
    }
    admin::set_health(&health, ServingStatus::Serving).await;
    let show =
        |address: Option<SocketAddr>| address.map_or_else(|| "off".to_string(), |a| a.to_string());
    tracing::info!(
        address = %local_addr,
        grpc = %show(grpc_addr),
        http = %show(http_addr),
        proxy = %show(proxy_addr),
        store = store.backend_name(),
        auth = auth.is_enabled(),
        access = auth.access().as_str(),
        audit = audit.is_some(),
        traces = crate::telemetry::enabled(),
        "idemd serving"
    );

    let background = Background::start(
        &settings,
        &engine,
        &store,
        &health,
        (&auth, labels),
        reloader,
    );
    let task = tokio::spawn(drain_and_close(
        serving,
        shutdown_rx,
        settings.drain_timeout,
        background,
        store,
        audit,
    ));
    Ok(RunningServer {
        local_addr,
        http_addr,
        proxy_addr,
        shutdown: shutdown_tx,
        task,
        reloads,
    })
}

/// Serves every bound port, each calling `slot` (filled once the engine
/// exists): the gRPC router (health, reflection v1 and v1alpha,
/// Idempotency, Audit; over TLS when configured), the API over HTTP/JSON
/// and the proxy. Health answers NOT_SERVING from the start, and again once
/// `shutdown` turns true, when every listener drains its connections.
async fn serve_listeners(
    listeners: Listeners,
    settings: &Settings,
    tls: Option<&TlsServer>,
    auth: &Authenticator,
    slot: &EngineSlot,
    shutdown: &watch::Receiver<bool>,
) -> Result<
    (
        JoinSet<Result<(), ServerError>>,
        tonic_health::server::HealthReporter,
    ),
    ServerError,
> {
    let Listeners {
        grpc: grpc_listener,
        http: http_listener,
        proxy: proxy_listener,
    } = listeners;

    let (health, health_service) = tonic_health::server::health_reporter();
    admin::set_health(&health, ServingStatus::NotServing).await;
    // Reflection in both versions, like grpc-go: grpcurl asks v1, but ghz,
    // Evans and older grpcurl builds ask only v1alpha.
    let reflection_builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = reflection_builder()
        .build_v1()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;

    let idempotency = pb::idempotency_server::IdempotencyServer::new(slot.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let audit_service = pb::audit_server::AuditServer::new(slot.clone());

    let mut shutdown_rx = shutdown.clone();
    let drain_rx = shutdown.clone();
    let health_on_shutdown = health.clone();
    let accept_rx = shutdown.clone();
    // No `.tcp_nodelay(true)` here: tonic ignores it with
    // `serve_with_incoming`; the sockets come from `crate::net`, which sets it.
    let router = tonic::transport::Server::builder()
        // Dead peers are detected without waiting for TCP timeouts.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(idempotency)
        .add_service(audit_service);
    let signal = async move {
        let _ = shutdown_rx.wait_for(|stop| *stop).await;
        admin::set_health(&health_on_shutdown, ServingStatus::NotServing).await;
        tracing::info!("shutting down: draining in-flight requests");
    };
    // Every listener's serving task; on shutdown each drains its own
    // connections, all within the one drain timeout below.
    let mut serving: JoinSet<Result<(), ServerError>> = JoinSet::new();
    if let Some((listener, _)) = grpc_listener {
        type Serving =
            std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;
        let serve: Serving = match tls {
            // Our acceptor does the TLS handshakes (see `crate::tls` for why
            // not tonic's); tonic serves the finished streams.
            Some(tls) => Box::pin(
                router.serve_with_incoming_shutdown(tls.incoming(listener, accept_rx), signal),
            ),
            None => Box::pin(
                router.serve_with_incoming_shutdown(crate::net::incoming(listener), signal),
            ),
        };
        serving.spawn(async move { serve.await.map_err(ServerError::from) });
    } else {
        serving.spawn(async move {
            signal.await;
            Ok(())
        });
    }
    if let Some((listener, _)) = http_listener {
        let services = slot.clone();
        let handler = move |request: HttpRequest, connection: Connection| {
            let services = services.clone();
            async move { crate::web::api::handle(&services, request, &connection).await }
        };
        let shutdown = drain_rx.clone();
        let tls = tls.cloned();
        let auth = auth.clone();
        serving.spawn(async move {
            crate::web::serve::serve(listener, tls, shutdown, auth, handler).await;
            Ok(())
        });
    }
    if let (Some((listener, _)), Some(proxy)) = (proxy_listener, &settings.proxy) {
        let proxy = crate::web::proxy::Proxy::new(slot.clone(), proxy)?;
        let handler = move |request: HttpRequest, connection: Connection| {
            let proxy = proxy.clone();
            async move { proxy.handle(request, connection).await }
        };
        let shutdown = drain_rx.clone();
        let tls = tls.cloned();
        let auth = auth.clone();
        serving.spawn(async move {
            crate::web::serve::serve(listener, tls, shutdown, auth, handler).await;
            Ok(())
        });
    }

    Ok((serving, health))
}

/// The engine over `store` with the settings' policies, cache and claim
/// limit, writing `audit` if some endpoint is audited. Measures the clock
/// offset first: on a shared store a replica that has not measured its
/// clock grants no lease (`engine::skew`).
async fn build_engine(
    settings: &Settings,
    store: &Arc<dyn Store>,
    audit: Option<&Arc<dyn AuditLog>>,
    clock: SharedClock,
) -> Arc<Engine> {
    let mut engine = Engine::new(
        Arc::clone(store),
        clock,
        Arc::new(settings.policies.clone()),
        settings.cache_bytes,
    )
    .with_claim_limit(settings.limits.claim_rate, settings.limits.claim_burst);
    if let Some(audit) = audit {
        engine = engine.with_audit(Arc::clone(audit));
    }
    if let Err(error) = engine.measure_clock().await {
        tracing::warn!(%error, "clock offset not measured at start; leases wait for the next try");
    }
    Arc::new(engine)
}

/// The ports the settings ask for, bound (each with the address it got).
struct Listeners {
    /// The gRPC port (`--listen`), off for `idemd proxy`.
    grpc: Option<(TcpListener, SocketAddr)>,
    /// The API over HTTP/JSON (`--http-listen`).
    http: Option<(TcpListener, SocketAddr)>,
    /// `idemd proxy`'s port.
    proxy: Option<(TcpListener, SocketAddr)>,
}

impl Listeners {
    /// Binds every port the settings name; the first busy one fails.
    async fn bind(settings: &Settings) -> Result<Self, ServerError> {
        let grpc = match settings.listen {
            Some(address) => Some(bind(address).await?),
            None => None,
        };
        let http = match settings.http_listen {
            Some(address) => Some(bind(address).await?),
            None => None,
        };
        let proxy = match &settings.proxy {
            Some(proxy) => Some(bind(proxy.listen).await?),
            None => None,
        };
        Ok(Self { grpc, http, proxy })
    }

    /// The bound addresses: gRPC, HTTP/JSON, proxy.
    fn addresses(&self) -> (Option<SocketAddr>, Option<SocketAddr>, Option<SocketAddr>) {
        let address = |listener: &Option<(TcpListener, SocketAddr)>| {
            listener.as_ref().map(|(_, address)| *address)
        };
        (
            address(&self.grpc),
            address(&self.http),
            address(&self.proxy),
        )
    }
}

/// The end of a server's life: waits until every listener has drained
/// (or `drain_timeout` after shutdown was asked), stops the background
/// tasks, then closes the store, which commits every accepted write, and
/// the audit log. The first listener error is reported after the close:
/// committing what was accepted matters more than a transport error.
async fn drain_and_close(
    mut serving: JoinSet<Result<(), ServerError>>,
    mut drain_rx: watch::Receiver<bool>,
    drain_timeout: Duration,
    background: Background,
    store: Arc<dyn Store>,
    audit: Option<Arc<dyn AuditLog>>,
) -> Result<(), ServerError> {
    let drain_deadline = async {
        let _ = drain_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(drain_timeout).await;
    };
    // The first error of any listener, or Ok once all have drained.
    let all_served = async {
        let mut outcome = Ok(Ok(()));
        while let Some(result) = serving.join_next().await {
            match result {
                Ok(Ok(())) => {}
                failed => {
                    outcome = failed;
                    break;
                }
            }
        }
        outcome
    };
    let served = tokio::select! {
        result = all_served => result,
        () = drain_deadline => {
            tracing::warn!(timeout = ?drain_timeout, "drain timeout: abandoning in-flight requests");
            Ok(Ok(()))
        }
    };
    serving.abort_all();
    background.abort();
    let closed = store.close().await;
    let audit_closed = match &audit {
        Some(audit) => audit.close().await,
        None => Ok(()),
    };
    tracing::info!("store closed; bye");
    served.map_err(|e| ServerError::Task(e.to_string()))??;
    closed?;
    audit_closed?;
    Ok(())
}

/// Binds `address`, returning the listener and the address bound.
async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}
