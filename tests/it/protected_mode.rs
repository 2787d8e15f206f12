//! Protected mode (`crate::auth`): a server without credentials answers
//! loopback callers only, on every listener, unless
//! `--allow-unauthenticated-remote` says otherwise; and the README's
//! quickstart keeps working as written.
//!
//! A non-loopback caller needs a non-loopback address on this machine
//! without touching the host's network: each test creates a network
//! namespace of its own (`unshare -rn`, an unprivileged user namespace)
//! holding a veth pair with `10.29.0.1/24` on one end. idemd and its
//! clients run inside it (`nsenter`); a connection to `10.29.0.1` from
//! there reaches idemd with `10.29.0.1` as the peer address, and no packet
//! ever leaves the namespace. The namespace disappears with its last
//! process.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::common::process::{self, Process};

/// The namespace's non-loopback address (on a veth end inside it only).
const REMOTE_IP: &str = "10.29.0.1";

/// A network namespace of the test's own, alive while this value is.
struct Namespace {
    /// `sleep` inside the namespace (exec'd by the setup shell): the
    /// namespace's anchor, and the process `nsenter` joins.
    holder: Child,
}

impl Namespace {
    fn new() -> Self {
        let setup = format!(
            "set -e; ip link set lo up; ip link add v0 type veth peer name v1; \
             ip addr add {REMOTE_IP}/24 dev v0; ip link set v0 up; ip link set v1 up; \
             echo ready; exec sleep 600"
        );
        let mut holder = Command::new("unshare")
            .args(["--user", "--map-root-user", "--net", "sh", "-c", &setup])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare (util-linux) runs: the test needs unprivileged user and network namespaces");
        let stdout = holder.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the namespace setup");
        assert_eq!(
            line.trim(),
            "ready",
            "creating the network namespace failed (unshare -rn, ip link add ... type veth)"
        );
        Self { holder }
    }

