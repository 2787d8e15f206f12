//! The machine and the versions a comparison ran on, for the report's
//! header: read once, after the measurements.

use std::path::Path;

use super::lineup::repo_root;
use super::options::Common;
use crate::report::Environment;

/// Output of a command's first line, or "?".
async fn version_of(program: &Path, arg: &str) -> String {
    match tokio::process::Command::new(program)
        .arg(arg)
        .output()
        .await
    {
        Ok(output) => {
            let text = if output.stdout.is_empty() {
                output.stderr
            } else {
                output.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("?")
                .trim()
                .to_string()
        }
        Err(_) => "?".to_string(),
    }
}

pub(super) async fn environment(common: &Common) -> Environment {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|m| m.trim().to_string())
        .unwrap_or_else(|| "?".to_string());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    let mut versions = Vec::new();
    if let Ok(bin) = common.idemd_bin() {
        versions.push(("idemd".to_string(), version_of(&bin, "--version").await));
    }
    versions.push((
        "rustc".to_string(),
        version_of(Path::new("rustc"), "--version").await,
    ));
    versions.push(("tonic".to_string(), "0.14".to_string()));
    if let Some(bindir) = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|entries| entries.flatten().map(|e| e.path()).max())
    {
        versions.push((
            "postgres".to_string(),
            version_of(&bindir.join("bin/postgres"), "--version").await,
        ));
    }
    versions.push((
        "redis".to_string(),
        version_of(Path::new("redis-server"), "--version").await,
    ));
    let cassandra = std::fs::read_to_string(repo_root().join(".cache/cassandra/nodes/cluster.env"))
        .ok()
        .and_then(|env| {
            env.lines()
                .find_map(|l| l.strip_prefix("VERSION=").map(str::to_string))
        });
    if let Some(version) = cassandra {
        versions.push(("cassandra".to_string(), version));
    }
    Environment {
        cores,
        cpu_model,
        memory_gib,
        kernel,
        versions,
    }
}
