//! Who a caller is once authenticated ([`Caller`]: a tenant, a [`Role`],
//! the endpoints it may use) and what it asks to do ([`Action`]): what
//! every way in (tokens, client certificates, protected mode) produces.

use std::sync::Arc;

use super::error::AuthError;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Runs operations: Claim, Complete, Fail, ExtendLease, Lookup.
    Service,
    /// Also decides pending records and reads the audit log: ListPending,
    /// Reconcile, ListAuditEvents.
    Reconciler,
    /// Everything.
    Admin,
}

impl Role {
    /// The role's name in the tokens file.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Service => "service",
            Role::Reconciler => "reconciler",
            Role::Admin => "admin",
        }
    }

    /// The role named `value` in a tokens or client-tenants file.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "service" => Some(Role::Service),
            "reconciler" => Some(Role::Reconciler),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// The least role that may call an RPC of this kind.
    fn allows(self, action: Action) -> bool {
        let needed = match action {
            Action::Execute => Role::Service,
            Action::Reconcile | Action::ReadAudit => Role::Reconciler,
        };
        self >= needed
    }
}

/// What an RPC does, for authorization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Claim, Complete, Fail, ExtendLease, Lookup, ClaimBatch, CompleteBatch.
    Execute,
    /// ListPending, Reconcile.
    Reconcile,
    /// ListAuditEvents.
    ReadAudit,
}

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant every key of the call belongs to.
    pub tenant: String,
    /// What the caller may do.
    pub role: Role,
    /// Endpoint prefixes the caller may touch; `None` = any endpoint.
    pub endpoint_prefixes: Option<Arc<[String]>>,
}

impl Caller {
    /// What a call authenticated by both `self` and `other` (a token and a
    /// client certificate) may do: they must name the same tenant; the call
    /// gets the lesser role and only endpoints both allow-lists allow.
    pub fn narrowed(self, other: &Caller) -> Result<Caller, AuthError> {
        if self.tenant != other.tenant {
            return Err(AuthError::TenantMismatch);
        }
        let endpoint_prefixes = match (&self.endpoint_prefixes, &other.endpoint_prefixes) {
            (None, None) => None,
            (Some(only), None) | (None, Some(only)) => Some(Arc::clone(only)),
            (Some(mine), Some(theirs)) => {
                // An endpoint matches both lists when it starts with a
                // prefix of each; of two nested prefixes, the longer one
                // says exactly that.
                let mut both: Vec<String> = Vec::new();
                for a in mine.iter() {
                    for b in theirs.iter() {
                        let longer = if a.starts_with(b.as_str()) {
                            a
                        } else if b.starts_with(a.as_str()) {
                            b
                        } else {
                            continue;
                        };
                        if !both.contains(longer) {
                            both.push(longer.clone());
                        }
                    }
                }
                Some(Arc::from(both))
            }
        };
        Ok(Caller {
            tenant: self.tenant,
            role: self.role.min(other.role),
            endpoint_prefixes,
        })
    }

    /// Checks that the caller may perform `action` on `endpoint` (empty for
    /// a listing across endpoints, which an allow-list forbids: the caller
    /// must narrow it to an allowed endpoint).
    pub fn authorize(&self, action: Action, endpoint: &str) -> Result<(), AuthError> {
        if !self.role.allows(action) {
            return Err(AuthError::RoleNotAllowed {
                role: self.role.as_str(),
            });
        }
        if let Some(prefixes) = &self.endpoint_prefixes {
            let allowed = !endpoint.is_empty()
                && prefixes
                    .iter()
                    .any(|prefix| endpoint.starts_with(prefix.as_str()));
            if !allowed {
                return Err(AuthError::EndpointNotAllowed);
            }
        }
        Ok(())
    }
}

/// The optional allow-list at the end of a tokens or client-tenants line:
/// comma-separated endpoint prefixes; `None` when the rest is empty.
pub(crate) fn parse_endpoint_prefixes(rest: &str) -> Result<Option<Arc<[String]>>, String> {
    let rest = rest.trim();
    if rest.is_empty() {
        return Ok(None);
    }
    let prefixes: Vec<String> = rest.split(',').map(str::trim).map(str::to_string).collect();
    if let Some(empty) = prefixes.iter().position(String::is_empty) {
        return Err(format!("endpoint prefix {} is empty", empty + 1));
    }
    Ok(Some(Arc::from(prefixes)))
}
