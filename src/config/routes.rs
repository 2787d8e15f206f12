//! `idemd proxy`'s routes file (`--routes`): which requests need an
//! `Idempotency-Key`, what endpoint they count as, and how the upstream's
//! answers are kept. Without a file every path gets [`RouteSettings`]'s
//! defaults.
//!
//! ```toml
//! [defaults]                      # every route inherits these
//! methods = ["POST", "PATCH"]     # methods that are made idempotent
//! key = "require"                 # or "optional": no key = passed through
//! max_request_bytes = 1048576     # larger bodies: 413 before any claim
//! max_response_bytes = 262144     # larger answers are returned, key UNKNOWN
//! max_wait = "0s"                 # wait for an in-flight duplicate (else 409)
//! upstream_timeout = "30s"        # then 504 and the key UNKNOWN
//! on_5xx = "release"              # or "store": replay the 5xx too
//! ignore_fields = []              # JSON Pointers left out of the fingerprint
//! store_headers = ["content-type", "location", "etag"] # replayed headers
//! expose_failure_reason = false   # development only: 409s name the reason
//!
//! [[routes]]
//! path = "/v1/payments/{id}"      # {name} is one segment; a final /* any rest
//! on_5xx = "store"
//! ```
//!
//! The first route (in file order) whose `path` matches wins; a request no
//! route matches gets the defaults. The endpoint of a request (the scope of
//! its key, the name policies and metrics know it by) is the method and
//! the matched route's `path` (`POST /v1/payments/{id}`), so every payment
//! shares one endpoint; for a path ending in `/*`, and without any route,
//! it is the method and the request's own path.
//!
//! `set-cookie` is never stored unless `store_headers` names it: a replay
//! would hand one client's session to another caller with the same key.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use serde::Deserialize;

use super::defaults::{MAX_RESPONSE_BYTES_LIMIT, MAX_WAIT_LIMIT};
use super::error::ConfigError;

/// What to do when the upstream answers 5xx.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum On5xx {
    /// Release the key: the retry runs again. Right when the upstream
    /// answers 5xx only for work that did not commit (the article's "500
    /// with no committed side effect").
    Release,
    /// Store the 5xx like any answer: retries replay it.
    Store,
}

/// Whether a request must carry a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRule {
    /// No key: 400.
    Require,
    /// No key: forwarded without idempotency.
    Optional,
}

/// The settings of one route.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Methods made idempotent; others pass through.
    pub methods: Vec<Method>,
    /// Whether the key is required.
    pub key: KeyRule,
    /// Largest request body; larger is 413 before any claim.
    pub max_request_bytes: usize,
    /// Largest answer stored; larger ones are returned and the key is
    /// failed as UNKNOWN.
    pub max_response_bytes: usize,
    /// How long a duplicate waits for the first request to finish.
    pub max_wait: Duration,
    /// Longest wait for the upstream's answer (head and body).
    pub upstream_timeout: Duration,
    /// What a 5xx answer does to the key.
    pub on_5xx: On5xx,
    /// JSON Pointers left out of the fingerprint.
    pub ignore_fields: Vec<String>,
    /// Response headers stored for replays (lower case).
    pub store_headers: Vec<HeaderName>,
    /// Whether a 409 `outcome_pending` carries the key's stored reason.
    /// Off by default: the reason is written for operators (an upstream's
    /// or a handler's error text), not for whoever retries the request
    /// (clients/conformance/http-scenarios.md, "What an HTTP caller learns
    /// about a failed handler"). For development only.
    pub expose_failure_reason: bool,
}

/// Default of `max_request_bytes`: the fingerprint's own body limit.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// Default of `max_response_bytes`: the policies' default.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 256 * 1024;
/// Default of `upstream_timeout`.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `store_headers`: what describes a response's body and the
/// resource it created, never credentials or cookies.
pub const DEFAULT_STORE_HEADERS: [&str; 8] = [
    "content-type",
    "content-encoding",
    "content-language",
    "content-location",
    "location",
    "etag",
    "last-modified",
    "link",
];

