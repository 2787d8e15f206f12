//! The shared HTTP front-end contract (`clients/conformance/http-scenarios.json`,
//! specified in `http-scenarios.md` beside it) run through `idemd proxy`:
//! the same file every SDK's middleware runs, so the sidecar and the
//! middleware answer the same requests the same way.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use idemd::config::Settings;
use idemd::config::routes::{ProxySettings, Routes};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::common::Starter;
use crate::common::http::{Answer, Upstream, try_send};

/// The scenario file.
const FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/clients/conformance/http-scenarios.json"
);

/// The file, parsed.
fn load() -> Value {
    let text = std::fs::read_to_string(FILE).unwrap_or_else(|e| panic!("{FILE}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{FILE}: {e}"))
}

/// The file's `routes` as the proxy's routes TOML: the JSON is that file's
/// structure, so nothing is translated by hand; settings only a middleware
/// has (`middleware_only_fields`, e.g. `fingerprint`) are left out.
fn routes(doc: &Value) -> Routes {
    let mut routes = doc["routes"].clone();
    let dropped: Vec<String> = doc["middleware_only_fields"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if let Some(tables) = routes["routes"].as_array_mut() {
        for table in tables.iter_mut().filter_map(Value::as_object_mut) {
            for name in &dropped {
                table.remove(name);
            }
        }
    }
    let text = toml::to_string(&routes).expect("routes as TOML");
    Routes::parse(&text).unwrap_or_else(|e| panic!("routes of {FILE}: {e}\n{text}"))
}

/// One request of a step, its `{key:N}` placeholders filled in.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn of(step: &Value, prefix: &str) -> Self {
        let request = &step["request"];
        let text = |v: &Value| v.as_str().expect("string").to_string();
        Self {
            method: text(&request["method"]),
            path: text(&request["path"]),
            headers: request["headers"]
                .as_array()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|pair| (text(&pair[0]), fill(&text(&pair[1]), prefix)))
                        .collect()
                })
                .unwrap_or_default(),
            body: request["body"].as_str().unwrap_or("").as_bytes().to_vec(),
        }
    }

    async fn send(self, proxy: SocketAddr) -> Result<Answer, String> {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        try_send(proxy, &self.method, &self.path, &headers, &self.body).await
    }
}

