//! An in-memory [`Store`]: the storage contract with nothing durable.
//!
//! # Why
//!
//! The engine's state machine deserves tests that run in microseconds,
//! without a network, a disk or a fsync (`engine/tests.rs`), and the engine's
//! own cost per operation deserves a number of its own, apart from storage.
//! This store gives both. It passes the same conformance suite as the real
//! backends (`tests/it/store_embedded.rs`, module `memory`), so what the engine relies on holds
//! here too. It is not a server option: nothing survives a restart.
//!
//! One mutex guards the records and the pending index together, which makes
//! every method atomic on its record like the real backends' conditional
//! writes. [`MemoryStore::inject`] makes the next writes fail, or apply and
//! then report an unknown outcome, so the engine's handling of store faults
//! is testable without a broken disk.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;

use super::contract::{
    CasOutcome, Expected, InsertOutcome, PendingPage, PendingQuery, Store, StoreResult,
};
use super::error::StoreError;
use super::record::{Record, RecordKey};

/// Position in the pending index: tenant, when the record started to need
/// a decision, endpoint, key (the order ListPending pages in).
type PendingEntry = (String, i64, String, String);

/// The records and their pending index, changed together.
#[derive(Debug, Default)]
struct Tables {
    /// Every record, live or expired-but-not-swept.
    records: HashMap<RecordKey, Record>,
    /// Records that are or will be pending (in progress, failed, unknown),
    /// by [`Record::pending_since_ms`].
    pending: BTreeSet<PendingEntry>,
    /// Expiry index for the sweeper: (expires_at, key).
    expiry: BTreeMap<(i64, RecordKey), ()>,
    /// What the next writes do instead of succeeding, oldest first.
    faults: Vec<WriteFault>,
    /// Set by `close`.
    closed: bool,
}

impl Tables {
    fn unindex(&mut self, record: &Record) {
        if let Some(since) = record.pending_since_ms() {
            self.pending.remove(&pending_entry(since, &record.id));
        }
        self.expiry
            .remove(&(record.expires_at_ms, record.id.clone()));
    }

    fn put(&mut self, record: &Record) {
        if let Some(previous) = self.records.insert(record.id.clone(), record.clone()) {
            self.unindex(&previous);
        }
        if let Some(since) = record.pending_since_ms() {
            self.pending.insert(pending_entry(since, &record.id));
        }
        self.expiry
            .insert((record.expires_at_ms, record.id.clone()), ());
    }

    fn remove(&mut self, id: &RecordKey) {
        if let Some(previous) = self.records.remove(id) {
            self.unindex(&previous);
        }
    }

    fn live(&self, id: &RecordKey, now_ms: i64) -> Option<&Record> {
        self.records.get(id).filter(|record| record.is_live(now_ms))
    }

