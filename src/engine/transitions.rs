//! What every transition leaves behind: one structured event (never the
//! raw key or body) and, for audited endpoints, an audit-log entry; and
//! reading that audit log back (ListAuditEvents).

use std::time::Instant;

use super::core::{Core, key_hash};
use super::{AuditRequest, EngineError, EngineResult, PreconditionReason, validate};
use crate::audit::{AuditCursor, AuditEvent, AuditQuery};
use crate::store::Record;

/// The engine seen by the event and audit entry of every transition, and ListAuditEvents: a view of its [`Core`] for one family of
/// operations, so that each family is a type with its `impl` here while
/// [`super::Engine`] keeps the public API in one place.
pub(super) struct Trail<'a>(pub(super) &'a Core);

impl std::ops::Deref for Trail<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        self.0
    }
}

/// Default page of [`Engine::audit_events`].
const DEFAULT_AUDIT_PAGE: usize = 100;

impl Trail<'_> {
    /// Emits the structured event of one transition (or replay) and, for
    /// audited endpoints, appends it to the audit log. Never the raw key or
    /// body. An audit append that fails is logged and counted, not returned:
    /// the transition is already durable (see [`crate::audit`]).
    pub(super) async fn transition(&self, change: Transition<'_>) {
        let Transition {
            record,
            from,
            to,
            replayed,
            routine,
            started,
        } = change;
        let latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let fingerprint_prefix = hex::encode(record.fingerprint.get(..6).unwrap_or_default());
        let status = record.response.as_ref().map_or(0, |r| r.status);
        // The normal path (claimed, completed, released: two events per
        // protected request) and replays are logged at debug level: at info,
        // formatting and writing them cost more CPU than the store's writes
        // (8% of a pinned core, 60 MB of log in 8 s at 7k pairs/s). What an operator acts on (takeovers, unknown and
        // failed outcomes, Reconcile verdicts) stays at info. Metrics count
        // every transition; the audit log keeps each one for audited
        // endpoints.
        macro_rules! event {
            ($level:ident) => {
                tracing::$level!(
                    tenant = %record.id.tenant,
                    endpoint = %record.id.endpoint,
                    key_hash = %key_hash(&record.id),
                    fingerprint = %fingerprint_prefix,
                    from,
                    to,
                    replayed,
                    attempt = record.attempt,
                    status,
                    latency_us,
                    "state transition"
                )
            };
        }
        if replayed || routine {
            event!(debug);
        } else {
            event!(info);
        }
        let Some(audit) = &self.audit else {
            return;
        };
        if !self.policies.for_endpoint(&record.id.endpoint).audit {
            return;
        }
        let event = AuditEvent {
            tenant: record.id.tenant.clone(),
            endpoint: record.id.endpoint.clone(),
            key_sha256: crate::audit::key_sha256(&record.id.key),
            at_ms: self.now(),
            event_id: crate::audit::new_event_id(),
            from_state: from.to_string(),
            to_state: to.to_string(),
            replayed,
            attempt: record.attempt,
            response_status: status,
            fingerprint_prefix,
            latency_us,
        };
        if let Err(error) = audit.append(std::slice::from_ref(&event)).await {
            metrics::counter!(crate::metrics::AUDIT_WRITE_ERRORS, "backend" => audit.backend_name())
                .increment(1);
            tracing::error!(
                tenant = %event.tenant,
                endpoint = %event.endpoint,
                key_hash = %key_hash(&record.id),
                to,
                %error,
                "audit append failed; the transition itself is durable"
            );
        }
    }

    /// The work of [`super::Engine::audit_events`].
    pub(super) async fn audit_events(
        &self,
        tenant: &str,
        query: AuditRequest,
    ) -> EngineResult<(Vec<AuditEvent>, Option<String>)> {
        let Some(audit) = &self.audit else {
            return Err(EngineError::precondition(
                PreconditionReason::AuditDisabled,
                "no endpoint is audited (set `audit = true` in an endpoint policy)",
            ));
        };
        validate::tenant("tenant", tenant)?;
        let endpoint = if query.endpoint.is_empty() {
            None
        } else {
            validate::endpoint(&query.endpoint)?;
            Some(query.endpoint)
        };
        let key_sha256 = if query.key.is_empty() {
            None
        } else {
            if endpoint.is_none() {
                return Err(EngineError::invalid(
                    "endpoint",
                    "is required when key is set (a key is only unique within its endpoint)",
                ));
            }
            validate::key(&query.key)?;
            Some(crate::audit::key_sha256(&query.key))
        };
        let limit = match query.page_size {
            0 => DEFAULT_AUDIT_PAGE,
            size if size > crate::audit::MAX_PAGE => {
                return Err(EngineError::invalid(
                    "page_size",
                    format!("at most {}", crate::audit::MAX_PAGE),
                ));
            }
            size => size,
        };
        let after = if query.page_token.is_empty() {
            AuditCursor::before(query.since_ms.unwrap_or(0))
        } else {
            AuditCursor::from_token(&query.page_token).ok_or_else(|| {
                EngineError::invalid("page_token", "not a token this server issued")
            })?
        };
        let events = audit
            .list(&AuditQuery {
                tenant: tenant.to_string(),
                endpoint,
                key_sha256,
                after,
                limit,
                now_ms: self.now(),
            })
            .await?;
        let next = (events.len() == limit)
            .then(|| events.last().map(|event| event.cursor().to_token()))
            .flatten();
        Ok((events, next))
    }
}

/// What [`Engine::transition`] reports.
pub(super) struct Transition<'a> {
    /// The record after the transition (before it, for deletions).
    record: &'a Record,
    /// State before.
    from: &'a str,
    /// State (or verdict) after.
    to: &'a str,
    /// A Claim answered with the stored response.
    pub(super) replayed: bool,
    /// The normal path of a request (claimed, completed, released by its
    /// holder), logged at debug level; see [`Engine::transition`].
    pub(super) routine: bool,
    /// When the RPC entered the engine.
    started: Instant,
}

impl<'a> Transition<'a> {
    pub(super) fn new(record: &'a Record, from: &'a str, to: &'a str, started: Instant) -> Self {
        Self {
            record,
            from,
            to,
            replayed: false,
            routine: false,
            started,
        }
    }

    /// The same, on the normal path of a request.
    pub(super) fn routine(
        record: &'a Record,
        from: &'a str,
        to: &'a str,
        started: Instant,
    ) -> Self {
        Self {
            routine: true,
            ..Self::new(record, from, to, started)
        }
    }
}
