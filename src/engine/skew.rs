//! This replica's clock against the cluster's, and the takeovers it must
//! not make while the two disagree.
//!
//! A lease is judged expired by the replica that reads it, on its own
//! clock, against an expiry the holder's replica wrote on its clock. The
//! takeover policy waits `max_clock_skew` past the expiry to cover the
//! difference between those two clocks; nothing checked that the clocks
//! really stay that close. Each replica therefore measures its offset
//! against one reference every replica shares, the store's clock
//! ([`crate::store::Store::cluster_time_ms`]; CQL: a coordinator's), at
//! every maintenance step, and exports it (`idemd_clock_offset_seconds`).
//! If every replica stays within half of `max_clock_skew` of the
//! reference, any two stay within `max_clock_skew` of each other; a
//! replica that cannot show that about itself refuses to take a lease
//! over (it answers IN_PROGRESS, and another replica, or this one once its
//! clock is back, takes the key over). Refusing only delays a takeover;
//! the other direction, a lease handed to a second caller while its holder
//! still runs, is the double execution the contract forbids. For the same
//! reason such a replica grants and extends no lease (its end would be
//! computed on the suspect clock): those calls fail with `UNAVAILABLE`
//! (reason `CLOCK_OFFSET`) and the caller retries, on another replica.
//!
//! Until its first measurement a replica on a shared store takes no lease
//! over either (the server's first maintenance step, at start-up, measures
//! it). Stores of one process (embedded, memory)
//! report no cluster clock: there is no second replica to disagree with,
//! and nothing is refused.

use std::sync::Mutex;
use std::time::Duration;

use crate::clock::SharedClock;
use crate::store::{Store, StoreResult};

/// Clock readings per measurement; the one with the shortest round trip
/// is kept (the NTP rule: the least time in flight bounds the error best).
pub const PROBES: usize = 5;

/// One measurement of this replica's clock against the cluster's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offset {
    /// This replica's clock minus the cluster's, in ms: positive when this
    /// replica runs ahead (and would see leases expire early).
    pub offset_ms: i64,
    /// Half the round trip of the reading kept, plus the store clock's
    /// resolution: the true offset lies within `offset_ms ± error_ms`.
    pub error_ms: i64,
}

impl Offset {
    /// Whether this offset may exceed `bound_ms` either way.
    fn may_exceed(&self, bound_ms: i64) -> bool {
        self.offset_ms.abs().saturating_add(self.error_ms) > bound_ms
    }
}

/// The last measurement of this replica.
#[derive(Debug, Default)]
pub struct Skew {
    /// The store has a cluster clock: until a measurement succeeded, no
    /// takeover (a replica that has not looked cannot vouch for its clock).
    required: bool,
    /// `None` until a measurement succeeded, and for stores of one
    /// process.
    last: Mutex<Option<Offset>>,
}

impl Skew {
    /// A tracker for a store that has a cluster clock (`required`) or not.
    pub fn new(required: bool) -> Self {
        Self {
            required,
            last: Mutex::default(),
        }
    }

    /// Whether this replica must measure its offset before it takes a
    /// lease over (a shared store, a clock that follows real time).
    pub fn required(&self) -> bool {
        self.required
    }

    /// Measures the offset of `clock` against `store`'s clock with
    /// [`PROBES`] readings; keeps and returns it (`None`: the store has no
    /// cluster clock).
    pub async fn measure(
        &self,
        store: &dyn Store,
        clock: &SharedClock,
    ) -> StoreResult<Option<Offset>> {
        let mut best: Option<(i64, Offset)> = None;
        for _ in 0..PROBES {
            let sent = clock.now_ms();
            let Some(cluster) = store.cluster_time_ms().await? else {
                return Ok(None);
            };
            let received = clock.now_ms();
            let round_trip = (received - sent).max(0);
            let offset = Offset {
                offset_ms: sent + round_trip / 2 - cluster,
                // The cluster's clock is read in whole ms.
                error_ms: round_trip / 2 + 1,
            };
            if best.is_none_or(|(shortest, _)| round_trip < shortest) {
                best = Some((round_trip, offset));
            }
        }
        let offset = best.map(|(_, offset)| offset);
        if let Some(offset) = offset {
            self.record(offset);
        }
        Ok(offset)
    }

