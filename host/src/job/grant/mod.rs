//! What a job may use outside its sandbox ([`Grants`]), pinned at submit
//! from its plugin's registration: today outbound HTTP ([`HttpGrant`]):
//! host rules, the private address ranges granted explicitly, and the
//! per-job limits. Pure data and matching; the sandbox enforces it
//! (`sandbox::http`).

mod address;
mod rule;

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use self::address::canonical;
pub use self::address::{AddressRange, is_private};
pub use self::rule::{HostPattern, HostRule, HttpScheme, method_name, normal_host, parse_ip_host};

/// Default most requests one job may send.
pub const DEFAULT_HTTP_REQUESTS: u32 = 1000;
/// Default largest request body, in bytes.
pub const DEFAULT_HTTP_REQUEST_BYTES: u64 = 16 << 20;
/// Default largest response body, in bytes.
pub const DEFAULT_HTTP_RESPONSE_BYTES: u64 = 64 << 20;
/// Default longest time one request may take, connect to last byte (never
/// past the job's own deadline).
pub const DEFAULT_HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a rule or a range would not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrantSyntaxError(String);

/// Per-job HTTP limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HttpLimits {
    /// Most requests one job may send; later ones are denied.
    pub requests: u32,
    /// Largest request body, in bytes.
    pub request_bytes: u64,
    /// Largest response body, in bytes.
    pub response_bytes: u64,
    /// Longest one request may take, from connecting to the last byte of
    /// the response, in milliseconds; never past the job's deadline.
    #[serde(rename = "request_timeout_ms", with = "crate::job::millis")]
    #[schema(value_type = u64, default = json!(DEFAULT_HTTP_REQUEST_TIMEOUT.as_millis() as u64))]
    pub request_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            requests: DEFAULT_HTTP_REQUESTS,
            request_bytes: DEFAULT_HTTP_REQUEST_BYTES,
            response_bytes: DEFAULT_HTTP_RESPONSE_BYTES,
            request_timeout: DEFAULT_HTTP_REQUEST_TIMEOUT,
        }
    }
}

/// Everything a job may use outside its sandbox. The default grants
/// nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Grants {
    /// Outbound HTTP.
    pub http: HttpGrant,
    /// Configuration the guest reads through `wasi:config/store`: these
    /// keys and values, and no others. Visible to the guest and kept with
    /// the job: secrets do not belong here.
    pub config: std::collections::BTreeMap<String, String>,
}

/// Longest configuration key, in bytes.
pub const MAX_CONFIG_KEY_BYTES: usize = 128;
/// Longest configuration value, in bytes.
pub const MAX_CONFIG_VALUE_BYTES: usize = 4096;

/// Most host rules, and most private ranges, one grant may hold.
pub const MAX_GRANT_RULES: usize = 256;

impl Grants {
    /// Whether this is the default: nothing granted, default limits.
    pub fn is_none(&self) -> bool {
        *self == Grants::default()
    }

    /// The rules a grant keeps beyond its syntax: at most
    /// [`MAX_GRANT_RULES`] host rules, ranges, secret rules and config
    /// keys, a request time limit of at least a millisecond, config keys
    /// of 1 to [`MAX_CONFIG_KEY_BYTES`] bytes without control characters
    /// and values of at most [`MAX_CONFIG_VALUE_BYTES`].
    pub fn check(&self) -> Result<(), String> {
        let http = &self.http;
        let secret_rules: usize = http.secrets.iter().map(|b| b.hosts.len()).sum();
        if http.hosts.len() > MAX_GRANT_RULES
            || http.private_ranges.len() > MAX_GRANT_RULES
            || secret_rules > MAX_GRANT_RULES
        {
            return Err(format!(
                "a grant holds at most {MAX_GRANT_RULES} host rules, {MAX_GRANT_RULES} ranges and \
                 {MAX_GRANT_RULES} secret rules"
            ));
        }
        if let Some(bad) = http.safe_methods.iter().find(|m| method_name(m).as_ref() != Ok(m)) {
            return Err(format!("http.safe_methods: {bad:?} is not an upper-case method name"));
        }
        if http.limits.request_timeout < Duration::from_millis(1) {
            return Err("http.limits.request_timeout_ms must be at least 1".to_owned());
        }
        if self.config.len() > MAX_GRANT_RULES {
            return Err(format!("a grant holds at most {MAX_GRANT_RULES} config keys"));
        }
        for (key, value) in &self.config {
            if key.is_empty() || key.len() > MAX_CONFIG_KEY_BYTES || key.chars().any(char::is_control) {
                return Err(format!(
                    "config key {key:?}: use 1 to {MAX_CONFIG_KEY_BYTES} bytes without control characters"
                ));
            }
            if value.len() > MAX_CONFIG_VALUE_BYTES {
                return Err(format!("config {key}: a value holds at most {MAX_CONFIG_VALUE_BYTES} bytes"));
            }
        }
        Ok(())
    }
}

