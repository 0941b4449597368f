//! Host rules: `[METHODS ]SCHEME://HOST[:PORT]`, parsed, printed and
//! matched against a request's method, scheme, host and port.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::GrantSyntaxError;

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HttpScheme {
    /// Plain HTTP.
    Http,
    /// HTTP over TLS.
    Https,
}

impl HttpScheme {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpScheme::Http => "http",
            HttpScheme::Https => "https",
        }
    }

    /// The port a URL without one means.
    pub fn default_port(self) -> u16 {
        match self {
            HttpScheme::Http => 80,
            HttpScheme::Https => 443,
        }
    }
}

/// The host part of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this name (lowercase, no trailing dot).
    Name(String),
    /// Any name under this one (`*.example.com`: `api.example.com`,
    /// `a.b.example.com`; not `example.com` itself).
    Subdomains(String),
    /// This address, written as a literal: granting an address by its
    /// literal grants it even in a private range.
    Ip(IpAddr),
}

/// One granted host: scheme, host, port and (optionally) methods.
///
/// Written `[METHOD[,METHOD…] ]SCHEME://HOST[:PORT]`, for example
/// `https://api.github.com`, `GET,HEAD https://*.example.com`,
/// `POST http://127.0.0.1:8080`. No methods means every method.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostRule {
    /// Upper-case method names; empty means any.
    pub methods: Vec<String>,
    /// The scheme.
    pub scheme: HttpScheme,
    /// The host.
    pub host: HostPattern,
    /// The port (the scheme's default when the rule names none).
    pub port: u16,
}

impl FromStr for HostRule {
    type Err = GrantSyntaxError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| GrantSyntaxError(format!("host grant {text:?}: {why}"));
        let text_trimmed = text.trim();
        let (methods, url) = match text_trimmed.split_once(char::is_whitespace) {
            Some((methods, url)) => (methods, url.trim()),
            None => ("", text_trimmed),
        };
        let methods = methods
            .split(',')
            .filter(|m| !m.is_empty())
            .map(|m| method_name(m).map_err(|why| bad(&why)))
            .collect::<Result<Vec<_>, _>>()?;
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected [METHODS ]SCHEME://HOST[:PORT], e.g. https://api.example.com"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => HttpScheme::Http,
            "https" => HttpScheme::Https,
            other => return Err(bad(&format!("scheme {other:?} is not http or https"))),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(bad("a host grant names a scheme, host and port only (no path, query or user)"));
        }
        let (host, port) = split_host_port(rest).map_err(|why| bad(&why))?;
        let port = port.unwrap_or(scheme.default_port());
        let host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            HostPattern::Ip(IpAddr::V6(v6.parse().map_err(|_| bad(&format!("{v6:?} is not an IPv6 address")))?))
        } else if let Ok(ip) = host.parse::<Ipv4Addr>() {
            HostPattern::Ip(IpAddr::V4(ip))
        } else if let Some(parent) = host.strip_prefix("*.") {
            let parent = checked_name(parent).map_err(|why| bad(&why))?;
            // `*.0.0.1` would match `127.0.0.1`: a name's last label is
            // never all digits, an address's always is.
            if parent.rsplit('.').next().is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit())) {
                return Err(bad(&format!(
                    "a wildcard's parent must be a name, and {parent:?} ends in a number \
                     (an address is granted by writing it whole)"
                )));
            }
            HostPattern::Subdomains(parent)
        } else {
            HostPattern::Name(checked_name(host).map_err(|why| bad(&why))?)
        };
        Ok(HostRule { methods, scheme, host, port })
    }
}

/// A method name as grants keep it: letters only, upper case.
pub fn method_name(text: &str) -> Result<String, String> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphabetic()) {
        Ok(text.to_ascii_uppercase())
    } else {
        Err(format!("{text:?} is not a method name"))
    }
}

/// `host[:port]`, with `[v6]` kept bracketed.
fn split_host_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let port_of = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| format!("{p:?} is not a port"));
    if text.starts_with('[') {
        let end = text.find(']').ok_or("an IPv6 address needs its closing ]")?;
        let (host, rest) = text.split_at(end + 1);
        match rest {
            "" => Ok((host, None)),
            _ => Ok((host, Some(port_of(rest.strip_prefix(':').ok_or("expected :PORT after ]")?)?))),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => Ok((host, Some(port_of(port)?))),
            None => Ok((text, None)),
        }
    }
}

