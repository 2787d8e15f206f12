//! What the clients saw, and the checker every scenario shares.
//!
//! The clients record every answer; the checker then asks idemd, after the
//! fault is healed, what it holds for every key the run touched, and
//! compares. The properties are the contract's, stated as a careful client
//! sees them:
//!
//! * **no double execution**: every `claimed` answer for one key carries the
//!   same lease token (a retried Claim with its `attempt_id` gets the same
//!   lease back; anything else is a second execution);
//! * **nothing acknowledged is lost**: every Complete that was answered OK
//!   replays byte for byte at the end;
//! * **no claim is lost**: a key whose Claim was answered `claimed` is, at the
//!   end, held (`in_progress`) or completed with its holder's response; never
//!   free for a new caller;
//! * **replays are the truth**: every replay seen during the run has the body
//!   the key's one holder completed it with;
//! * **every call ends**: once the fault is healed every logical call gets a
//!   definitive answer (no call is left retrying).
//!
//! Per phase, every gRPC status seen is counted, so a scenario reports what
//! its clients went through (`UNAVAILABLE` during a kill, none after).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Everything recorded during one scenario.
#[derive(Debug, Default)]
pub struct History {
    /// Behind one lock: recording is cheap next to an RPC.
    inner: Mutex<Inner>,
}

/// The recorded answers, behind [`History`]'s lock.
#[derive(Debug, Default)]
struct Inner {
    /// The phase statuses are counted under, so a report tells what the
    /// clients saw during the fault from what they saw after it.
    phase: String,
    /// Key → lease tokens handed out in `claimed` answers: two tokens for
    /// one key are a double execution.
    claimed: HashMap<String, HashSet<String>>,
    /// Key → the body of the Complete that was acknowledged: what must
    /// replay at the end.
    acked: HashMap<String, Vec<u8>>,
    /// Key → bodies seen in replays during the run, each checked against
    /// the key's holders.
    replays: HashMap<String, HashSet<Vec<u8>>>,
    /// Phase → status (or outcome) → count, for the report.
    statuses: BTreeMap<String, BTreeMap<String, u64>>,
    /// Phase → replica (its index) → status → count: what the clients of
    /// each replica saw, for scenarios that fault one replica only.
    by_replica: BTreeMap<String, BTreeMap<usize, BTreeMap<String, u64>>>,
    /// Logical calls that never got a definitive answer: each fails the
    /// "every call ends" property.
    undecided: u64,
    /// Answers the contract forbids here (mismatch, an unexpected error),
    /// each failing the scenario.
    unexpected: Vec<String>,
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts what follows under `phase`.
    pub fn phase(&self, phase: &str) {
        self.lock().phase = phase.to_string();
    }

    /// One RPC answer (a status code name, or `ok`).
    pub fn status(&self, status: &str) {
        let mut inner = self.lock();
        let phase = inner.phase.clone();
        *inner
            .statuses
            .entry(phase)
            .or_default()
            .entry(status.to_string())
            .or_default() += 1;
    }

    /// One RPC answer through replica `replica` (its index among the
    /// run's servers): counted for the phase and for the replica.
    pub fn status_via(&self, replica: usize, status: &str) {
        self.status(status);
        let mut inner = self.lock();
        let phase = inner.phase.clone();
        *inner
            .by_replica
            .entry(phase)
            .or_default()
            .entry(replica)
            .or_default()
            .entry(status.to_string())
            .or_default() += 1;
    }

    /// Answers through `replica` that were OK so far, in every phase.
    pub fn ok_count_via(&self, replica: usize) -> u64 {
        let inner = self.lock();
        inner
            .by_replica
            .values()
            .filter_map(|replicas| replicas.get(&replica)?.get("ok"))
            .sum()
    }

    /// Answers that were OK so far, in every phase.
    pub fn ok_count(&self) -> u64 {
        let inner = self.lock();
        inner
            .statuses
            .values()
            .filter_map(|codes| codes.get("ok"))
            .sum()
    }

    /// A `claimed` answer.
    pub fn claimed(&self, key: &str, token: &str) {
        self.lock()
            .claimed
            .entry(key.to_string())
            .or_default()
            .insert(token.to_string());
    }

    /// An acknowledged Complete.
    pub fn acked(&self, key: &str, body: &[u8]) {
        self.lock().acked.insert(key.to_string(), body.to_vec());
    }

    /// A replay seen during the run.
    pub fn replayed(&self, key: &str, body: &[u8]) {
        self.lock()
            .replays
            .entry(key.to_string())
            .or_default()
            .insert(body.to_vec());
    }

    /// A logical call that gave up without a definitive answer.
    pub fn undecided(&self) {
        self.lock().undecided += 1;
    }

    /// An answer the contract forbids in these scenarios.
    pub fn unexpected(&self, what: String) {
        self.lock().unexpected.push(what);
    }

