//! TLS and mTLS of the gRPC port, end to end: certificates generated here
//! with rcgen, a real server on port 0, tonic TLS clients.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::certs::Ca;
use crate::common::{PAYMENTS, claim, test_settings};
use idemd::clock::{Clock, ManualClock};
use idemd::config::TlsSettings;
use idemd::proto::v1 as pb;
use idemd::proto::v1::idempotency_client::IdempotencyClient;
use idemd::server::RunningServer;
use sha2::{Digest, Sha256};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request, Status};

const SPIFFE_A: &str = "spiffe://test.idemd/ns/a/sa/payments";
const DNS_B: &str = "worker.tenant-b.example";

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write test file");
}

/// Files of a TLS server in `dir`.
struct ServerFiles {
    cert: PathBuf,
    key: PathBuf,
}

impl ServerFiles {
    fn write(dir: &Path, ca: &Ca) -> ServerFiles {
        let files = ServerFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        files.replace(ca);
        files
    }

    fn replace(&self, ca: &Ca) {
        let (cert, key) = ca.server();
        write(&self.cert, &cert);
        write(&self.key, &key);
    }
}

async fn start(settings: idemd::config::Settings) -> RunningServer {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::starting_now());
    idemd::server::start(settings, clock)
        .await
        .expect("server starts")
}

/// A TLS channel trusting `ca_pem`, presenting `identity` when given.
async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<&(String, String)>,
) -> Result<IdempotencyClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{}", addr.port()))
        .expect("uri")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(IdempotencyClient::new(channel))
}

