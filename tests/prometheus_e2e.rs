//! End to end: a real Prometheus server (Debian's `prometheus` package,
//! installed by `make test`) scrapes a running idemd while a scripted client
//! produces known numbers of claims, replays, 409s and 422s; PromQL queries
//! against Prometheus's HTTP API must return exactly those counts.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::process::{kill9, spawn};
use common::*;
use idemd::proto::v1 as pb;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A minimal HTTP/1.1 GET (the test talks only to local servers).
fn http_get(address: SocketAddr, path: &str) -> Result<String, String> {
    let mut stream =
        TcpStream::connect_timeout(&address, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!("HTTP error: {}", head.lines().next().unwrap_or("")));
    }
    // Prometheus may answer chunked; de-chunk if so.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size_line, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size_line.trim(), 16).map_err(|e| e.to_string())?;
            if size == 0 {
                break;
            }
            out.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
        return Ok(out);
    }
    Ok(body.to_string())
}

fn encode_query(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Evaluates an instant PromQL query; returns label value of `by` → value.
fn query(prometheus: SocketAddr, promql: &str, by: &str) -> Result<Vec<(String, f64)>, String> {
    let body = http_get(
        prometheus,
        &format!("/api/v1/query?query={}", encode_query(promql)),
    )?;
    let json: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let results = json["data"]["result"]
        .as_array()
        .ok_or(format!("no result: {body}"))?;
    let mut out = Vec::new();
    for series in results {
        let label = series["metric"][by].as_str().unwrap_or("").to_string();
        let value: f64 = series["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .ok_or(format!("bad value in {series}"))?;
        out.push((label, value));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_exact_claim_outcomes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let metrics_port = free_port();
    let metrics_flag = format!("127.0.0.1:{metrics_port}");
    let idemd = spawn(
        &dir.path().join("data"),
        &["--metrics-listen", &metrics_flag],
    );
    let mut client = connect(idemd.addr).await;
    let tenant = "e2e";

    // 5 fresh claims (4 completed), 3 replays, 2 in-progress 409s,
    // 2 mismatches (422), 1 pending 409, 2 rejected (bad key).
    let mut leases = Vec::new();
    for i in 0..5 {
        let response = client
            .claim(as_tenant(tenant, claim(PAYMENTS, &format!("k{i}"), 100)))
            .await
            .expect("claim")
            .into_inner();
        leases.push(claimed(&response));
    }
    for (i, lease) in leases.iter().enumerate().take(4) {
        client
            .complete(as_tenant(
                tenant,
                pb::CompleteRequest {
                    endpoint: PAYMENTS.into(),
                    key: format!("k{i}"),
                    lease_token: lease.lease_token.clone(),
                    response: Some(sample_response("e2e")),
                },
            ))
            .await
            .expect("complete");
    }
    for i in 0..3 {
        let response = client
            .claim(as_tenant(tenant, claim(PAYMENTS, &format!("k{i}"), 100)))
            .await
            .expect("claim")
            .into_inner();
        assert_eq!(outcome_name(&response), "replayed");
    }
    let k4 = claim(PAYMENTS, "k4", 100);
    for _ in 0..2 {
        let response = client
            .claim(as_tenant(tenant, k4.clone()))
            .await
            .expect("claim")
            .into_inner();
        assert_eq!(outcome_name(&response), "in_progress");
    }
    for i in 0..2 {
        let response = client
            .claim(as_tenant(tenant, claim(PAYMENTS, &format!("k{i}"), 999)))
            .await
            .expect("claim")
            .into_inner();
        assert_eq!(outcome_name(&response), "mismatch");
    }
    client
        .fail(as_tenant(
            tenant,
            pb::FailRequest {
                endpoint: PAYMENTS.into(),
                key: "k4".into(),
                lease_token: leases[4].lease_token.clone(),
                disposition: pb::Disposition::Unknown.into(),
                reason: "timeout".into(),
            },
        ))
        .await
        .expect("fail");
    let response = client
        .claim(as_tenant(tenant, k4))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(outcome_name(&response), "pending");
    for _ in 0..2 {
        client
            .claim(as_tenant(tenant, claim(PAYMENTS, "bad key", 1)))
            .await
            .expect_err("rejected");
    }

    // A real Prometheus scraping every second.
    let prometheus_port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: idemd\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        ),
    )
    .expect("config");
    let binary =
        std::env::var("IDEMD_PROMETHEUS_BIN").unwrap_or_else(|_| "/usr/bin/prometheus".into());
    let prometheus = Prometheus(
        Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {binary} (make test installs Debian's prometheus package): {e}"
                )
            }),
    );
    let prometheus_address: SocketAddr = format!("127.0.0.1:{prometheus_port}")
        .parse()
        .expect("addr");

    let promql = format!("sum by (outcome) (idemd_claims_total{{tenant=\"{tenant}\"}})");
    let expected: Vec<(String, f64)> = [
        ("claimed", 5.0),
        ("in_progress", 2.0),
        ("mismatch", 2.0),
        ("pending", 1.0),
        ("rejected", 2.0),
        ("replayed", 3.0),
    ]
    .iter()
    .map(|(o, v)| (o.to_string(), *v))
    .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = Err("not queried yet".to_string());
    while Instant::now() < deadline {
        last = query(prometheus_address, &promql, "outcome");
        if last.as_ref().is_ok_and(|series| *series == expected) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        last,
        Ok(expected),
        "claims by outcome as scraped by Prometheus"
    );
    let rejected = query(
        prometheus_address,
        "sum(idemd_claims_total{outcome=\"rejected\"})",
        "",
    )
    .expect("query");
    assert_eq!(rejected, vec![(String::new(), 2.0)]);
    let completions = query(
        prometheus_address,
        &format!("sum(idemd_completions_total{{tenant=\"{tenant}\"}})"),
        "",
    )
    .expect("query");
    assert_eq!(completions, vec![(String::new(), 4.0)]);
    let failures = query(
        prometheus_address,
        "sum by (disposition) (idemd_failures_total)",
        "disposition",
    )
    .expect("query");
    assert_eq!(failures, vec![("unknown".to_string(), 1.0)]);
    // Latency histograms are exported with buckets, per RPC and code.
    let rpcs = query(
        prometheus_address,
        "sum by (rpc) (idemd_rpc_duration_seconds_count{code=\"OK\"})",
        "rpc",
    )
    .expect("query");
    assert!(
        rpcs.iter()
            .any(|(rpc, count)| rpc == "Claim" && *count >= 13.0),
        "{rpcs:?}"
    );
    let build = query(prometheus_address, "idemd_build_info", "version").expect("query");
    assert_eq!(build, vec![(env!("CARGO_PKG_VERSION").to_string(), 1.0)]);
    drop(prometheus);
    kill9(idemd);
}