    /// `program` run inside the namespace.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .args(["--preserve-credentials", "--user", "--net", "--target"])
            .arg(self.holder.id().to_string())
            .arg("--")
            .arg(program);
        command
    }

    /// Runs a command inside the namespace and collects its output.
    fn run(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("nsenter runs")
    }

    /// `curl` inside the namespace: the HTTP status and the body.
    fn curl(&self, args: &[&str]) -> (u16, String) {
        let mut all = vec!["-sS", "--max-time", "10", "-w", "\n%{http_code}"];
        all.extend_from_slice(args);
        let output = self.run("curl", &all);
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
        let status = status.trim().parse().unwrap_or_else(|_| {
            panic!(
                "curl {args:?} gave no status: {text}{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        (status, body.to_string())
    }

    /// `idemd keys get` (a gRPC Lookup through the CLI) against `target`
    /// with auth-off credentials: exit code and stderr.
    fn lookup(&self, target: &str) -> (i32, String) {
        let output = self.run(
            env!("CARGO_BIN_EXE_idemd"),
            &[
                "keys",
                "get",
                "--target",
                target,
                "--tenant",
                "acme",
                "--endpoint",
                "POST /v1/payments",
                "--key",
                "k1",
            ],
        );
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// The port of one listener from the "idemd serving" event (`grpc`,
/// `http` or `proxy`).
fn port(process: &Process, listener: &str) -> u16 {
    let address: std::net::SocketAddr = process.serving[listener]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no {listener} address in {}", process.serving));
    address.port()
}

/// `idemd proxy` with every listener (proxy, gRPC, HTTP/JSON) on all
/// addresses of the namespace, auth off, plus `extra` environment.
fn proxy_in(ns: &Namespace, data_dir: &Path, env: &[(&str, &str)]) -> Process {
    let mut command = ns.command(env!("CARGO_BIN_EXE_idemd"));
    command
        .args([
            "proxy",
            "--listen",
            "0.0.0.0:0",
            "--grpc-listen",
            "0.0.0.0:0",
            "--http-listen",
            "0.0.0.0:0",
            // Nothing listens there: a forwarded request would get 502.
            "--upstream",
            "http://127.0.0.1:9",
            "--log-format",
            "json",
            "--metrics-listen",
            "off",
            "--data-dir",
        ])
        .arg(data_dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    process::spawn_command(command)
}

/// What every listener answers one caller.
struct Answers {
    /// `idemd keys get` exit code and stderr.
    grpc: (i32, String),
    /// `POST /v1/lookup` on the HTTP/JSON API.
    api: (u16, String),
    /// A keyed `POST` on the proxy (claimed, then forwarded).
    proxy_keyed: (u16, String),
    /// A `GET` on the proxy (forwarded without a key).
    proxy_passthrough: (u16, String),
}

fn ask(ns: &Namespace, server: &Process, host: &str) -> Answers {
    let grpc = ns.lookup(&format!("http://{host}:{}", port(server, "grpc")));
    let api = ns.curl(&[
        &format!("http://{host}:{}/v1/lookup", port(server, "http")),
        "-H",
        "content-type: application/json",
        "-H",
        "x-tenant-id: acme",
        "-d",
        r#"{"endpoint":"POST /v1/payments","key":"k1"}"#,
    ]);
    let proxy = format!("http://{host}:{}/v1/payments", port(server, "proxy"));
    let proxy_keyed = ns.curl(&[
        &proxy,
        "-H",
        "Idempotency-Key: \"pay-1\"",
        "-H",
        "content-type: application/json",
        "-d",
        r#"{"amount":100}"#,
    ]);
    let proxy_passthrough = ns.curl(&[&proxy]);
    Answers {
        grpc,
        api,
        proxy_keyed,
        proxy_passthrough,
    }
}

const FLAG: &str = "--allow-unauthenticated-remote";

#[test]
fn remote_callers_are_refused_without_auth_on_every_listener() {
    let ns = Namespace::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = proxy_in(&ns, dir.path(), &[]);
    assert_eq!(
        server.serving["access"], "loopback-only",
        "{}",
        server.serving
    );

    let remote = ask(&ns, &server, REMOTE_IP);
    let (code, stderr) = &remote.grpc;
    assert_eq!(
        *code, 3,
        "gRPC from {REMOTE_IP}: refused (exit 3), got {code}: {stderr}"
    );
    assert!(
        stderr.contains("PermissionDenied") && stderr.contains(FLAG),
        "gRPC refusal names PERMISSION_DENIED and the flag: {stderr}"
    );
    for (name, (status, body)) in [
        ("HTTP/JSON API", &remote.api),
        ("proxy, keyed", &remote.proxy_keyed),
        ("proxy, pass-through", &remote.proxy_passthrough),
    ] {
        assert_eq!(*status, 403, "{name} from {REMOTE_IP}: {body}");
        let problem: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{name}: not a problem+json body ({e}): {body}"));
        assert_eq!(problem["grpc_code"], "PERMISSION_DENIED", "{name}: {body}");
        assert!(
            problem["detail"].as_str().is_some_and(|d| d.contains(FLAG)),
            "{name}: the detail names the flag: {body}"
        );
        assert_eq!(
            problem["details"][0]["reason"], "UNAUTHENTICATED_REMOTE_REFUSED",
            "{name}: {body}"
        );
    }

    // The same calls from loopback are served: NOT_FOUND for a key nobody
    // claimed, and the proxy's claim goes through to the (absent) upstream.
    let local = ask(&ns, &server, "127.0.0.1");
    assert_eq!(local.grpc.0, 1, "gRPC from loopback: {}", local.grpc.1);
    assert_eq!(local.api.0, 404, "API from loopback: {}", local.api.1);
    assert_eq!(
        local.proxy_keyed.0, 502,
        "proxy from loopback: {}",
        local.proxy_keyed.1
    );
    assert_eq!(
        local.proxy_passthrough.0, 502,
        "{}",
        local.proxy_passthrough.1
    );
    process::kill9(server);
}

#[test]
fn the_explicit_opt_out_serves_remote_callers_and_says_so() {
    let ns = Namespace::new();
    let dir = tempfile::tempdir().expect("tempdir");
    // From the environment variable, as the Helm chart sets it.
    let server = proxy_in(
        &ns,
        dir.path(),
        &[("IDEMD_ALLOW_UNAUTHENTICATED_REMOTE", "true")],
    );
    assert_eq!(server.serving["access"], "unauthenticated-remote");
    let remote = ask(&ns, &server, REMOTE_IP);
    assert_eq!(remote.grpc.0, 1, "served: NOT_FOUND, {}", remote.grpc.1);
    assert_eq!(remote.api.0, 404, "{}", remote.api.1);
    assert_eq!(remote.proxy_keyed.0, 502, "{}", remote.proxy_keyed.1);
    assert_eq!(
        remote.proxy_passthrough.0, 502,
        "{}",
        remote.proxy_passthrough.1
    );
    process::kill9(server);
}

/// The start-up log says which mode is on, at WARN for the opt-out.
#[test]
fn the_start_up_log_names_the_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (env, level, access) in [
        (None, "INFO", "loopback-only"),
        (Some("true"), "WARN", "unauthenticated-remote"),
    ] {
        let mut command = process::idemd_command(dir.path(), &[]);
        if let Some(value) = env {
            command.env("IDEMD_ALLOW_UNAUTHENTICATED_REMOTE", value);
        }
        let server = process::spawn_command(command);
        assert_eq!(server.serving["access"], access);
        let mode = server
            .startup
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| e["access"] == access)
            .unwrap_or_else(|| {
                panic!(
                    "no start-up line with access={access}: {:?}",
                    server.startup
                )
            });
        assert_eq!(mode["level"], level, "{mode}");
        process::kill9(server);
    }
}

/// The flag is refused next to credentials: removing them later would
/// silently open the port.
#[test]
fn the_opt_out_is_refused_with_credentials() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("acme {}\n", "ab".repeat(32))).expect("tokens");
    let output = process::idemd_command(
        dir.path(),
        &[FLAG, "--auth-tokens", tokens.to_str().expect("utf-8")],
    )
    .output()
    .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("allow_unauthenticated_remote"), "{stderr}");
}