/// A host name as rules keep it: lowercase letters, digits, `-` and `.`,
/// no empty label, no trailing dot.
fn checked_name(name: &str) -> Result<String, String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if ok { Ok(name) } else { Err(format!("{name:?} is not a host name (wildcards only as a leading *.)")) }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.methods.is_empty() {
            write!(f, "{} ", self.methods.join(","))?;
        }
        write!(f, "{}://", self.scheme.as_str())?;
        match &self.host {
            HostPattern::Name(name) => write!(f, "{name}")?,
            HostPattern::Subdomains(parent) => write!(f, "*.{parent}")?,
            HostPattern::Ip(IpAddr::V4(ip)) => write!(f, "{ip}")?,
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
        }
        if self.port != self.scheme.default_port() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

crate::job::serde_as_text!(HostRule);

impl HostRule {
    /// Whether this rule lets `method` reach `scheme://host:port`. `host`
    /// is lowercase without a trailing dot (see [`normal_host`]).
    pub fn allows(&self, method: &str, scheme: HttpScheme, host: &str, port: u16) -> bool {
        let host_matches = match &self.host {
            HostPattern::Name(name) => name == host,
            // A wildcard matches names only, never an address literal.
            HostPattern::Subdomains(parent) => {
                parse_ip_host(host).is_none()
                    && host.strip_suffix(parent.as_str()).is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'))
            }
            HostPattern::Ip(ip) => parse_ip_host(host) == Some(*ip),
        };
        host_matches
            && self.scheme == scheme
            && self.port == port
            && (self.methods.is_empty() || self.methods.iter().any(|m| m == method))
    }
}

/// A host as requests are matched against rules: lowercase, no trailing
/// dot.
pub fn normal_host(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// The address a URL's host names literally (`127.0.0.1`, `[::1]`), if it
/// is one.
pub fn parse_ip_host(host: &str) -> Option<IpAddr> {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> HostRule {
        text.parse().unwrap()
    }

    #[test]
    fn rules_parse_and_print_back() {
        for text in [
            "https://api.github.com",
            "GET,HEAD https://*.example.com",
            "POST http://127.0.0.1:8080",
            "http://[::1]:9000",
            "https://example.com:8443",
        ] {
            assert_eq!(rule(text).to_string(), text);
        }
        let r = rule("get https://Example.COM./");
        assert_eq!((r.methods, r.host, r.port), (vec!["GET".to_owned()], HostPattern::Name("example.com".into()), 443));
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        for (text, says) in [
            ("api.github.com", "SCHEME://HOST"),
            ("ftp://x.com", "not http or https"),
            ("https://x.com/path", "no path"),
            ("https://user@x.com", "no path, query or user"),
            ("https://x.com:0", "not a port"),
            ("https://x.com:99999", "not a port"),
            ("https://a.*.com", "not a host name"),
            ("https://*", "not a host name"),
            ("G3T https://x.com", "not a method"),
            ("http://[::1", "closing ]"),
            ("GET http://*.0.0.1:8080", "ends in a number"),
            ("http://*.254", "ends in a number"),
            ("http://*.169.254.169.254", "ends in a number"),
        ] {
            let err = text.parse::<HostRule>().unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn rules_match_scheme_host_port_and_method() {
        let r = rule("GET https://*.example.com");
        assert!(r.allows("GET", HttpScheme::Https, "api.example.com", 443));
        assert!(r.allows("GET", HttpScheme::Https, "a.b.example.com", 443));
        assert!(!r.allows("GET", HttpScheme::Https, "example.com", 443), "the parent is not a subdomain");
        assert!(!r.allows("GET", HttpScheme::Https, "evilexample.com", 443));
        assert!(!r.allows("GET", HttpScheme::Https, "example.com.evil.net", 443));
        assert!(!r.allows("POST", HttpScheme::Https, "api.example.com", 443));
        assert!(!r.allows("GET", HttpScheme::Http, "api.example.com", 443));
        assert!(!r.allows("GET", HttpScheme::Https, "api.example.com", 8443));
        let ip = rule("http://127.0.0.1:8080");
        assert!(ip.allows("DELETE", HttpScheme::Http, "127.0.0.1", 8080));
        assert!(!ip.allows("GET", HttpScheme::Http, "localhost", 8080), "a name is not its address");
        let v6 = rule("http://[::1]:8080");
        assert!(v6.allows("GET", HttpScheme::Http, "[::1]", 8080));
    }
}
