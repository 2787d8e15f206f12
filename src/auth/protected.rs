//! Protected mode: with auth off, which peers are served at all.
//!
//! With auth off, anyone who reaches the port could read, claim or release
//! any tenant's keys, so such a server answers only callers on its own
//! machine (a loopback peer address: `127.0.0.0/8`, `::1`, or `::ffff:127.x`
//! on a dual-stack socket), whatever address it listens on; this is Redis's
//! protected mode. Other peers get `PERMISSION_DENIED` (HTTP 403 on the
//! front doors, for every request of the connection) naming
//! `--allow-unauthenticated-remote`, the explicit opt-out, which is logged
//! at WARN on start. A call whose peer address is unknown is refused too.
//!
//! `PERMISSION_DENIED`, not `UNAUTHENTICATED`: no credential the caller
//! could send changes the outcome (the server has none configured), and
//! `UNAUTHENTICATED` tells clients to obtain or refresh credentials and
//! retry; the refusal is the server's policy about where the call comes
//! from, which the operator changes. Likewise 403 and not 401, which
//! would need a `WWW-Authenticate` challenge for a scheme that is not on.
//! Health checks and reflection stay open (they reveal no tenant's data,
//! and probes come from other addresses).

use std::net::IpAddr;

/// Which callers a server admits, for the start-up log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every caller must present credentials.
    Credentials,
    /// Auth off, loopback callers only (protected mode).
    LoopbackOnly,
    /// Auth off and every caller admitted (`--allow-unauthenticated-remote`).
    UnauthenticatedRemote,
}

impl Access {
    /// The name in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Credentials => "credentials",
            Access::LoopbackOnly => "loopback-only",
            Access::UnauthenticatedRemote => "unauthenticated-remote",
        }
    }
}

/// Whether `ip` is this machine's loopback, also in the IPv4-mapped form a
/// dual-stack socket reports.
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataMap;

    use std::net::SocketAddr;

    use super::*;
    use crate::auth::{ALLOW_REMOTE_FLAG, AuthError, Authenticator, DEFAULT_TENANT};

    #[test]
    fn protected_mode_admits_loopback_peers_only() {
        let peer = |address: &str| Some(address.parse::<SocketAddr>().expect("address"));
        let metadata = MetadataMap::new();
        let auth = Authenticator::disabled();
        assert_eq!(auth.access(), Access::LoopbackOnly);
        for loopback in [
            "127.0.0.1:1",
            "127.9.8.7:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            let caller = auth
                .authenticate_with(&metadata, None, peer(loopback))
                .unwrap_or_else(|e| panic!("{loopback} refused: {e}"));
            assert_eq!(caller.tenant, DEFAULT_TENANT);
        }
        for remote in [
            "10.29.0.1:1",
            "[fd00::1]:1",
            "[::ffff:10.0.0.1]:1",
            "0.0.0.0:1",
        ] {
            let err = auth
                .authenticate_with(&metadata, None, peer(remote))
                .expect_err(remote);
            assert!(
                matches!(err, AuthError::RemoteWithoutAuthentication { .. }),
                "{remote}: {err}"
            );
            assert!(err.to_string().contains(ALLOW_REMOTE_FLAG), "{err}");
        }
        assert!(
            auth.authenticate_with(&metadata, None, None).is_err(),
            "an unknown peer is not known to be local"
        );
        let open = Authenticator::disabled().allowing_unauthenticated_remote(true);
        assert_eq!(open.access(), Access::UnauthenticatedRemote);
        open.authenticate_with(&metadata, None, peer("10.29.0.1:1"))
            .expect("opted out");
    }
}