/// What a plugin declares it asks for outside its sandbox (the custom
/// section `leash:requests` in its component: see
/// [`Requests::SECTION`]). A job of a registered plugin that declares it
/// gets the intersection with what the operator grants
/// ([`Grants::within`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Requests {
    /// Host rules, in the grant syntax.
    #[schema(value_type = Vec<String>)]
    pub hosts: Vec<HostRule>,
    /// Configuration keys.
    pub config: Vec<String>,
    /// Secret names.
    #[schema(value_type = Vec<String>)]
    pub secrets: Vec<SecretName>,
}

impl Requests {
    /// The custom section a component declares its requests in (JSON).
    pub const SECTION: &'static str = "leash:requests";

    /// Parse a declaration (the section's contents).
    pub fn parse(bytes: &[u8]) -> Result<Requests, String> {
        let requests: Requests = serde_json::from_slice(bytes)
            .map_err(|e| format!("the {} section is not a valid declaration: {e}", Requests::SECTION))?;
        if requests.hosts.len() > MAX_GRANT_RULES
            || requests.config.len() > MAX_GRANT_RULES
            || requests.secrets.len() > MAX_GRANT_RULES
        {
            return Err(format!(
                "the {} section declares more than {MAX_GRANT_RULES} hosts, config keys or secrets",
                Requests::SECTION
            ));
        }
        Ok(requests)
    }
}

impl HostRule {
    /// The requests both rules allow, as one rule; `None` if none.
    pub fn intersect(&self, other: &HostRule) -> Option<HostRule> {
        if self.scheme != other.scheme || self.port != other.port {
            return None;
        }
        let methods = match (self.methods.is_empty(), other.methods.is_empty()) {
            (true, _) => other.methods.clone(),
            (_, true) => self.methods.clone(),
            _ => {
                let both: Vec<String> = self.methods.iter().filter(|m| other.methods.contains(m)).cloned().collect();
                if both.is_empty() {
                    return None;
                }
                both
            }
        };
        // A name under a wildcard is the narrower of the two.
        let under =
            |name: &str, parent: &str| name.strip_suffix(parent).is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'));
        let host = match (&self.host, &other.host) {
            (a, b) if a == b => a.clone(),
            (HostPattern::Subdomains(p), HostPattern::Name(n)) | (HostPattern::Name(n), HostPattern::Subdomains(p))
                if under(n, p) =>
            {
                HostPattern::Name(n.clone())
            }
            (HostPattern::Subdomains(a), HostPattern::Subdomains(b)) if under(a, b) => {
                HostPattern::Subdomains(a.clone())
            }
            (HostPattern::Subdomains(a), HostPattern::Subdomains(b)) if under(b, a) => {
                HostPattern::Subdomains(b.clone())
            }
            _ => return None,
        };
        Some(HostRule { methods, scheme: self.scheme, host, port: self.port })
    }
}

fn intersect_rules(granted: &[HostRule], requested: &[HostRule]) -> Vec<HostRule> {
    let mut rules: Vec<HostRule> = Vec::new();
    for g in granted {
        for r in requested {
            if let Some(both) = g.intersect(r)
                && !rules.contains(&both)
            {
                rules.push(both);
            }
        }
    }
    rules
}