    /// Whether the store is open.
    fn check(&self) -> StoreResult<()> {
        if self.closed {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    /// Before a write: the injected fault to apply to it, if any.
    fn write_fault(&mut self) -> StoreResult<Option<WriteFault>> {
        self.check()?;
        Ok((!self.faults.is_empty()).then(|| self.faults.remove(0)))
    }
}

/// What an injected fault does to the next write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteFault {
    /// Nothing is written; the write returns this error.
    Refuse(StoreError),
    /// The write is applied, then reported as [`StoreError::Uncertain`]:
    /// what a timed-out Paxos round or a failed fsync looks like.
    AppliedButUncertain,
}

/// Runs `write` under `fault`.
fn faulty<T>(fault: Option<WriteFault>, write: impl FnOnce() -> T) -> StoreResult<T> {
    match fault {
        None => Ok(write()),
        Some(WriteFault::Refuse(error)) => Err(error),
        Some(WriteFault::AppliedButUncertain) => {
            write();
            Err(StoreError::Uncertain(
                "injected: applied, outcome not reported".to_string(),
            ))
        }
    }
}

fn pending_entry(since_ms: i64, id: &RecordKey) -> PendingEntry {
    (
        id.tenant.clone(),
        since_ms,
        id.endpoint.clone(),
        id.key.clone(),
    )
}

/// A page token: the last entry's position after the tenant.
fn encode_token(since_ms: i64, endpoint: &str, key: &str) -> Vec<u8> {
    let mut out = since_ms.to_be_bytes().to_vec();
    out.extend_from_slice(
        &u32::try_from(endpoint.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(endpoint.as_bytes());
    out.extend_from_slice(key.as_bytes());
    out
}

fn decode_token(token: &[u8]) -> Option<(i64, String, String)> {
    let (since, rest) = token.split_first_chunk::<8>()?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
    if rest.len() < len {
        return None;
    }
    let (endpoint, key) = rest.split_at(len);
    Some((
        i64::from_be_bytes(*since),
        String::from_utf8(endpoint.to_vec()).ok()?,
        String::from_utf8(key.to_vec()).ok()?,
    ))
}

/// The in-memory store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// Everything, behind one lock (see the module docs).
    tables: Mutex<Tables>,
    /// Calls of [`Store::get`]: lets engine tests prove a path does not read.
    reads: std::sync::atomic::AtomicU64,
    /// Calls of [`Store::insert_if_absent`]: lets engine tests prove a path
    /// makes no conditional insert (on CQL, a Paxos round).
    inserts: std::sync::atomic::AtomicU64,
    /// `max_records` of each [`Store::sweep_expired`] call, in order: lets
    /// engine tests prove a sweep runs in bounded steps.
    sweep_requests: Mutex<Vec<usize>>,
    /// The answer of [`Store::read_before_insert`]: `false` makes the engine
    /// treat this store like the CQL backend (engine tests of that path).
    insert_first: bool,
    /// The clock [`Store::cluster_time_ms`] reads, standing in for a
    /// shared cluster's (engine tests of clock offsets); `None` answers
    /// `None`, as a store of one process does.
    cluster_clock: Option<crate::clock::ManualClock>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store for which Claim skips its read before inserting, as it does
    /// on the CQL backend.
    pub fn inserting_first() -> Self {
        Self {
            insert_first: true,
            ..Self::default()
        }
    }

    /// A store that reports `clock` as the cluster's clock
    /// ([`Store::cluster_time_ms`]).
    #[must_use]
    pub fn with_cluster_clock(mut self, clock: crate::clock::ManualClock) -> Self {
        self.cluster_clock = Some(clock);
        self
    }

    /// Makes the next write (insert, replace or delete; reads are not
    /// affected) behave as `fault`; calls queue up, one per write.
    pub fn inject(&self, fault: WriteFault) {
        self.lock().faults.push(fault);
    }

    /// How many times [`Store::get`] was called.
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times [`Store::insert_if_absent`] was called.
    pub fn inserts(&self) -> u64 {
        self.inserts.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The `max_records` of every sweep asked of this store, in order.
    pub fn sweep_requests(&self) -> Vec<usize> {
        self.sweep_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every record held, expired or not (for tests).
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A panic while holding the lock leaves consistent tables: every
        // change is made by `put` or `remove`, which do not panic midway.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn backend_name(&self) -> &'static str {
        "memory"
    }

    fn read_before_insert(&self) -> bool {
        !self.insert_first
    }

    async fn get(&self, id: &RecordKey, now_ms: i64) -> StoreResult<Option<Record>> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tables = self.lock();
        tables.check()?;
        Ok(tables.live(id, now_ms).cloned())
    }

    async fn insert_if_absent(&self, record: &Record, now_ms: i64) -> StoreResult<InsertOutcome> {
        self.inserts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tables = self.lock();
        let fault = tables.write_fault()?;
        if let Some(existing) = tables.live(&record.id, now_ms) {
            return Ok(InsertOutcome::Exists(existing.clone()));
        }
        faulty(fault, || tables.put(record))?;
        Ok(InsertOutcome::Inserted)
    }

    async fn replace_if(
        &self,
        record: &Record,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let mut tables = self.lock();
        let fault = tables.write_fault()?;
        match tables.live(&record.id, now_ms) {
            Some(current) if expected.is_met_by(current) => {
                faulty(fault, || tables.put(record))?;
                Ok(CasOutcome::Applied)
            }
            current => Ok(CasOutcome::Conflict {
                current: current.cloned(),
            }),
        }
    }

    async fn delete_if(
        &self,
        id: &RecordKey,
        expected: &Expected,
        now_ms: i64,
    ) -> StoreResult<CasOutcome> {
        let mut tables = self.lock();
        let fault = tables.write_fault()?;
        match tables.live(id, now_ms) {
            Some(current) if expected.is_met_by(current) => {
                faulty(fault, || tables.remove(id))?;
                Ok(CasOutcome::Applied)
            }
            current => Ok(CasOutcome::Conflict {
                current: current.cloned(),
            }),
        }
    }

    async fn list_pending(&self, query: &PendingQuery, now_ms: i64) -> StoreResult<PendingPage> {
        let tables = self.lock();
        tables.check()?;
        let start = match &query.page_token {
            None => (query.tenant.clone(), i64::MIN, String::new(), String::new()),
            Some(token) => {
                let (since, endpoint, key) =
                    decode_token(token).ok_or(StoreError::InvalidPageToken)?;
                (query.tenant.clone(), since, endpoint, key)
            }
        };
        let after_token = query.page_token.is_some();
        let mut page = PendingPage::default();
        for entry in tables.pending.range(start.clone()..) {
            let (tenant, since, endpoint, key) = entry;
            if *tenant != query.tenant || *since > now_ms {
                break;
            }
            if after_token && *entry == start {
                continue;
            }
            if page.records.len() == query.page_size {
                if let Some(last) = page.records.last() {
                    let last_since = last.pending_since_ms().unwrap_or(now_ms);
                    page.next_page_token =
                        Some(encode_token(last_since, &last.id.endpoint, &last.id.key));
                }
                break;
            }
            let id = RecordKey {
                tenant: tenant.clone(),
                endpoint: endpoint.clone(),
                key: key.clone(),
            };
            let Some(record) = tables.live(&id, now_ms) else {
                continue;
            };
            let wanted = record.needs_decision(now_ms)
                && query.endpoint.as_ref().is_none_or(|e| *e == id.endpoint)
                && query
                    .created_at_or_before_ms
                    .is_none_or(|at| record.created_at_ms <= at);
            if wanted {
                page.records.push(record.clone());
            }
        }
        Ok(page)
    }

    fn has_cluster_clock(&self) -> bool {
        self.cluster_clock.is_some()
    }

    async fn cluster_time_ms(&self) -> StoreResult<Option<i64>> {
        use crate::clock::Clock;
        Ok(self.cluster_clock.as_ref().map(Clock::now_ms))
    }

    async fn sweep_expired(&self, now_ms: i64, max_records: usize) -> StoreResult<usize> {
        self.sweep_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(max_records);
        let mut tables = self.lock();
        tables.check()?;
        let due: Vec<RecordKey> = tables
            .expiry
            .keys()
            .take_while(|(expires_at, _)| *expires_at <= now_ms)
            .take(max_records)
            .map(|(_, id)| id.clone())
            .collect();
        for id in &due {
            tables.remove(id);
        }
        Ok(due.len())
    }

    async fn close(&self) -> StoreResult<()> {
        self.lock().closed = true;
        Ok(())
    }
}
