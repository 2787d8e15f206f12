//! The TOML policy file: defaults and per-endpoint overrides, and the
//! checks of one policy.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::defaults::{MAX_RESPONSE_BYTES_LIMIT, MAX_WAIT_LIMIT};
use super::error::ConfigError;
use crate::engine::{ExpiredLeasePolicy, MAX_CLOCK_SKEW_LIMIT, Policy, PolicySet};
use crate::fingerprint;

pub(super) fn validate_policy(prefix: &str, policy: &Policy) -> Result<(), ConfigError> {
    let field = |name: &str| format!("{prefix}.{name}");
    let show = |d: Duration| humantime::format_duration(d).to_string();
    for (name, value) in [
        ("ttl", policy.ttl),
        ("max_ttl", policy.max_ttl),
        ("lease", policy.lease),
    ] {
        if value < Duration::from_millis(1) {
            return Err(ConfigError::new(field(name), "must be at least 1ms"));
        }
    }
    if policy.ttl > policy.max_ttl {
        return Err(ConfigError::new(
            field("ttl"),
            format!(
                "{} exceeds max_ttl {}",
                show(policy.ttl),
                show(policy.max_ttl)
            ),
        ));
    }
    if policy.max_clock_skew > MAX_CLOCK_SKEW_LIMIT {
        return Err(ConfigError::new(
            field("max_clock_skew"),
            format!(
                "{} exceeds {}: synchronise the replicas' clocks (NTP) instead",
                show(policy.max_clock_skew),
                show(MAX_CLOCK_SKEW_LIMIT)
            ),
        ));
    }
    if policy.lease > policy.ttl {
        return Err(ConfigError::new(
            field("lease"),
            format!("{} exceeds ttl {}", show(policy.lease), show(policy.ttl)),
        ));
    }
    if policy.max_wait > MAX_WAIT_LIMIT {
        return Err(ConfigError::new(
            field("max_wait"),
            format!("at most {}", show(MAX_WAIT_LIMIT)),
        ));
    }
    if policy.max_response_bytes == 0 || policy.max_response_bytes > MAX_RESPONSE_BYTES_LIMIT {
        return Err(ConfigError::new(
            field("max_response_bytes"),
            format!("must be between 1 and {MAX_RESPONSE_BYTES_LIMIT}"),
        ));
    }
    let pointers: Vec<&str> = policy.ignore_fields.iter().map(String::as_str).collect();
    fingerprint::parse_ignore_fields(&pointers)
        .map_err(|e| ConfigError::new(field("ignore_fields"), e.to_string()))?;
    Ok(())
}

/// One policy table of the file; absent fields inherit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default, with = "humantime_serde")]
    ttl: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    max_ttl: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    lease: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    max_wait: Option<Duration>,
    max_response_bytes: Option<usize>,
    ignore_fields: Option<Vec<String>>,
    on_expired_lease: Option<ExpiredLeasePolicy>,
    #[serde(default, with = "humantime_serde")]
    max_clock_skew: Option<Duration>,
    audit: Option<bool>,
}

impl PolicyFile {
    fn over(&self, base: &Policy) -> Policy {
        Policy {
            ttl: self.ttl.unwrap_or(base.ttl),
            max_ttl: self.max_ttl.unwrap_or(base.max_ttl),
            lease: self.lease.unwrap_or(base.lease),
            max_wait: self.max_wait.unwrap_or(base.max_wait),
            max_response_bytes: self.max_response_bytes.unwrap_or(base.max_response_bytes),
            ignore_fields: self
                .ignore_fields
                .clone()
                .unwrap_or_else(|| base.ignore_fields.clone()),
            on_expired_lease: self.on_expired_lease.unwrap_or(base.on_expired_lease),
            max_clock_skew: self.max_clock_skew.unwrap_or(base.max_clock_skew),
            audit: self.audit.unwrap_or(base.audit),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    defaults: PolicyFile,
    #[serde(default)]
    endpoints: HashMap<String, PolicyFile>,
}

/// Parses policy TOML text.
pub fn parse_policies(text: &str) -> Result<PolicySet, ConfigError> {
    let file: ConfigFile = toml::from_str(text)
        .map_err(|e| ConfigError::new("config", e.to_string().trim_end().replace('\n', " ")))?;
    let default = file.defaults.over(&Policy::default());
    let endpoints = file
        .endpoints
        .iter()
        .map(|(name, policy)| (name.clone(), policy.over(&default)))
        .collect();
    Ok(PolicySet { default, endpoints })
}

pub(super) fn load_policies(path: &Path) -> Result<PolicySet, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("config", format!("cannot read {}: {e}", path.display())))?;
    parse_policies(&text)
}
