//! Per-tenant limit on key creation (the article: "key creation is
//! rate-limited"): a token bucket per tenant, charged only when a Claim is
//! about to create a record, so replays and in-progress answers (which
//! create nothing) are never refused by it.
//!
//! Time comes from the engine's clock, so tests drive refills with a manual
//! clock instead of sleeping.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Buckets kept before full ones are forgotten (a full bucket is the same
/// as no bucket, so dropping it changes nothing). Bounds memory when auth
/// is off and tenants come from an untrusted header.
const MAX_TRACKED_TENANTS: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated_ms: i64,
}

/// Token buckets of new-key Claims, one per tenant.
#[derive(Debug)]
pub struct ClaimLimiter {
    /// Tokens added per millisecond.
    per_ms: f64,
    /// Bucket size: the burst a tenant may create at once.
    burst: f64,
    /// Tenant → bucket. One short critical section per new key.
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl ClaimLimiter {
    /// `rate` new keys per second per tenant, bursts of `burst`.
    pub fn new(rate: f64, burst: u32) -> Self {
        Self {
            per_ms: rate / 1000.0,
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn refilled(&self, bucket: Bucket, now_ms: i64) -> f64 {
        let elapsed = (now_ms - bucket.updated_ms).max(0) as f64;
        (bucket.tokens + elapsed * self.per_ms).min(self.burst)
    }

    /// Takes one token for `tenant`, or says how long until one is there.
    pub fn try_acquire(&self, tenant: &str, now_ms: i64) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_TRACKED_TENANTS && !buckets.contains_key(tenant) {
            buckets.retain(|_, bucket| self.refilled(*bucket, now_ms) < self.burst);
        }
        let bucket = buckets.entry(tenant.to_string()).or_insert(Bucket {
            tokens: self.burst,
            updated_ms: now_ms,
        });
        let tokens = self.refilled(*bucket, now_ms);
        if tokens >= 1.0 {
            *bucket = Bucket {
                tokens: tokens - 1.0,
                updated_ms: now_ms,
            };
            return Ok(());
        }
        *bucket = Bucket {
            tokens,
            updated_ms: now_ms,
        };
        let wait_ms = ((1.0 - tokens) / self.per_ms).ceil().max(1.0);
        Err(Duration::from_millis(wait_ms as u64))
    }

    /// Gives back the token of a Claim that did not create the key after
    /// all: it raced with another Claim of the same key, which did. Without
    /// this, N concurrent Claims of one new key would cost N tokens, and a
    /// burst of retries of one operation would be refused as if it created
    /// N keys.
    pub fn refund(&self, tenant: &str, now_ms: i64) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(tenant) {
            let tokens = self.refilled(*bucket, now_ms);
            *bucket = Bucket {
                tokens: (tokens + 1.0).min(self.burst),
                updated_ms: now_ms,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_refills_at_the_rate() {
        let limiter = ClaimLimiter::new(10.0, 3);
        for _ in 0..3 {
            assert_eq!(limiter.try_acquire("a", 0), Ok(()));
        }
        let wait = limiter.try_acquire("a", 0).expect_err("empty");
        assert_eq!(wait, Duration::from_millis(100), "one token per 100 ms");
        assert!(limiter.try_acquire("a", 50).is_err(), "half a token");
        assert_eq!(limiter.try_acquire("a", 100), Ok(()));
        // Other tenants have their own bucket.
        assert_eq!(limiter.try_acquire("b", 100), Ok(()));
        // Refill never exceeds the burst.
        for _ in 0..3 {
            assert_eq!(limiter.try_acquire("a", 1_000_000), Ok(()));
        }
        assert!(limiter.try_acquire("a", 1_000_000).is_err());
    }

    #[test]
    fn a_refund_returns_the_token_up_to_the_burst() {
        let limiter = ClaimLimiter::new(10.0, 2);
        assert_eq!(limiter.try_acquire("a", 0), Ok(()));
        assert_eq!(limiter.try_acquire("a", 0), Ok(()));
        assert!(limiter.try_acquire("a", 0).is_err());
        limiter.refund("a", 0);
        assert_eq!(limiter.try_acquire("a", 0), Ok(()), "the refunded token");
        assert!(limiter.try_acquire("a", 0).is_err());
        // Refunds never lift the bucket above the burst.
        for _ in 0..5 {
            limiter.refund("a", 1_000_000);
        }
        assert_eq!(limiter.try_acquire("a", 1_000_000), Ok(()));
        assert_eq!(limiter.try_acquire("a", 1_000_000), Ok(()));
        assert!(limiter.try_acquire("a", 1_000_000).is_err());
    }

    #[test]
    fn full_buckets_are_forgotten_when_too_many_tenants() {
        let limiter = ClaimLimiter::new(1000.0, 1);
        for i in 0..MAX_TRACKED_TENANTS {
            assert!(limiter.try_acquire(&format!("t{i}"), 0).is_ok());
        }
        // Long after, every bucket is full again: a new tenant evicts them.
        assert!(limiter.try_acquire("new", 10_000).is_ok());
        let tracked = limiter.buckets.lock().expect("lock").len();
        assert_eq!(tracked, 1, "only the new tenant's bucket is kept");
    }
}