    /// Keys the run touched, with what the checker must find for each.
    pub fn expectations(&self) -> Vec<Expectation> {
        expectations(&self.lock())
    }

    /// What was acknowledged so far: the keys a backup taken now must hold,
    /// each with the response acknowledged for it so far, if any.
    pub fn acknowledged_now(&self) -> Vec<Expectation> {
        expectations(&self.lock())
    }

    /// The verdict on a store restored from a backup taken when
    /// `acknowledged` was recorded ([`Self::acknowledged_now`]): each of
    /// those keys must replay what was acknowledged for it then, or, with
    /// no Complete acknowledged then, be held or completed by one of its
    /// holders (of the whole run: a holder may have completed it after the
    /// backup began). Keys first claimed later are not judged.
    pub fn verdict_as_of(
        &self,
        acknowledged: &[Expectation],
        finals: &HashMap<String, Final>,
    ) -> Verdict {
        let inner = self.lock();
        let mut verdict = Verdict {
            keys: acknowledged.len(),
            acked: acknowledged.iter().filter(|e| e.acked.is_some()).count(),
            statuses: inner.statuses.clone(),
            undecided: inner.undecided,
            unexpected: inner.unexpected.clone(),
            ..Verdict::default()
        };
        for expectation in acknowledged {
            let key = &expectation.key;
            let tokens = inner.claimed.get(key);
            let by_holder = |body: &Vec<u8>| {
                tokens.is_some_and(|tokens| tokens.iter().any(|t| body == &response_body(key, t)))
            };
            match (finals.get(key), &expectation.acked) {
                (Some(Final::Replayed(body)), Some(acked)) if body == acked => {}
                (Some(Final::Replayed(body)), None) if by_holder(body) => {}
                (Some(Final::InProgress), None) => {}
                (found, acked) => verdict.lost.push(format!(
                    "{key}: expected {} (as of the backup), found {found:?}",
                    if acked.is_some() {
                        "the acknowledged response"
                    } else {
                        "the claim held or completed by its holder"
                    }
                )),
            }
        }
        verdict
    }

    /// The verdict, given what the final reads found (`finals`: key →
    /// what the server held after the heal); `data_loss` says how a key
    /// answered `DATA_LOSS` counts.
    pub fn verdict(&self, finals: &HashMap<String, Final>, data_loss: DataLoss) -> Verdict {
        let inner = self.lock();
        let mut verdict = Verdict {
            keys: finals.len(),
            acked: inner.acked.len(),
            statuses: inner.statuses.clone(),
            by_replica: inner.by_replica.clone(),
            undecided: inner.undecided,
            unexpected: inner.unexpected.clone(),
            ..Verdict::default()
        };
        for (key, tokens) in &inner.claimed {
            if tokens.len() > 1 {
                verdict
                    .double
                    .push(format!("{key}: {} lease tokens", tokens.len()));
            }
        }
        for (key, bodies) in &inner.replays {
            for body in bodies {
                let holder = inner.claimed.get(key).is_some_and(|tokens| {
                    tokens
                        .iter()
                        .any(|token| body == &response_body(key, token))
                });
                if !holder {
                    verdict
                        .wrong_replays
                        .push(format!("{key}: replayed a body no holder of the key sent"));
                }
            }
        }
        for expectation in expectations(&inner) {
            let key = &expectation.key;
            match (finals.get(key), &expectation.acked) {
                (Some(Final::Replayed(body)), Some(acked)) if body == acked => {}
                (Some(Final::Replayed(body)), None)
                    if expectation
                        .tokens
                        .iter()
                        .any(|token| body == &response_body(key, token)) =>
                {
                    // Completed, the acknowledgement lost with the fault.
                }
                (Some(Final::InProgress), None) => {}
                (Some(Final::DataLoss), _) if data_loss == DataLoss::Expected => {
                    verdict.data_loss += 1;
                }
                (found, acked) => verdict.lost.push(format!(
                    "{key}: expected {}, found {found:?}",
                    if acked.is_some() {
                        "the acknowledged response"
                    } else {
                        "the claim held or completed by its holder"
                    }
                )),
            }
        }
        verdict
    }
}

fn expectations(inner: &Inner) -> Vec<Expectation> {
    let mut keys: Vec<&String> = inner.claimed.keys().chain(inner.acked.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|key| Expectation {
            key: key.clone(),
            acked: inner.acked.get(key).cloned(),
            tokens: inner.claimed.get(key).cloned().unwrap_or_default(),
        })
        .collect()
}

/// The body a holder completes `key` with: derived from its lease token, so
/// a replay tells which holder's Complete it is.
pub fn response_body(key: &str, token: &str) -> Vec<u8> {
    format!(
        "{{\"key\":\"{key}\",\"holder\":\"{token}\",\"pad\":\"{}\"}}",
        "x".repeat(200)
    )
    .into_bytes()
}

