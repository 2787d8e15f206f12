//! Per-endpoint policies: the knobs that decide dedup window, lease, wait
//! cap, response cap and what happens to a claim whose lease ran out.

use std::collections::HashMap;
use std::time::Duration;

/// What a Claim does when it finds an IN_PROGRESS record whose lease expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpiredLeasePolicy {
    /// Report `pending` (409, "outcome_pending"): the holder may have run the
    /// side effect, so a human or a reconciler decides. The safe default.
    Reconcile,
    /// Hand the key to the new caller (attempt + 1, new token); the old
    /// holder is fenced out. Only for side effects that are themselves
    /// idempotent downstream (e.g. forwarded with a derived key).
    Takeover,
}

/// Default [`Policy::max_clock_skew`]: ten times what NTP keeps between
/// machines of one network (a few ms; cloud time services under 1 ms), and
/// small against any lease: a takeover waits this much longer.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_millis(100);

/// Largest [`Policy::max_clock_skew`] accepted: clocks further apart than
/// this need fixing, not a longer wait.
pub const MAX_CLOCK_SKEW_LIMIT: Duration = Duration::from_secs(60);

/// The effective policy of one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Dedup window when the Claim does not ask for one.
    pub ttl: Duration,
    /// Largest dedup window a Claim may ask for.
    pub max_ttl: Duration,
    /// Lease when the Claim does not ask for one.
    pub lease: Duration,
    /// Cap on a Claim's `wait`.
    pub max_wait: Duration,
    /// Cap on a stored response (body + headers + body_ref), in bytes.
    pub max_response_bytes: usize,
    /// JSON Pointers always dropped before fingerprinting (merged with the
    /// request's own list).
    pub ignore_fields: Vec<String>,
    /// What to do with an expired lease.
    pub on_expired_lease: ExpiredLeasePolicy,
    /// The largest difference between two replicas' clocks that leases
    /// must tolerate: a lease is judged expired by the replica that reads
    /// it, on its own clock, so with `takeover` a replica whose clock runs
    /// ahead would hand a second caller a lease its holder still has. A
    /// lease is taken over only once it has been expired this long here.
    pub max_clock_skew: Duration,
    /// Append every transition of this endpoint's keys to the audit log.
    pub audit: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(24 * 3600),
            max_ttl: Duration::from_secs(7 * 24 * 3600),
            lease: Duration::from_secs(60),
            max_wait: Duration::from_secs(10),
            max_response_bytes: 256 * 1024,
            ignore_fields: Vec::new(),
            on_expired_lease: ExpiredLeasePolicy::Reconcile,
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            audit: false,
        }
    }
}

/// The default policy plus per-endpoint overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySet {
    /// Applies to every endpoint without an entry.
    pub default: Policy,
    /// Exact endpoint name → its policy.
    pub endpoints: HashMap<String, Policy>,
}

impl PolicySet {
    /// The policy of `endpoint`.
    pub fn for_endpoint(&self, endpoint: &str) -> &Policy {
        self.endpoints.get(endpoint).unwrap_or(&self.default)
    }

    /// Whether any endpoint (or the default) is audited: the audit log is
    /// only opened then.
    pub fn any_audited(&self) -> bool {
        self.default.audit || self.endpoints.values().any(|policy| policy.audit)
    }

    /// The longest `max_ttl` of any policy: how long a record may live,
    /// which bounds what a backend keeps for a record it cannot read
    /// (`CqlOptions::max_ttl`).
    pub fn longest_max_ttl(&self) -> std::time::Duration {
        self.endpoints
            .values()
            .map(|policy| policy.max_ttl)
            .chain([self.default.max_ttl])
            .max()
            .unwrap_or_default()
    }
}