impl Grants {
    /// What a job of a plugin that declares `requests` gets: the granted
    /// hosts narrowed to the declared ones (rule by rule), only the
    /// declared config keys and secrets (each secret still only on the
    /// requests both allow). Private ranges, safe methods and limits are
    /// the operator's alone and stay as granted.
    pub fn within(&self, requests: &Requests) -> Grants {
        let mut http = self.http.clone();
        http.hosts = intersect_rules(&self.http.hosts, &requests.hosts);
        http.secrets = self
            .http
            .secrets
            .iter()
            .filter(|b| requests.secrets.contains(&b.name))
            .map(|b| SecretBinding { name: b.name.clone(), hosts: intersect_rules(&b.hosts, &requests.hosts) })
            .filter(|b| !b.hosts.is_empty())
            .collect();
        let config = self
            .config
            .iter()
            .filter(|(k, _)| requests.config.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Grants { http, config }
    }
}

/// Everything a job may do over HTTP. The default grants nothing: every
/// request is denied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HttpGrant {
    /// Hosts the job may reach: `[METHOD[,METHOD…] ]SCHEME://HOST[:PORT]`,
    /// e.g. `https://api.example.com`, `GET,HEAD https://*.example.com`.
    #[schema(value_type = Vec<String>)]
    pub hosts: Vec<HostRule>,
    /// Private ranges (CIDR) a granted name may resolve into (a rule that
    /// names an address literally grants that address without one).
    #[schema(value_type = Vec<String>)]
    pub private_ranges: Vec<AddressRange>,
    /// Secrets the host may put into the job's requests, each only on
    /// requests its rules match.
    pub secrets: Vec<SecretBinding>,
    /// Methods that change nothing upstream (upper case): requests with
    /// them are neither fenced by the lease nor recorded in the effect
    /// ledger. Every other method is an effect.
    pub safe_methods: Vec<String>,
    /// Limits.
    pub limits: HttpLimits,
}

/// The methods safe unless a grant says otherwise.
pub const DEFAULT_SAFE_METHODS: [&str; 2] = ["GET", "HEAD"];

impl Default for HttpGrant {
    fn default() -> Self {
        HttpGrant {
            hosts: Vec::new(),
            private_ranges: Vec::new(),
            secrets: Vec::new(),
            safe_methods: DEFAULT_SAFE_METHODS.map(str::to_owned).to_vec(),
            limits: HttpLimits::default(),
        }
    }
}

/// A secret's name: a letter or `_`, then letters, digits and `_`, at
/// most 64 bytes (`GITHUB_TOKEN`). A guest writes `{secret:NAME}` in a
/// header value; the operator sets the value on each host running jobs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretName(String);

impl SecretName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SecretName {
    type Err = GrantSyntaxError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let mut bytes = name.bytes();
        let ok = name.len() <= 64
            && bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if ok {
            Ok(SecretName(name.to_owned()))
        } else {
            Err(GrantSyntaxError(format!(
                "secret name {name:?}: use a letter or _, then letters, digits and _ (at most 64)"
            )))
        }
    }
}

/// Looked up by its text (a secret store keyed by name).
impl std::borrow::Borrow<str> for SecretName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

super::serde_as_text!(SecretName);

/// A secret and the requests it may be sent on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretBinding {
    /// The secret.
    #[schema(value_type = String)]
    pub name: SecretName,
    /// Host rules (as in `hosts`) of the requests that may carry it.
    #[schema(value_type = Vec<String>)]
    pub hosts: Vec<HostRule>,
}

impl HttpGrant {
    /// Bind `name` to one more rule (the CLI's `--secret NAME=RULE`).
    pub fn bind_secret(&mut self, name: SecretName, rule: HostRule) {
        match self.secrets.iter_mut().find(|b| b.name == name) {
            Some(binding) => binding.hosts.push(rule),
            None => self.secrets.push(SecretBinding { name, hosts: vec![rule] }),
        }
    }

    /// Whether a request with `method` is an effect (fenced and recorded).
    pub fn is_effect(&self, method: &str) -> bool {
        !self.safe_methods.iter().any(|m| m == method)
    }