    /// Keeps `offset` as the replica's current one.
    pub fn record(&self, offset: Offset) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(offset);
        #[allow(clippy::cast_precision_loss)] // ms offsets are far below 2^52.
        metrics::gauge!(crate::metrics::CLOCK_OFFSET).set(offset.offset_ms as f64 / 1000.0);
    }

    /// The last measurement, if any.
    pub fn last(&self) -> Option<Offset> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why this replica's clock must not decide a lease under
    /// `max_clock_skew` (grant, extend, take over, or report expired), or
    /// `None` when it may: not measured yet on a shared store, or its last
    /// measured offset may exceed half of `max_clock_skew`.
    pub fn distrusts_clock(&self, max_clock_skew: Duration) -> Option<String> {
        // Every Claim of a new key asks: a store of one process answers
        // without taking the lock.
        if !self.required {
            return None;
        }
        let Some(offset) = self.last() else {
            return Some(
                "this replica has not measured its clock against the cluster's yet".to_string(),
            );
        };
        let bound_ms = i64::try_from(max_clock_skew.as_millis() / 2).unwrap_or(i64::MAX);
        offset.may_exceed(bound_ms).then(|| {
            format!(
                "this replica's clock is {} ± {} ms off the cluster's, more than half of max_clock_skew ({} ms)",
                offset.offset_ms,
                offset.error_ms,
                max_clock_skew.as_millis()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::engine::tests::{PAY, TAKEOVER, TENANT, input, policies, response};
    use crate::engine::{ClaimOutcome, Engine};
    use crate::store::memory::MemoryStore;

    /// A manual clock that claims to follow real time: the replicas'
    /// clocks of this test, which it moves like a wall clock.
    struct Wall(ManualClock);

    impl Clock for Wall {
        fn now_ms(&self) -> i64 {
            self.0.now_ms()
        }
    }

    #[test]
    fn an_offset_is_refused_once_it_may_exceed_half_the_skew() {
        assert_eq!(
            Skew::new(false).distrusts_clock(Duration::from_millis(100)),
            None,
            "a store of one process has nothing to measure"
        );
        let skew = Skew::new(true);
        assert!(
            skew.distrusts_clock(Duration::from_millis(100)).is_some(),
            "not measured yet"
        );
        skew.record(Offset {
            offset_ms: 40,
            error_ms: 5,
        });
        assert_eq!(skew.distrusts_clock(Duration::from_millis(100)), None);
        skew.record(Offset {
            offset_ms: -48,
            error_ms: 5,
        });
        assert!(skew.distrusts_clock(Duration::from_millis(100)).is_some());
        assert_eq!(skew.distrusts_clock(Duration::from_secs(1)), None);
    }

    /// A replica whose clock may be more than half of `max_clock_skew` off the
    /// cluster's (measured against the store's clock at each maintenance step)
    /// takes no lease over, even past expiry plus the skew margin by its own
    /// clock, and reports none pending under the default policy: it answers
    /// IN_PROGRESS. Once its offset is back within the bound it takes the key
    /// over, and reports the other pending. Fails without the check in `claim` (the first
    /// claim takes the key over at once).
    #[tokio::test]
    async fn a_replica_too_far_off_the_cluster_clock_takes_no_lease_over() {
        let cluster = ManualClock::new(1_800_000_000_000);
        let store = Arc::new(MemoryStore::new().with_cluster_clock(cluster.clone()));
        let on_time = ManualClock::new(cluster.now_ms());
        let holder = Engine::new(
            store.clone(),
            Arc::new(Wall(on_time.clone())),
            Arc::new(policies()),
            0,
        );
        let ahead = ManualClock::new(cluster.now_ms() + 80);
        let replica = Engine::new(
            store.clone(),
            Arc::new(Wall(ahead.clone())),
            Arc::new(policies()),
            0,
        );
        // Before measuring, a replica on a shared store grants nothing.
        let unmeasured = holder.claim(TENANT, input(PAY, "early", "{}")).await;
        assert!(
            matches!(unmeasured, Err(crate::engine::EngineError::ClockOffset(_))),
            "granted before measuring: {unmeasured:?}"
        );
        holder.maintain_store().await.expect("maintain");
        replica.maintain_store().await.expect("maintain");
        let offset = replica.clock_offset().expect("measured");
        assert_eq!(offset.offset_ms, 80);

        let ClaimOutcome::Claimed(held) = holder
            .claim(TENANT, input(TAKEOVER, "k", "{}"))
            .await
            .expect("claim")
            .outcome
        else {
            panic!("the first claim wins");
        };
        // Under the default policy (reconcile) the same key is reported
        // pending once expired: not while this replica's clock is suspect.
        let ClaimOutcome::Claimed(_) = holder
            .claim(TENANT, input(PAY, "r", "{}"))
            .await
            .expect("claim")
            .outcome
        else {
            panic!("the first claim wins");
        };
        // 1 s past the 10 s lease and the 100 ms margin, by every clock.
        for clock in [&cluster, &on_time, &ahead] {
            clock.advance(Duration::from_millis(11_100));
        }
        let refused = replica
            .claim(TENANT, input(TAKEOVER, "k", "{}"))
            .await
            .expect("claim")
            .outcome;
        assert!(
            matches!(refused, ClaimOutcome::InProgress { .. }),
            "a replica 80 ms off (bound 50 ms) took a lease over: {refused:?}"
        );
        // A replay needs no clock: answered from the record.
        let ClaimOutcome::Claimed(done) = holder
            .claim(TENANT, input(PAY, "done", "{}"))
            .await
            .expect("claim")
            .outcome
        else {
            panic!("the first claim wins");
        };
        holder
            .complete(TENANT, PAY, "done", &done.lease_token, response("ok"))
            .await
            .expect("complete");
        let replay = replica
            .claim(TENANT, input(PAY, "done", "{}"))
            .await
            .expect("claim")
            .outcome;
        assert!(
            matches!(replay, ClaimOutcome::Replayed { .. }),
            "a replay refused for the clock: {replay:?}"
        );
        let new_key = replica.claim(TENANT, input(TAKEOVER, "new", "{}")).await;
        assert!(
            matches!(new_key, Err(crate::engine::EngineError::ClockOffset(_))),
            "a replica 80 ms off granted a lease on its clock: {new_key:?}"
        );
        let not_pending = replica
            .claim(TENANT, input(PAY, "r", "{}"))
            .await
            .expect("claim")
            .outcome;
        assert!(
            matches!(not_pending, ClaimOutcome::InProgress { .. }),
            "a replica 80 ms off reported a lease pending: {not_pending:?}"
        );

        // The cluster's clock catches up with the replica's: offset 0.
        cluster.advance(Duration::from_millis(80));
        replica.maintain_store().await.expect("maintain");
        assert_eq!(replica.clock_offset().map(|o| o.offset_ms), Some(0));
        match replica
            .claim(TENANT, input(TAKEOVER, "k", "{}"))
            .await
            .expect("claim")
            .outcome
        {
            ClaimOutcome::Claimed(lease) => assert_ne!(lease.lease_token, held.lease_token),
            other => panic!("expected a takeover, got {other:?}"),
        }
        let pending = replica
            .claim(TENANT, input(PAY, "r", "{}"))
            .await
            .expect("claim")
            .outcome;
        assert!(
            matches!(pending, ClaimOutcome::Pending { .. }),
            "expected pending, got {pending:?}"
        );
    }
}