impl Default for RouteSettings {
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            key: KeyRule::Require,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_wait: Duration::ZERO,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            on_5xx: On5xx::Release,
            expose_failure_reason: false,
            ignore_fields: Vec::new(),
            store_headers: DEFAULT_STORE_HEADERS
                .iter()
                .map(|name| HeaderName::from_static(name))
                .collect(),
        }
    }
}

/// One segment of a route path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `{name}`: any one segment.
    Any,
}

/// A route: a path pattern and its settings.
#[derive(Debug, Clone)]
pub struct Route {
    /// The pattern as written (the endpoint's path part).
    pub path: String,
    segments: Vec<Segment>,
    /// A final `/*`: any further segments.
    rest: bool,
    /// Its settings (shared: each request holds them while it runs).
    pub settings: Arc<RouteSettings>,
}

impl Route {
    fn matches(&self, path: &str) -> bool {
        let mut parts = path.trim_start_matches('/').split('/');
        for segment in &self.segments {
            match (segment, parts.next()) {
                (_, None) => return false,
                (Segment::Literal(literal), Some(part)) if literal != part => return false,
                _ => {}
            }
        }
        self.rest || parts.next().is_none()
    }
}

/// `idemd proxy`'s settings beyond the server's.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// The proxy's listen address.
    pub listen: std::net::SocketAddr,
    /// The upstream's base URL (`http://host:port`).
    pub upstream: String,
    /// Routes (the defaults when no file is given).
    pub routes: Routes,
    /// The header whose bearer token names the tenant.
    pub token_header: HeaderName,
}

/// The `host:port` of an upstream URL, which must be `http://host:port`:
/// the proxy runs beside its upstream and talks to it over loopback, so
/// TLS to the upstream is not supported, and paths are forwarded as they
/// come, so the URL has none.
pub fn upstream_authority(url: &str) -> Result<http::uri::Authority, ConfigError> {
    let error = |description: &str| ConfigError::new("upstream", format!("{url:?}: {description}"));
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| error(&e.to_string()))?;
    if uri.scheme() != Some(&http::uri::Scheme::HTTP) {
        return Err(error(
            "must be http://host:port (TLS to the upstream is not supported)",
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(error(
            "give only http://host:port; request paths are forwarded as they come",
        ));
    }
    uri.authority().cloned().ok_or_else(|| error("no host"))
}

/// The routes of the proxy.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    routes: Vec<Route>,
    defaults: Arc<RouteSettings>,
}

/// A request's route: its settings and its endpoint.
#[derive(Debug, Clone)]
pub struct Matched<'a> {
    /// The settings that apply.
    pub settings: &'a Arc<RouteSettings>,
    /// `METHOD path`, the endpoint the key belongs to.
    pub endpoint: String,
}

impl Routes {
    /// The route of `method` on `path`.
    pub fn find(&self, method: &Method, path: &str) -> Matched<'_> {
        match self.routes.iter().find(|route| route.matches(path)) {
            Some(route) if !route.rest => Matched {
                settings: &route.settings,
                endpoint: format!("{method} {}", route.path),
            },
            Some(route) => Matched {
                settings: &route.settings,
                endpoint: format!("{method} {path}"),
            },
            None => Matched {
                settings: &self.defaults,
                endpoint: format!("{method} {path}"),
            },
        }
    }

    /// The routes (`"defaults"` for the defaults) whose 409s carry the
    /// stored reason: the proxy names them in a warning at start-up.
    pub fn exposing_failure_reasons(&self) -> Vec<&str> {
        let defaults = self.defaults.expose_failure_reason.then_some("defaults");
        let routes = self
            .routes
            .iter()
            .filter(|route| route.settings.expose_failure_reason)
            .map(|route| route.path.as_str());
        defaults.into_iter().chain(routes).collect()
    }

    /// Reads and checks a routes file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("routes", format!("cannot read {}: {e}", path.display()))
        })?;
        Self::parse(&text)
    }

    /// Parses routes TOML.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: RoutesFile = toml::from_str(text)
            .map_err(|e| ConfigError::new("routes", e.to_string().trim_end().replace('\n', " ")))?;
        let defaults = file.defaults.over(&RouteSettings::default(), "defaults")?;
        let mut routes = Vec::new();
        for (index, route) in file.routes.iter().enumerate() {
            let field = format!("routes[{index}]");
            let path = route
                .path
                .clone()
                .ok_or_else(|| ConfigError::new(format!("{field}.path"), "is required"))?;
            let (segments, rest) =
                parse_pattern(&path).map_err(|e| ConfigError::new(format!("{field}.path"), e))?;
            routes.push(Route {
                path,
                segments,
                rest,
                settings: Arc::new(route.over(&defaults, &field)?),
            });
        }
        Ok(Self {
            routes,
            defaults: Arc::new(defaults),
        })
    }
}