    /// Whether `name` may be sent with `method` to `scheme://host:port`.
    pub fn secret_allowed(&self, name: &str, method: &str, scheme: HttpScheme, host: &str, port: u16) -> bool {
        let host = normal_host(host);
        self.secrets
            .iter()
            .filter(|b| b.name.as_str() == name)
            .any(|b| b.hosts.iter().any(|rule| rule.allows(method, scheme, &host, port)))
    }
}

impl HttpGrant {
    /// Whether some rule lets `method` reach `scheme://host:port`.
    pub fn allows(&self, method: &str, scheme: HttpScheme, host: &str, port: u16) -> bool {
        let host = normal_host(host);
        self.hosts.iter().any(|rule| rule.allows(method, scheme, &host, port))
    }

    /// Whether a connection to `addr`, reached through `host`, is allowed:
    /// any public address; a private one only when a range grants it or
    /// the host is that very address, written literally in the request and
    /// named by a rule.
    pub fn address_allowed(&self, host: &str, addr: IpAddr) -> bool {
        let named_by_a_rule =
            || self.hosts.iter().any(|r| matches!(r.host, HostPattern::Ip(ip) if canonical(ip) == canonical(addr)));
        !is_private(addr)
            || self.private_ranges.iter().any(|r| r.contains(addr))
            || (parse_ip_host(host).is_some_and(|literal| canonical(literal) == canonical(addr)) && named_by_a_rule())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> HostRule {
        text.parse().unwrap()
    }

    #[test]
    fn a_wildcard_never_matches_an_address_literal() {
        // Built by hand: such rules no longer parse.
        let numeric = HostRule {
            methods: vec![],
            scheme: HttpScheme::Http,
            host: HostPattern::Subdomains("0.0.1".into()),
            port: 80,
        };
        assert!(!numeric.allows("GET", HttpScheme::Http, "127.0.0.1", 80));
        let mut grant = HttpGrant { hosts: vec![numeric], ..HttpGrant::default() };
        assert!(!grant.allows("GET", HttpScheme::Http, "127.0.0.1", 80));
        // Even were one matched, only a rule naming the address lets a
        // literal reach a private one.
        assert!(!grant.address_allowed("127.0.0.1", "127.0.0.1".parse().unwrap()));
        grant.hosts.push(rule("http://127.0.0.1"));
        assert!(grant.address_allowed("127.0.0.1", "127.0.0.1".parse().unwrap()));
        assert!(!grant.address_allowed("169.254.169.254", "169.254.169.254".parse().unwrap()));
    }

    #[test]
    fn private_addresses_need_a_range_or_a_literal_grant() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in ["93.184.216.34", "1.1.1.1", "2606:4700::1111"] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
        let mut grant = HttpGrant::default();
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(!grant.address_allowed("upstream.test", loopback));
        assert!(!grant.address_allowed("127.0.0.1", loopback), "a literal alone grants nothing");
        grant.hosts.push("http://127.0.0.1:8080".parse().unwrap());
        assert!(grant.address_allowed("127.0.0.1", loopback), "written literally in a rule, the address is explicit");
        assert!(!grant.address_allowed("127.0.0.2", loopback));
        grant.private_ranges.push("127.0.0.0/8".parse().unwrap());
        assert!(grant.address_allowed("upstream.test", loopback));
        assert!(grant.address_allowed("x", "::ffff:127.0.0.9".parse().unwrap()), "mapped addresses count as IPv4");
        assert!(!grant.address_allowed("x", "10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn secrets_are_allowed_only_where_bound() {
        let mut grant = HttpGrant::default();
        grant.bind_secret("TOKEN".parse().unwrap(), rule("POST https://api.example.com"));
        grant.bind_secret("TOKEN".parse().unwrap(), rule("https://*.uploads.example.com"));
        assert_eq!(grant.secrets.len(), 1, "one binding per name");
        assert!(grant.secret_allowed("TOKEN", "POST", HttpScheme::Https, "api.example.com", 443));
        assert!(grant.secret_allowed("TOKEN", "PUT", HttpScheme::Https, "a.uploads.example.com", 443));
        assert!(!grant.secret_allowed("TOKEN", "GET", HttpScheme::Https, "api.example.com", 443));
        assert!(!grant.secret_allowed("TOKEN", "POST", HttpScheme::Http, "api.example.com", 443));
        assert!(!grant.secret_allowed("OTHER", "POST", HttpScheme::Https, "api.example.com", 443));
        for bad in ["", "1ABC", "A-B", "A B", &"A".repeat(65)] {
            assert!(bad.parse::<SecretName>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_grant_reads_back_from_json() {
        let mut grant = HttpGrant {
            hosts: vec![rule("GET https://api.example.com"), rule("http://127.0.0.1:8080")],
            private_ranges: vec!["10.0.0.0/8".parse().unwrap()],
            limits: HttpLimits { requests: 5, ..HttpLimits::default() },
            ..HttpGrant::default()
        };
        grant.bind_secret("GITHUB_TOKEN".parse().unwrap(), rule("https://api.github.com"));
        let json = serde_json::to_string(&grant).unwrap();
        assert!(json.contains("\"GET https://api.example.com\""), "{json}");
        assert_eq!(serde_json::from_str::<HttpGrant>(&json).unwrap(), grant);
    }

    #[test]
    fn two_rules_intersect_to_the_requests_both_allow() {
        let both = |a: &str, b: &str| rule(a).intersect(&rule(b)).map(|r| r.to_string());
        assert_eq!(
            both("https://*.example.com", "POST https://api.example.com").as_deref(),
            Some("POST https://api.example.com")
        );
        assert_eq!(
            both("GET,POST https://api.example.com", "POST,PUT https://api.example.com").as_deref(),
            Some("POST https://api.example.com")
        );
        assert_eq!(
            both("https://*.example.com", "https://*.eu.example.com").as_deref(),
            Some("https://*.eu.example.com")
        );
        assert_eq!(both("GET https://api.example.com", "POST https://api.example.com"), None, "no method in common");
        assert_eq!(both("https://api.example.com", "http://api.example.com"), None, "another scheme");
        assert_eq!(both("https://api.example.com", "https://api.example.com:8443"), None, "another port");
        assert_eq!(both("https://*.example.com", "https://example.com"), None, "a wildcard is not its parent");
        assert_eq!(both("https://api.example.com", "https://api.example.org"), None);
    }

    #[test]
    fn a_job_gets_what_is_both_declared_and_granted() {
        let mut granted = Grants::default();
        granted.http.hosts = vec![rule("https://*.example.com"), rule("https://other.org")];
        granted.http.private_ranges = vec!["10.0.0.0/8".parse().unwrap()];
        granted.http.bind_secret("HOOK_TOKEN".parse().unwrap(), rule("https://*.example.com"));
        granted.http.bind_secret("OTHER".parse().unwrap(), rule("https://hooks.example.com"));
        granted.config = [("greeting", "hi"), ("password", "x")].map(|(k, v)| (k.to_owned(), v.to_owned())).into();
        let requests = Requests::parse(
            br#"{"hosts": ["POST https://hooks.example.com", "https://nowhere.net"], "config": ["greeting", "region"], "secrets": ["HOOK_TOKEN"]}"#,
        )
        .unwrap();
        let job = granted.within(&requests);
        assert_eq!(job.http.hosts, vec![rule("POST https://hooks.example.com")]);
        assert_eq!(job.http.private_ranges, granted.http.private_ranges, "ranges are the operator's");
        let secrets: Vec<(String, Vec<String>)> = job
            .http
            .secrets
            .iter()
            .map(|b| (b.name.to_string(), b.hosts.iter().map(|h| h.to_string()).collect()))
            .collect();
        assert_eq!(secrets, vec![("HOOK_TOKEN".to_owned(), vec!["POST https://hooks.example.com".to_owned()])]);
        assert_eq!(job.config.keys().collect::<Vec<_>>(), vec!["greeting"], "granted and declared");
        assert!(Grants::default().within(&requests).is_none(), "granting nothing still grants nothing");

        for bad in [&br#"{"hosts": ["ftp://x"]}"#[..], br#"{"files": []}"#, b"not json"] {
            assert!(Requests::parse(bad).unwrap_err().contains("leash:requests"), "{bad:?}");
        }
    }
}