/// The README's quickstart calls (grpcurl, ghz) work as written against
/// `idemd` started like `cargo run --release` (no flags; its own namespace
/// has :50051 and :9464 free), and the same calls to the namespace's other
/// address are refused naming the flag.
#[test]
fn the_readme_quickstart_works_as_written_and_only_locally() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let block = readme
        .split("<!-- readme-quickstart-calls -->")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("README has the marked quickstart block")
        .to_string();
    assert!(block.contains("localhost:50051"), "{block}");
    let tools = tools_bin();

    let ns = Namespace::new();
    let dir = tempfile::tempdir().expect("tempdir");
    // `cargo run --release` runs `idemd` with no arguments: every default.
    let mut command = ns.command(env!("CARGO_BIN_EXE_idemd"));
    command
        .current_dir(dir.path())
        .env_remove("IDEMD_METRICS_LISTEN")
        .env("IDEMD_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let server = process::spawn_command(command);
    assert_eq!(server.addr.port(), 50051, "{}", server.serving);

    let run_block = |block: &str| {
        let path = format!(
            "{}:{}",
            tools.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = ns.command("bash");
        command
            .args(["-euo", "pipefail", "-c", block])
            .env("PATH", path)
            .stdin(Stdio::null());
        command.output().expect("bash runs")
    };
    let local = run_block(&block);
    let stdout = String::from_utf8_lossy(&local.stdout);
    let stderr = String::from_utf8_lossy(&local.stderr);
    assert!(local.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("idemd.v1.Idempotency"),
        "grpcurl list: {stdout}"
    );
    assert!(stdout.contains("\"claimed\""), "grpcurl Claim: {stdout}");
    assert!(
        stdout.contains("[OK]   1000 responses"),
        "ghz: every call OK: {stdout}"
    );

    let remote = run_block(&block.replace("localhost", REMOTE_IP));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&remote.stdout),
        String::from_utf8_lossy(&remote.stderr)
    );
    assert!(!remote.status.success(), "served a remote caller: {text}");
    assert!(
        text.contains("Code: PermissionDenied") && text.contains(FLAG),
        "refused with PERMISSION_DENIED naming the flag: {text}"
    );
    process::kill9(server);
}

/// grpcurl and ghz at the README's pinned versions (bench/scripts/tools.sh,
/// which `make bench-smoke` runs too).
fn tools_bin() -> PathBuf {
    let output = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench/scripts/tools.sh"
    ))
    .stderr(Stdio::inherit())
    .output()
    .expect("bench/scripts/tools.sh runs");
    assert!(output.status.success(), "bench/scripts/tools.sh failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("prints its bin directory")
            .trim(),
    )
}