async fn do_claim(
    client: &mut IdempotencyClient<Channel>,
    key: &str,
    metadata: &[(&'static str, &str)],
) -> Result<pb::ClaimResponse, Status> {
    let mut request = Request::new(claim(PAYMENTS, key, 1));
    for (name, value) in metadata {
        request
            .metadata_mut()
            .insert(*name, value.parse().expect("ascii"));
    }
    client.claim(request).await.map(|r| r.into_inner())
}

async fn do_lookup(
    client: &mut IdempotencyClient<Channel>,
    key: &str,
    metadata: &[(&'static str, &str)],
) -> Result<pb::LookupResponse, Status> {
    let mut request = Request::new(pb::LookupRequest {
        endpoint: PAYMENTS.to_string(),
        key: key.to_string(),
        include_response: false,
    });
    for (name, value) in metadata {
        request
            .metadata_mut()
            .insert(*name, value.parse().expect("ascii"));
    }
    client.lookup(request).await.map(|r| r.into_inner())
}

/// Asserts that a client cannot get a call through: the connection or the
/// handshake fails, or (TLS 1.3 reports a refused client certificate after
/// the client's side of the handshake is done) the first call does with a
/// transport error rather than an answer from the service.
async fn assert_refused(
    connecting: Result<IdempotencyClient<Channel>, tonic::transport::Error>,
    what: &str,
) {
    let Ok(mut client) = connecting else {
        return;
    };
    match do_claim(&mut client, "refused-key", &[]).await {
        Ok(response) => panic!("{what}: the call went through: {response:?}"),
        Err(status) => assert!(
            matches!(
                status.code(),
                Code::Unavailable | Code::Unknown | Code::Internal
            ),
            "{what}: expected a transport failure, got {status:?}"
        ),
    }
}

fn token_line(tenant: &str, token: &str, role: &str) -> String {
    format!(
        "{tenant} {} {role}\n",
        hex::encode(Sha256::digest(token.as_bytes()))
    )
}

/// Sequential calls over TLS are not held up by the transport (the TLS
/// acceptor's sockets need TCP_NODELAY like plaintext ones: src/net.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_calls_at_one_in_flight_are_fast() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("server CA");
    let files = ServerFiles::write(dir.path(), &ca);
    let mut settings = test_settings(&dir.path().join("data"));
    settings.tls = Some(TlsSettings {
        cert: files.cert.clone(),
        key: files.key.clone(),
        client_ca: None,
        client_tenants: None,
    });
    let server = start(settings).await;
    let mut client = connect(server.local_addr, &ca.pem, None)
        .await
        .expect("TLS connects");
    crate::common::latency::assert_fast_at_one_in_flight(&mut client, "tls", "").await;
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn tls_serves_claims_and_refuses_plaintext() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("server CA");
    let files = ServerFiles::write(dir.path(), &ca);
    let mut settings = test_settings(dir.path());
    settings.tls = Some(TlsSettings {
        cert: files.cert.clone(),
        key: files.key.clone(),
        client_ca: None,
        client_tenants: None,
    });
    let server = start(settings).await;
    let addr = server.local_addr;

    let mut client = connect(addr, &ca.pem, None).await.expect("TLS connects");
    let response = do_claim(&mut client, "tls-key-1", &[])
        .await
        .expect("Claim over TLS");
    assert!(
        matches!(
            response.outcome,
            Some(pb::claim_response::Outcome::Claimed(_))
        ),
        "{response:?}"
    );

    // A plaintext HTTP/2 client gets nothing from the TLS port.
    let plaintext = Channel::from_shared(format!("http://127.0.0.1:{}", addr.port()))
        .expect("uri")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map(IdempotencyClient::new);
    assert_refused(plaintext, "plaintext client").await;

    // A client that does not trust the server's CA cannot connect.
    let stranger = Ca::new("unrelated CA");
    assert_refused(connect(addr, &stranger.pem, None).await, "untrusted server").await;

    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn tls_certificate_is_reloaded_without_dropping_connections() {
    let dir = tempfile::tempdir().expect("temp dir");
    let old_ca = Ca::new("old CA");
    let files = ServerFiles::write(dir.path(), &old_ca);
    let mut settings = test_settings(dir.path());
    settings.tls = Some(TlsSettings {
        cert: files.cert.clone(),
        key: files.key.clone(),
        client_ca: None,
        client_tenants: None,
    });
    let server = start(settings).await;
    let mut events = server.reload_events().subscribe();
    let addr = server.local_addr;
    let mut established = connect(addr, &old_ca.pem, None)
        .await
        .expect("old CA connects");
    do_claim(&mut established, "reload-1", &[])
        .await
        .expect("Claim before the reload");

    // A bad file keeps the old certificate in force.
    write(&files.cert, "not a certificate");
    let refused = crate::common::next_reload(&mut events, "tls certificate")
        .await
        .expect_err("a bad certificate is refused");
    assert!(
        refused.contains(&files.cert.display().to_string()),
        "names the file: {refused}"
    );
    let mut still_old = connect(addr, &old_ca.pem, None)
        .await
        .expect("the old certificate is still served after a bad write");
    do_claim(&mut still_old, "reload-2", &[])
        .await
        .expect("Claim with the old certificate");

    let new_ca = Ca::new("new CA");
    files.replace(&new_ca);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut renewed = loop {
        if let Ok(mut client) = connect(addr, &new_ca.pem, None).await
            && do_claim(&mut client, "reload-3", &[]).await.is_ok()
        {
            break client;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    do_claim(&mut renewed, "reload-4", &[])
        .await
        .expect("Claim with the new certificate");
    assert_refused(
        connect(addr, &old_ca.pem, None).await,
        "client trusting only the old CA",
    )
    .await;
    // The connection made before the reload is still up: had it been
    // dropped, reconnecting would fail (its client trusts only the old CA).
    do_claim(&mut established, "reload-5", &[])
        .await
        .expect("the connection established before the reload survives");

    server.shutdown().await.expect("clean shutdown");
}

/// An mTLS server: server certificate from `server_ca`, client certificates
/// from `client_ca`, the mapping SPIFFE_A → tenant-a, DNS_B → tenant-b.
struct MtlsServer {
    server: RunningServer,
    server_ca: Ca,
    client_ca: Ca,
    _dir: tempfile::TempDir,
}

impl MtlsServer {
    async fn start(tokens: Option<&str>) -> MtlsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let server_ca = Ca::new("server CA");
        let client_ca = Ca::new("client CA");
        let files = ServerFiles::write(dir.path(), &server_ca);
        let client_ca_path = dir.path().join("client-ca.crt");
        write(&client_ca_path, &client_ca.pem);
        let tenants = dir.path().join("client-tenants");
        write(
            &tenants,
            &format!("# test mapping\n{SPIFFE_A} tenant-a admin\n{DNS_B} tenant-b\n"),
        );
        let mut settings = test_settings(dir.path());
        if let Some(tokens) = tokens {
            let path = dir.path().join("tokens");
            write(&path, tokens);
            settings.auth_tokens = Some(path);
        }
        settings.tls = Some(TlsSettings {
            cert: files.cert,
            key: files.key,
            client_ca: Some(client_ca_path),
            client_tenants: Some(tenants),
        });
        let server = start(settings).await;
        MtlsServer {
            server,
            server_ca,
            client_ca,
            _dir: dir,
        }
    }

    async fn client(&self, identity: &(String, String)) -> IdempotencyClient<Channel> {
        connect(self.server.local_addr, &self.server_ca.pem, Some(identity))
            .await
            .expect("mTLS connects")
    }
}

#[tokio::test]
async fn mtls_tenant_comes_from_the_certificate() {
    let mtls = MtlsServer::start(None).await;
    let addr = mtls.server.local_addr;
    let spiffe = mtls.client_ca.client_uri(SPIFFE_A);
    let dns = mtls.client_ca.client_dns(DNS_B);
    let mut a = mtls.client(&spiffe).await;
    let mut b = mtls.client(&dns).await;

    // tenant-a claims (claiming to be tenant-b in the header, ignored).
    do_claim(&mut a, "mtls-1", &[("x-tenant-id", "tenant-b")])
        .await
        .expect("SPIFFE-mapped Claim");
    do_lookup(&mut a, "mtls-1", &[])
        .await
        .expect("tenant-a sees its key");
    let status = do_lookup(&mut b, "mtls-1", &[])
        .await
        .expect_err("tenant-b must not see tenant-a's key");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = do_lookup(&mut b, "mtls-1", &[("x-tenant-id", "tenant-a")])
        .await
        .expect_err("x-tenant-id is not trusted under mTLS");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // DNS-mapped works, as its own tenant.
    do_claim(&mut b, "mtls-1", &[])
        .await
        .expect("DNS-mapped Claim: same key, another tenant");
    // tenant-b's line has no role: `service`, which may not list pending.
    let status = b
        .list_pending(Request::new(pb::ListPendingRequest::default()))
        .await
        .expect_err("service role");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    a.list_pending(Request::new(pb::ListPendingRequest::default()))
        .await
        .expect("tenant-a's line grants admin");

    // A verified certificate that maps to no tenant.
    let unmapped = mtls.client_ca.client_dns("stranger.example");
    let mut stranger = mtls.client(&unmapped).await;
    let status = do_claim(&mut stranger, "mtls-2", &[("x-tenant-id", "tenant-a")])
        .await
        .expect_err("unmapped certificate");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // A certificate from another CA, even with a mapped name.
    let rogue = Ca::new("rogue CA").client_uri(SPIFFE_A);
    assert_refused(
        connect(addr, &mtls.server_ca.pem, Some(&rogue)).await,
        "client certificate from another CA",
    )
    .await;
    // No client certificate at all.
    assert_refused(
        connect(addr, &mtls.server_ca.pem, None).await,
        "no client certificate",
    )
    .await;

    mtls.server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn mtls_and_tokens_must_agree_on_the_tenant() {
    let tokens = format!(
        "{}{}",
        token_line("tenant-a", "token-a", "service"),
        token_line("tenant-b", "token-b", "admin")
    );
    let mtls = MtlsServer::start(Some(&tokens)).await;
    let spiffe = mtls.client_ca.client_uri(SPIFFE_A);
    let mut a = mtls.client(&spiffe).await;

    do_claim(&mut a, "both-1", &[("authorization", "Bearer token-a")])
        .await
        .expect("certificate and token of the same tenant");
    let status = do_claim(&mut a, "both-2", &[("authorization", "Bearer token-b")])
        .await
        .expect_err("token of another tenant");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("different tenants"), "{status:?}");
    let status = do_claim(&mut a, "both-3", &[])
        .await
        .expect_err("certificate without a token");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // The lesser role applies: the certificate grants admin, the token only
    // service.
    let mut request = Request::new(pb::ListPendingRequest::default());
    request
        .metadata_mut()
        .insert("authorization", "Bearer token-a".parse().expect("ascii"));
    let status = a.list_pending(request).await.expect_err("lesser role");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    mtls.server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn bad_tls_files_fail_start_naming_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("CA");
    let files = ServerFiles::write(dir.path(), &ca);
    let other_dir = dir.path().join("other");
    std::fs::create_dir(&other_dir).expect("mkdir");
    let other = ServerFiles::write(&other_dir, &ca);
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::starting_now());

    // A key that belongs to another certificate.
    let mut settings = test_settings(dir.path());
    settings.tls = Some(TlsSettings {
        cert: files.cert.clone(),
        key: other.key.clone(),
        client_ca: None,
        client_tenants: None,
    });
    let error = idemd::server::start(settings, Arc::clone(&clock))
        .await
        .err()
        .expect("mismatched key refused");
    assert!(
        error.to_string().contains(&other.key.display().to_string()),
        "{error}"
    );

    // A mapping line that is not a SAN.
    let tenants = dir.path().join("tenants");
    write(&tenants, "https://example.com t\n");
    let client_ca = dir.path().join("ca.crt");
    write(&client_ca, &ca.pem);
    let mut settings = test_settings(dir.path());
    settings.tls = Some(TlsSettings {
        cert: files.cert.clone(),
        key: files.key.clone(),
        client_ca: Some(client_ca),
        client_tenants: Some(tenants.clone()),
    });
    let error = idemd::server::start(settings, clock)
        .await
        .err()
        .expect("bad mapping refused");
    assert!(
        error
            .to_string()
            .contains(&format!("{}:1", tenants.display())),
        "{error}"
    );
}

/// `idemd audit` reaches a server that requires mTLS with its own client
/// flags (`--ca-file`, `--client-cert`, `--client-key`), and refuses
/// combinations that would silently drop TLS or fail obscurely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_subcommand_speaks_mtls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("CA");
    let path = |name: &str| dir.path().join(name).to_string_lossy().to_string();
    let server = ServerFiles::write(dir.path(), &ca);
    let client = ca.client_uri(SPIFFE_A);
    write(&dir.path().join("ca.pem"), &ca.pem);
    write(&dir.path().join("client.crt"), &client.0);
    write(&dir.path().join("client.key"), &client.1);
    write(
        &dir.path().join("tenants.txt"),
        &format!("{SPIFFE_A} acme reconciler\n"),
    );
    write(
        &dir.path().join("idemd.toml"),
        &format!("[endpoints.\"{PAYMENTS}\"]\naudit = true\n"),
    );
    let process = crate::common::process::spawn(
        &dir.path().join("data"),
        &[
            "--config",
            &path("idemd.toml"),
            "--tls-cert",
            &server.cert.to_string_lossy(),
            "--tls-key",
            &server.key.to_string_lossy(),
            "--tls-client-ca",
            &path("ca.pem"),
            "--tls-client-tenants",
            &path("tenants.txt"),
        ],
    );
    let mut grpc = connect(process.addr, &ca.pem, Some(&client))
        .await
        .expect("mTLS connects");
    do_claim(&mut grpc, "audited-key", &[])
        .await
        .expect("claim over mTLS");

    let https = format!("https://localhost:{}", process.addr.port());
    let audit = move |flags: Vec<String>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_idemd"));
        command
            .args(["audit", "--endpoint", PAYMENTS, "--key", "audited-key"])
            .args(flags)
            .env_remove("IDEMD_TARGET_CA")
            .env_remove("IDEMD_CLIENT_CERT")
            .env_remove("IDEMD_CLIENT_KEY");
        command.output().expect("run idemd audit")
    };
    let flags = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (ca_pem, cert, key) = (path("ca.pem"), path("client.crt"), path("client.key"));
    let runs = tokio::task::spawn_blocking({
        let https = https.clone();
        let plain = format!("http://{}", process.addr);
        move || {
            [
                audit(flags(&[
                    "--target",
                    &https,
                    "--ca-file",
                    &ca_pem,
                    "--client-cert",
                    &cert,
                    "--client-key",
                    &key,
                ])),
                audit(flags(&["--target", &https, "--ca-file", &ca_pem])),
                audit(flags(&["--target", &https])),
                audit(flags(&["--target", &plain, "--ca-file", &ca_pem])),
            ]
        }
    })
    .await
    .expect("join");
    let [
        with_certificate,
        without_certificate,
        without_ca,
        plaintext_with_ca,
    ] = runs;
    let stdout = String::from_utf8_lossy(&with_certificate.stdout);
    assert!(
        with_certificate.status.success(),
        "{}",
        String::from_utf8_lossy(&with_certificate.stderr)
    );
    assert!(stdout.contains("none -> claimed"), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");

    assert!(
        !without_certificate.status.success(),
        "no client certificate"
    );
    assert!(without_certificate.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&without_ca.stderr);
    assert!(!without_ca.status.success());
    assert!(stderr.contains("--ca-file"), "{stderr}");
    let stderr = String::from_utf8_lossy(&plaintext_with_ca.stderr);
    assert!(!plaintext_with_ca.status.success());
    assert!(stderr.contains("https://"), "{stderr}");
    crate::common::process::sigterm(&process);
}