/// How the verdict counts a key the server answers `DATA_LOSS` for at the
/// end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataLoss {
    /// As lost: the scenario damaged nothing, so a record the server
    /// cannot read is one it lost.
    IsLoss,
    /// Apart, in [`Verdict::data_loss`]: the scenario damaged the data on
    /// purpose, and refusing to answer from a damaged record is the right
    /// answer.
    Expected,
}

/// What the final check must find for one key.
#[derive(Debug, Clone)]
pub struct Expectation {
    /// The key, read back with Lookup at the end.
    pub key: String,
    /// The acknowledged response, if a Complete was acknowledged: it must
    /// replay byte for byte.
    pub acked: Option<Vec<u8>>,
    /// Lease tokens handed out for it: without an acknowledgement, the
    /// key must be held or completed by one of these holders.
    pub tokens: HashSet<String>,
}

/// What the server holds for a key after the heal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Final {
    /// The stored response.
    Replayed(Vec<u8>),
    /// Held by someone.
    InProgress,
    /// Free: a new caller would win it (the claim was lost).
    Claimed,
    /// `DATA_LOSS`: the server refused to answer from a corrupt record.
    DataLoss,
    /// Anything else.
    Other(String),
}

/// The checker's findings for one scenario.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Verdict {
    /// Keys checked at the end.
    pub keys: usize,
    /// Acknowledged Completes.
    pub acked: usize,
    /// Keys with two holders.
    pub double: Vec<String>,
    /// Acknowledged responses or claims missing or different at the end.
    pub lost: Vec<String>,
    /// Replays whose body no holder sent.
    pub wrong_replays: Vec<String>,
    /// Logical calls left without a definitive answer.
    pub undecided: u64,
    /// Answers the contract forbids here.
    pub unexpected: Vec<String>,
    /// Keys answered `DATA_LOSS` where the scenario corrupts data on purpose.
    pub data_loss: usize,
    /// Phase → status → count.
    pub statuses: BTreeMap<String, BTreeMap<String, u64>>,
    /// Phase → replica → status → count (scenarios with several replicas).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_replica: BTreeMap<String, BTreeMap<usize, BTreeMap<String, u64>>>,
}

impl Verdict {
    /// Whether every property held.
    pub fn passed(&self) -> bool {
        self.double.is_empty()
            && self.lost.is_empty()
            && self.wrong_replays.is_empty()
            && self.undecided == 0
            && self.unexpected.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checker fails on each property it names (a checker that cannot
    /// fail proves nothing).
    #[test]
    fn each_violation_is_caught() {
        let history = History::default();
        history.claimed("a", "t1");
        history.acked("a", &response_body("a", "t1"));
        history.claimed("b", "t2");
        history.claimed("b", "t3");
        history.replayed("c", b"forged");
        history.claimed("d", "t4");
        let finals = HashMap::from([
            ("a".to_string(), Final::Replayed(response_body("a", "t1"))),
            ("b".to_string(), Final::InProgress),
            ("d".to_string(), Final::Claimed),
        ]);
        let verdict = history.verdict(&finals, DataLoss::IsLoss);
        assert_eq!(verdict.double.len(), 1, "{verdict:?}");
        assert_eq!(verdict.wrong_replays.len(), 1, "{verdict:?}");
        assert_eq!(verdict.lost.len(), 1, "d was free again: {verdict:?}");
        assert!(!verdict.passed());

        let history = History::default();
        history.claimed("a", "t1");
        history.acked("a", &response_body("a", "t1"));
        let finals = HashMap::from([("a".to_string(), Final::Replayed(b"other".to_vec()))]);
        assert_eq!(history.verdict(&finals, DataLoss::IsLoss).lost.len(), 1);
        let finals = HashMap::from([("a".to_string(), Final::Replayed(response_body("a", "t1")))]);
        assert!(history.verdict(&finals, DataLoss::IsLoss).passed());
    }

    /// A key answered `DATA_LOSS` is lost unless the scenario damaged the
    /// data on purpose; then it is counted apart and the run can pass.
    #[test]
    fn data_loss_counts_as_lost_unless_expected() {
        let history = History::default();
        history.claimed("a", "t1");
        history.acked("a", &response_body("a", "t1"));
        let finals = HashMap::from([("a".to_string(), Final::DataLoss)]);
        let lost = history.verdict(&finals, DataLoss::IsLoss);
        assert_eq!((lost.lost.len(), lost.data_loss), (1, 0), "{lost:?}");
        let expected = history.verdict(&finals, DataLoss::Expected);
        assert_eq!((expected.lost.len(), expected.data_loss), (0, 1));
        assert!(expected.passed(), "{expected:?}");
    }
}
