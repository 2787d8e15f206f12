//! How the suite reaches an idemd: one tenant and one endpoint for every
//! scenario (auth is off), and channels that reconnect by themselves, so a
//! client follows a server through its restarts.

use std::time::Duration;

use tonic::Request;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

/// The tenant every scenario uses (auth is off).
pub const TENANT: &str = "faults";
/// The endpoint every scenario uses.
pub const ENDPOINT: &str = "POST /v1/faults";

/// A channel to `address` that reconnects by itself.
pub fn channel(address: &str, rpc_timeout: Duration) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{address}"))?
        .timeout(rpc_timeout)
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .connect_lazy())
}

/// `message` as the suite's tenant sends it.
pub fn request<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("x-tenant-id", MetadataValue::from_static(TENANT));
    request
}
