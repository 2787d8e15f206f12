//! The `idemd keys` suite on the embedded store, and the runbook's
//! example.

use crate::common::start_embedded as start;

keys_suite!(crate::common::start_embedded);

/// The `idemd keys` example of docs/operations.md runs as written against
/// a live server: the stale key is listed, committed, then replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_incident_commands_run_as_written() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("operations.md");
    let block = doc
        .split("<!-- operations-keys-example -->")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the marked example block")
        .to_string();
    let server = start(Box::new(|_| {})).await;
    let key = "pay-timeout-7";
    let mut request = crate::common::claim(crate::common::PAYMENTS, key, 7);
    request.lease = Some(crate::common::dur(std::time::Duration::from_secs(5)));
    let mut client = server.client.clone();
    client
        .claim(crate::common::as_tenant("acme", request))
        .await
        .expect("claim");
    server.clock.advance(std::time::Duration::from_secs(120));

    let work = tempfile::tempdir().expect("temp dir");
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).expect("bin dir");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_idemd"), bin.join("idemd")).expect("symlink");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (addr, cwd) = (server.addr, work.path().to_path_buf());
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block])
            .current_dir(cwd)
            .env("PATH", path)
            .env("KEY", key)
            .env("IDEMD_TARGET", format!("http://{addr}"))
            .env("IDEMD_TENANT", "acme")
            .env_remove("IDEMD_TOKEN")
            .output()
            .expect("bash runs")
    })
    .await
    .expect("join");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains(key), "{text}");
    let record: serde_json::Value = text
        .lines()
        .find(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .expect("the JSON record");
    assert_eq!(record["state"], "STATE_COMPLETED");
    assert_eq!(record["response"]["status"], 201);
    assert!(
        text.trim_end().ends_with("REASON"),
        "the last `pending` lists nothing: {text}"
    );
    server.stop().await;
}