/// `value` with every `{key:N}` replaced by `<prefix>-N`.
fn fill(value: &str, prefix: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("{key:") {
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(prefix);
        out.push('-');
        out.push_str(&rest[start + "{key:".len()..start + end]);
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Checks one answer against `expect`; `saved` holds the bodies of earlier
/// steps' `save_as`.
fn check(
    at: &str,
    expect: &Value,
    answer: &Result<Answer, String>,
    saved: &HashMap<String, Vec<u8>>,
) {
    if expect["failed"] == Value::Bool(true) {
        if let Ok(answer) = answer {
            assert!(
                answer.status >= 500,
                "{at}: expected a failure, got {} {:?}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
        }
        return;
    }
    let answer = answer
        .as_ref()
        .unwrap_or_else(|e| panic!("{at}: no answer: {e}"));
    let body = String::from_utf8_lossy(&answer.body);
    if let Some(status) = expect["status"].as_u64() {
        assert_eq!(
            u64::from(answer.status),
            status,
            "{at}: status; body {body}"
        );
    }
    if let Some(headers) = expect["headers"].as_object() {
        for (name, value) in headers {
            assert_eq!(
                answer.header(name),
                value.as_str(),
                "{at}: header {name}; headers {:?}",
                answer.headers
            );
        }
    }
    if let Some(problem) = expect["problem"].as_str() {
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json"),
            "{at}"
        );
        assert_eq!(
            answer.json()["type"],
            format!("https://idemd.dev/problems/{problem}"),
            "{at}: {body}"
        );
    }
    if expect["retry_after"] == Value::Bool(true) {
        assert!(answer.header("retry-after").is_some(), "{at}: Retry-After");
    }
    if let Some(expected) = expect["body"].as_str() {
        assert_eq!(body, expected, "{at}: body");
    }
    for needle in strings(&expect["body_includes"]) {
        assert!(body.contains(needle), "{at}: body lacks {needle:?}: {body}");
    }
    for needle in strings(&expect["body_excludes"]) {
        assert!(!body.contains(needle), "{at}: body has {needle:?}: {body}");
    }
    if let Some(length) = expect["body_length"].as_u64() {
        assert_eq!(answer.body.len() as u64, length, "{at}: body length");
    }
    if let Some(name) = expect["body_same_as"].as_str() {
        let earlier = saved
            .get(name)
            .unwrap_or_else(|| panic!("{at}: nothing saved as {name}"));
        assert_eq!(
            &answer.body[..],
            &earlier[..],
            "{at}: body differs from {name}'s"
        );
    }
}

/// The strings of a JSON array (none when absent).
fn strings(value: &Value) -> impl Iterator<Item = &str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// Checks the answers of a `parallel` step.
fn check_parallel(at: &str, expect: &Value, answers: &[Result<Answer, String>]) {
    let answers: Vec<&Answer> = answers
        .iter()
        .map(|a| {
            a.as_ref()
                .unwrap_or_else(|e| panic!("{at}: no answer: {e}"))
        })
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    if let Some(allowed) = expect["statuses"].as_array() {
        for status in &statuses {
            assert!(
                allowed.contains(&Value::from(*status)),
                "{at}: status {status} not in {allowed:?}: {statuses:?}"
            );
        }
    }
    if let Some(status) = expect["includes_status"].as_u64() {
        assert!(
            statuses.iter().any(|s| u64::from(*s) == status),
            "{at}: no {status} in {statuses:?}"
        );
    }
    if let Some(status) = expect["same_body_for"].as_u64() {
        let mut bodies = answers
            .iter()
            .filter(|a| u64::from(a.status) == status)
            .map(|a| &a.body);
        if let Some(first) = bodies.next() {
            assert!(bodies.all(|b| b == first), "{at}: different bodies");
        }
    }
    if expect["on_409"].is_object() {
        for answer in answers.iter().filter(|a| a.status == 409) {
            check(
                at,
                &expect["on_409"],
                &Ok((*answer).clone()),
                &HashMap::new(),
            );
        }
    }
}

fn check_executions(at: &str, expect: &Value, upstream: &Upstream, path: &str) {
    if let Some(executions) = expect["executions"].as_u64() {
        assert_eq!(
            upstream.executions(path) as u64,
            executions,
            "{at}: executions of {path}"
        );
    }
}

/// Runs every scenario of the file (those for middleware only skipped)
/// through one proxy in front of the suite's upstream.
pub async fn http_scenarios_hold_for_the_proxy(start: Starter) {
    let doc = load();
    let routes = routes(&doc);
    let upstream = Upstream::start().await;
    let target = upstream.addr;
    let server = start(Box::new(move |settings: &mut Settings| {
        settings.proxy = Some(ProxySettings {
            listen: "127.0.0.1:0".parse().expect("addr"),
            upstream: format!("http://{target}"),
            routes,
            token_header: http::header::AUTHORIZATION,
        });
    }))
    .await;
    let proxy = server
        .server
        .as_ref()
        .and_then(|s| s.proxy_addr)
        .expect("proxy address");
    let scenarios = doc["scenarios"].as_array().expect("scenarios");
    let mut ran = 0;
    for (number, scenario) in scenarios.iter().enumerate() {
        let name = scenario["name"].as_str().expect("name");
        if scenario["only"]
            .as_str()
            .is_some_and(|only| only != "proxy")
        {
            continue;
        }
        let prefix = format!("{:016x}", rand::random::<u64>());
        let mut saved: HashMap<String, Vec<u8>> = HashMap::new();
        let mut started: HashMap<String, (String, JoinHandle<Result<Answer, String>>)> =
            HashMap::new();
        for (index, step) in scenario["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .enumerate()
        {
            let at = format!("scenario {number} ({name}), step {index}");
            let expect = &step["expect"];
            if let Some(ms) = step["sleep_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                continue;
            }
            if let Some(label) = step["finish"].as_str() {
                let (path, task) = started
                    .remove(label)
                    .unwrap_or_else(|| panic!("{at}: {label} was not started"));
                let answer = task.await.expect("task");
                check(&at, expect, &answer, &saved);
                check_executions(&at, expect, &upstream, &path);
                continue;
            }
            let request = Request::of(step, &prefix);
            let path = request.path.clone();
            if let Some(label) = step["start"].as_str() {
                let task = tokio::spawn(request.send(proxy));
                started.insert(label.to_string(), (path, task));
                continue;
            }
            if let Some(copies) = step["parallel"].as_u64() {
                let tasks: Vec<_> = (0..copies)
                    .map(|_| tokio::spawn(request.clone().send(proxy)))
                    .collect();
                let mut answers = Vec::new();
                for task in tasks {
                    answers.push(task.await.expect("task"));
                }
                check_parallel(&at, expect, &answers);
                check_executions(&at, expect, &upstream, &path);
                continue;
            }
            let answer = request.send(proxy).await;
            check(&at, expect, &answer, &saved);
            check_executions(&at, expect, &upstream, &path);
            if let (Some(label), Ok(answer)) = (step["save_as"].as_str(), &answer) {
                saved.insert(label.to_string(), answer.body.to_vec());
            }
        }
        ran += 1;
    }
    assert!(ran > 10, "only {ran} scenarios ran");
    server.stop().await;
}
