//! HTTP helpers for the front-door tests: a real HTTP/1.1 client and an
//! upstream service that counts what it executes.
//!
//! The upstream is written on raw TCP rather than on an HTTP library so
//! tests control exactly what reaches the wire: it can answer slowly,
//! answer 500, or die half-way through a response.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// An HTTP answer as a client sees it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Headers (names lower case; the last value of repeated ones).
    pub headers: HashMap<String, String>,
    /// Body bytes.
    pub body: Bytes,
}

impl Answer {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// Sends one request and reads the whole answer.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    try_send(addr, method, path, headers, body)
        .await
        .unwrap_or_else(|e| panic!("HTTP request: {e}"))
}

/// Sends one request and reads the whole answer, or says why there was
/// none (the connection closed before a complete answer).
pub async fn try_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Answer, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::copy_from_slice(body)))
        .expect("request");
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Answer {
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_string(),
                    value.to_str().unwrap_or("").to_string(),
                )
            })
            .collect(),
        body,
    })
}

/// What the upstream saw and did.
#[derive(Debug, Default)]
pub struct Seen {
    /// Requests executed, by path.
    pub executions: HashMap<String, usize>,
    /// Headers of the last request, by path.
    pub last_headers: HashMap<String, HashMap<String, String>>,
}

/// An upstream HTTP service that counts executions per path: the app of
/// `clients/conformance/http-scenarios.md`, which every SDK middleware's
/// test app copies. Paths:
/// * `.../slow/...`: answers after [`Upstream::SLOW`];
/// * `.../fail/...`: answers 500;
/// * `/crash/...` and `/crash-exposed/...`: sends the head and part of the
///   body, then closes;
/// * `/big/...`: answers 64 KiB;
/// * anything else: 201 with a JSON body naming the execution, a
///   `location` and a `set-cookie` header.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Its address.
    pub addr: SocketAddr,
    /// What it saw.
    pub seen: Arc<Mutex<Seen>>,
}

impl Upstream {
    /// How long `/slow/...` takes.
    pub const SLOW: Duration = Duration::from_millis(600);

    /// Starts it on a port of its own.
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = Arc::clone(&seen);
        tokio::spawn(async move {
            let mut incoming = Box::pin(idemd::net::incoming(listener));
            while let Some(Ok(stream)) = tokio_stream::StreamExt::next(&mut incoming).await {
                tokio::spawn(connection(stream, Arc::clone(&shared)));
            }
        });
        Upstream { addr, seen }
    }

    /// Executions of `path` so far.
    pub fn executions(&self, path: &str) -> usize {
        let seen = self.seen.lock().expect("lock");
        seen.executions.get(path).copied().unwrap_or(0)
    }

    /// Headers of the last request to `path`.
    pub fn last_headers(&self, path: &str) -> HashMap<String, String> {
        let seen = self.seen.lock().expect("lock");
        seen.last_headers.get(path).cloned().unwrap_or_default()
    }
}

async fn connection(stream: tokio::net::TcpStream, seen: Arc<Mutex<Seen>>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).await.unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .to_string();
        let mut headers = HashMap::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let length: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let execution = {
            let mut seen = seen.lock().expect("lock");
            let count = seen.executions.entry(path.clone()).or_default();
            *count += 1;
            let execution = *count;
            seen.last_headers.insert(path.clone(), headers);
            execution
        };
        let stream = reader.get_mut();
        if path.contains("/slow/") {
            tokio::time::sleep(Upstream::SLOW).await;
        }
        if path.starts_with("/crash/") || path.starts_with("/crash-exposed/") {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"partial\":")
                .await;
            let _ = stream.shutdown().await;
            return;
        }
        let (status, answer) = if path.contains("/fail/") {
            (
                "500 Internal Server Error",
                b"{\"error\":\"boom\"}".to_vec(),
            )
        } else if path.starts_with("/big/") {
            ("200 OK", vec![b'x'; 64 * 1024])
        } else {
            let body = serde_json::json!({
                "path": path,
                "execution": execution,
                "request_bytes": body.len(),
            });
            ("201 Created", body.to_string().into_bytes())
        };
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nlocation: {path}\r\nset-cookie: session=secret-{execution}\r\nx-execution: {execution}\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        if stream.write_all(head.as_bytes()).await.is_err()
            || stream.write_all(&answer).await.is_err()
        {
            return;
        }
    }
}
