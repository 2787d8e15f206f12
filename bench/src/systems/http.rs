//! idemd's HTTP/JSON port (`--http-listen`): the same Claim and Complete
//! as the gRPC client, as proto3 JSON over HTTP/1.1 keep-alive connections.

use anyhow::{Context, Result, bail};

use super::workload::{ClaimOutcome, ENDPOINT, FINGERPRINT, RESPONSE_BODY};

/// One HTTP/1.1 keep-alive connection: one request at a time.
type HttpConnection =
    tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>>;

/// Client of idemd's HTTP/JSON port over `connections` HTTP/1.1
/// connections (one request at a time each, so this is its parallelism,
/// as for Postgres).
pub struct Http {
    connections: Vec<HttpConnection>,
    /// `host:port`, for the Host header.
    authority: String,
    /// The fixed fingerprint, base64 (proto3 JSON `bytes`).
    sha256: String,
}

impl Http {
    /// Opens `connections` connections to `address`.
    pub async fn connect(address: std::net::SocketAddr, connections: usize) -> Result<Self> {
        use base64::Engine as _;
        let mut opened = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            let stream = tokio::net::TcpStream::connect(address)
                .await
                .with_context(|| format!("connecting to {address}"))?;
            stream.set_nodelay(true)?;
            let (sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .context("HTTP/1.1 handshake")?;
            tokio::spawn(connection);
            opened.push(tokio::sync::Mutex::new(sender));
        }
        Ok(Self {
            connections: opened,
            authority: address.to_string(),
            sha256: base64::engine::general_purpose::STANDARD.encode(FINGERPRINT),
        })
    }

    async fn post(
        &self,
        path: &str,
        body: serde_json::Value,
        worker: usize,
    ) -> Result<serde_json::Value> {
        use http_body_util::BodyExt as _;
        let request = hyper::Request::post(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header("x-tenant-id", "bench")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                serde_json::to_vec(&body)?,
            )))?;
        let mut sender = self.connections[worker % self.connections.len()]
            .lock()
            .await;
        sender.ready().await.context("HTTP connection closed")?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        drop(sender);
        if !status.is_success() {
            bail!("{path}: {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(serde_json::from_slice(&bytes)?)
    }

    pub(super) async fn claim(&self, key: &str, worker: usize) -> Result<ClaimOutcome> {
        let body = serde_json::json!({"endpoint": ENDPOINT, "key": key, "sha256": self.sha256});
        let response = self.post("/v1/claim", body, worker).await?;
        if let Some(token) = response["claimed"]["leaseToken"].as_str() {
            return Ok(ClaimOutcome::Won(token.to_string()));
        }
        if response.get("replayed").is_some() {
            return Ok(ClaimOutcome::Replayed);
        }
        if response.get("inProgress").is_some() || response.get("pending").is_some() {
            return Ok(ClaimOutcome::Busy);
        }
        bail!("claim of {key} answered {response}")
    }

    pub(super) async fn complete(&self, key: &str, token: &str, worker: usize) -> Result<()> {
        use base64::Engine as _;
        let body = serde_json::json!({
            "endpoint": ENDPOINT,
            "key": key,
            "leaseToken": token,
            "response": {
                "status": 201,
                "headers": [{"name": "content-type", "value": "application/json"}],
                "body": base64::engine::general_purpose::STANDARD.encode(RESPONSE_BODY),
            },
        });
        self.post("/v1/complete", body, worker).await.map(drop)
    }
}
