//! Every limit and default of the configuration, defined once: the flags
//! (`args`), the policy files (`policies`, `routes`) and the settings
//! (`Settings`) all read them here.

use std::net::SocketAddr;
use std::time::Duration;

/// Largest `max_response_bytes` a policy may set: a stored response must fit
/// in one gRPC message with room to spare.
pub const MAX_RESPONSE_BYTES_LIMIT: usize = 4 * 1024 * 1024;

/// Longest `max_wait` a policy may set: a waiting Claim holds an RPC open.
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Default memory of the completed-record cache. Together with
/// [`crate::store::embedded::DEFAULT_CACHE_BYTES`] (the store's page cache) this is most of what idemd's memory use
/// depends on: with both at their defaults a server under 1,000 concurrent
/// requests stays under 64 MiB resident (docs/benchmarks.md, P5). Replays of
/// keys that fall out of the cache are read from the store, not lost. 4 MiB
/// (~2,700 completed records of 1 KiB) rather than 8: it covers the retries
/// that follow a completion within seconds, and 8 MiB put P5 at 71 MiB
/// (4 MiB with the page cache at 4 MiB too: 61.5); a replica that serves
/// many replays of older keys from a CQL store is given more (the chart's
/// `server.cacheBytes`).
pub const DEFAULT_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Default of `--allow-unauthenticated-remote`: off, so that a server
/// started without credentials (`cargo run`, a bare `idemd serve`) answers
/// only callers on its own machine, whatever address it listens on (see
/// [`crate::auth`], "protected mode").
pub const DEFAULT_ALLOW_UNAUTHENTICATED_REMOTE: bool = false;

/// Default gRPC listen address.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    50051,
));

/// Default listen address of `idemd proxy`.
pub const DEFAULT_PROXY_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    8081,
));

/// Default directory of the embedded store.
pub const DEFAULT_DATA_DIR: &str = "./data";

/// Default `/metrics` address.
pub const DEFAULT_METRICS_LISTEN: &str = "0.0.0.0:9464";

/// Default cap on distinct tenant (and, separately, endpoint) label values.
pub const DEFAULT_METRICS_MAX_LABELS: usize = 100;

/// Default time in-flight RPCs get after SIGTERM.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Default period of the expired-record sweeper.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// Default new keys per second per tenant.
pub const DEFAULT_CLAIM_RATE: f64 = 10_000.0;

/// Default burst of new keys per tenant.
pub const DEFAULT_CLAIM_BURST: u32 = 20_000;

/// Default RPCs in progress before shedding.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 10_000;

/// Default log filter.
pub const DEFAULT_LOG: &str = "info";

/// Smallest store page cache accepted: below a few hundred pages every
/// B-tree descent reads from the file.
pub const MIN_STORE_CACHE_BYTES: usize = 1024 * 1024;

/// Shortest `--reload-interval`: each check stats every watched file.
pub const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(10);