fn parse_pattern(path: &str) -> Result<(Vec<Segment>, bool), String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} must start with /"));
    }
    let mut segments = Vec::new();
    let mut rest = false;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for (index, part) in parts.iter().enumerate() {
        if *part == "*" {
            if index + 1 != parts.len() {
                return Err(format!("{path:?}: * may only be the last segment"));
            }
            rest = true;
        } else if part.starts_with('{') && part.ends_with('}') && part.len() > 2 {
            segments.push(Segment::Any);
        } else if part.contains(['{', '}', '*']) {
            return Err(format!(
                "{path:?}: segment {part:?} is neither literal, {{name}} nor a final *"
            ));
        } else {
            segments.push(Segment::Literal((*part).to_string()));
        }
    }
    if path.chars().any(char::is_control) {
        return Err(format!("{path:?} contains a control character"));
    }
    Ok((segments, rest))
}

/// One table of the file; absent fields inherit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    path: Option<String>,
    methods: Option<Vec<String>>,
    key: Option<KeyRule>,
    max_request_bytes: Option<usize>,
    max_response_bytes: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    max_wait: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    upstream_timeout: Option<Duration>,
    on_5xx: Option<On5xx>,
    ignore_fields: Option<Vec<String>>,
    store_headers: Option<Vec<String>>,
    expose_failure_reason: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutesFile {
    #[serde(default)]
    defaults: RouteFile,
    #[serde(default)]
    routes: Vec<RouteFile>,
}

impl RouteFile {
    fn over(&self, base: &RouteSettings, field: &str) -> Result<RouteSettings, ConfigError> {
        let error = |name: &str, description: String| {
            ConfigError::new(format!("{field}.{name}"), description)
        };
        let methods = match &self.methods {
            None => base.methods.clone(),
            Some(methods) => methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| error("methods", format!("{m:?} is not an HTTP method")))
                })
                .collect::<Result<_, _>>()?,
        };
        let store_headers = match &self.store_headers {
            None => base.store_headers.clone(),
            Some(names) => names
                .iter()
                .map(|n| {
                    HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes())
                        .map_err(|_| error("store_headers", format!("{n:?} is not a header name")))
                })
                .collect::<Result<_, _>>()?,
        };
        let settings = RouteSettings {
            methods,
            key: self.key.unwrap_or(base.key),
            max_request_bytes: self.max_request_bytes.unwrap_or(base.max_request_bytes),
            max_response_bytes: self.max_response_bytes.unwrap_or(base.max_response_bytes),
            max_wait: self.max_wait.unwrap_or(base.max_wait),
            upstream_timeout: self.upstream_timeout.unwrap_or(base.upstream_timeout),
            on_5xx: self.on_5xx.unwrap_or(base.on_5xx),
            expose_failure_reason: self
                .expose_failure_reason
                .unwrap_or(base.expose_failure_reason),
            ignore_fields: self
                .ignore_fields
                .clone()
                .unwrap_or_else(|| base.ignore_fields.clone()),
            store_headers,
        };
        if settings.max_request_bytes == 0 {
            return Err(error("max_request_bytes", "must be at least 1".into()));
        }
        if settings.max_response_bytes == 0
            || settings.max_response_bytes > MAX_RESPONSE_BYTES_LIMIT
        {
            return Err(error(
                "max_response_bytes",
                format!("must be between 1 and {}", MAX_RESPONSE_BYTES_LIMIT),
            ));
        }
        if settings.upstream_timeout.is_zero() {
            return Err(error(
                "upstream_timeout",
                "must be greater than zero".into(),
            ));
        }
        if settings.max_wait > MAX_WAIT_LIMIT {
            return Err(error(
                "max_wait",
                format!("at most {}", humantime::format_duration(MAX_WAIT_LIMIT)),
            ));
        }
        let pointers: Vec<&str> = settings.ignore_fields.iter().map(String::as_str).collect();
        crate::fingerprint::parse_ignore_fields(&pointers)
            .map_err(|e| error("ignore_fields", e.to_string()))?;
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_the_endpoint_and_rest_routes_keep_the_path() {
        let routes = Routes::parse(
            r#"
            [[routes]]
            path = "/v1/payments/{id}"
            on_5xx = "store"
            [[routes]]
            path = "/v1/*"
            "#,
        )
        .expect("parse");
        let payment = routes.find(&Method::POST, "/v1/payments/123");
        assert_eq!(payment.endpoint, "POST /v1/payments/{id}");
        assert_eq!(payment.settings.on_5xx, On5xx::Store);
        let nested = routes.find(&Method::POST, "/v1/payments/123/refunds");
        assert_eq!(nested.endpoint, "POST /v1/payments/123/refunds");
        assert_eq!(nested.settings.on_5xx, On5xx::Release);
        let other = routes.find(&Method::PATCH, "/health");
        assert_eq!(other.endpoint, "PATCH /health");
    }

    #[test]
    fn failure_reasons_stay_private_unless_a_route_exposes_them() {
        let routes = Routes::parse(
            r#"
            [[routes]]
            path = "/debug/*"
            expose_failure_reason = true
            [[routes]]
            path = "/v1/*"
            "#,
        )
        .expect("parse");
        assert!(!RouteSettings::default().expose_failure_reason);
        assert!(
            routes
                .find(&Method::POST, "/debug/x")
                .settings
                .expose_failure_reason
        );
        assert!(
            !routes
                .find(&Method::POST, "/v1/x")
                .settings
                .expose_failure_reason
        );
        assert!(
            !routes
                .find(&Method::POST, "/other")
                .settings
                .expose_failure_reason
        );
        assert_eq!(routes.exposing_failure_reasons(), vec!["/debug/*"]);
        let all = Routes::parse("[defaults]\nexpose_failure_reason = true\n").expect("parse");
        assert_eq!(all.exposing_failure_reasons(), vec!["defaults"]);
    }

    #[test]
    fn bad_settings_name_their_field() {
        let err = Routes::parse("[[routes]]\npath = \"v1\"\n").expect_err("relative path");
        assert_eq!(err.field, "routes[0].path");
        let err = Routes::parse("[defaults]\nmax_response_bytes = 0\n").expect_err("zero");
        assert_eq!(err.field, "defaults.max_response_bytes");
        let err = Routes::parse("[[routes]]\npath = \"/a\"\nmethods = [\"P OST\"]\n")
            .expect_err("method");
        assert_eq!(err.field, "routes[0].methods");
        let err = Routes::parse("[defaults]\nttl = \"1h\"\n").expect_err("unknown field");
        assert_eq!(err.field, "routes");
    }

    #[test]
    fn only_plain_http_upstreams_without_a_path_are_accepted() {
        assert!(upstream_authority("http://127.0.0.1:8080").is_ok());
        assert_eq!(
            upstream_authority("https://127.0.0.1:8443")
                .expect_err("tls")
                .field,
            "upstream"
        );
        assert!(upstream_authority("http://127.0.0.1:8080/api").is_err());
        assert!(upstream_authority("127.0.0.1:8080").is_err());
    }

    #[test]
    fn set_cookie_is_not_stored_by_default() {
        let defaults = RouteSettings::default();
        assert!(
            !defaults
                .store_headers
                .contains(&HeaderName::from_static("set-cookie"))
        );
    }
}
