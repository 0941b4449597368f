//! The plan fence: what a run may do with effects, by the phase it runs.
//! A plan's execute phase sends none and proposes them instead (each
//! checked against the grant as if it were sent); its apply phase may
//! send only its approved proposals, each exactly as proposed and once.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::secrets::{self, SecretStore};
use crate::job::grant::{HttpGrant, HttpScheme, parse_ip_host};
use crate::job::proposal::{
    MAX_PROPOSAL_BODY_BYTES, MAX_PROPOSAL_HEADERS, MAX_PROPOSAL_URL_BYTES, MAX_PROPOSALS, MAX_PROPOSED_BYTES,
    same_headers,
};
use crate::job::{Digest, Proposal};

/// Headers the host sets on every request itself: neither proposed nor
/// compared.
pub(crate) const HOST_SET_HEADERS: &[&str] =
    &["host", "content-length", "transfer-encoding", "connection", "idempotency-key"];

/// How long a proposal's host name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a run may do with effects.
#[derive(Debug, Clone, Default)]
pub enum EffectFence {
    /// A plain job or a named action: every granted request may be sent.
    #[default]
    Open,
    /// A plan's execute phase: no effect is sent; effects are proposed.
    Propose,
    /// A plan's apply phase: only these approved proposals may be sent.
    Approved(Arc<ApprovedEffects>),
}

/// Where one approved proposal stands in this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// May be sent.
    Pending,
    /// A request sending it is on its way.
    Claimed,
    /// Sent and answered (in this run or an earlier one).
    Sent,
}

/// An apply phase's approved proposals and which of them are sent.
#[derive(Debug)]
pub struct ApprovedEffects {
    proposals: Vec<Proposal>,
    /// Each proposal's body digest, by place.
    digests: Vec<Digest>,
    slots: Mutex<Vec<Slot>>,
    /// Effectful requests refused because no unused proposal matched.
    refused: AtomicU32,
}

impl ApprovedEffects {
    /// `proposals`, of which those numbered in `sent` were sent and
    /// answered by an earlier attempt.
    pub fn new(proposals: Vec<Proposal>, sent: &BTreeSet<u32>) -> Self {
        let slots = proposals.iter().map(|p| if sent.contains(&p.n) { Slot::Sent } else { Slot::Pending }).collect();
        let digests = proposals.iter().map(Proposal::body_digest).collect();
        ApprovedEffects { proposals, digests, slots: Mutex::new(slots), refused: AtomicU32::new(0) }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first unused proposal a request sends exactly, now claimed by
    /// it; `None` (counted as refused) if there is none.
    pub(crate) fn claim(&self, method: &str, url: &str, headers: &[(String, String)], body: &Digest) -> Option<u32> {
        let headers = compared(headers);
        let mut slots = self.slots();
        let found = (0..self.proposals.len()).position(|i| {
            let p = &self.proposals[i];
            slots[i] == Slot::Pending
                && p.method == method
                && p.url == url
                && self.digests[i] == *body
                && same_headers(&p.headers, &headers)
        });
        match found {
            Some(i) => {
                slots[i] = Slot::Claimed;
                Some(self.proposals[i].n)
            }
            None => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Proposal `n`'s request ended: answered (`sent`), or not, when it
    /// may be sent again.
    pub(crate) fn settle(&self, n: u32, sent: bool) {
        let mut slots = self.slots();
        if let Some(i) = self.proposals.iter().position(|p| p.n == n) {
            slots[i] = if sent { Slot::Sent } else { Slot::Pending };
        }
    }

    /// The proposals not sent yet, in order.
    pub(crate) fn pending(&self) -> Vec<Proposal> {
        let slots = self.slots();
        self.proposals.iter().zip(slots.iter()).filter(|(_, s)| **s != Slot::Sent).map(|(p, _)| p.clone()).collect()
    }

    /// What the run did: (proposals, sent, refused requests).
    pub fn report(&self) -> ApplyReport {
        let slots = self.slots();
        let unsent = self.proposals.iter().zip(slots.iter()).filter(|(_, s)| **s != Slot::Sent);
        ApplyReport {
            proposals: self.proposals.len(),
            not_sent: unsent.map(|(p, _)| p.shown()).collect(),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// How an apply phase's run dealt with its approved proposals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    /// Approved proposals.
    pub proposals: usize,
    /// Those not sent (`#n METHOD url`).
    pub not_sent: Vec<String>,
    /// Effectful requests refused as not proposed.
    pub refused: u32,
}

impl ApplyReport {
    /// One line for the job's log.
    pub fn line(&self) -> String {
        let sent = self.proposals - self.not_sent.len();
        let mut line = format!("apply sent {sent} of {} approved proposals", self.proposals);
        if !self.not_sent.is_empty() {
            line.push_str(&format!("; not sent: {}", self.not_sent.join(", ")));
        }
        if self.refused > 0 {
            line.push_str(&format!("; {} request(s) refused as not proposed", self.refused));
        }
        line
    }
}

/// Headers as compared with a proposal's: those the host sets left out.
pub(crate) fn compared(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers.iter().filter(|(k, _)| !HOST_SET_HEADERS.contains(&k.to_ascii_lowercase().as_str())).cloned().collect()
}

/// A proposal's URL as compared: `scheme://host[:port]/path?query`, the
/// same text the apply phase's request yields. Credentials are refused.
pub(crate) fn canonical_url(uri: &http::Uri) -> Result<String, String> {
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s,
        Some(other) => return Err(format!("scheme {other:?} is not http or https")),
        None => return Err("the URL names no scheme (http:// or https://)".into()),
    };
    let authority = uri.authority().ok_or("the URL names no host")?;
    if authority.as_str().contains('@') {
        return Err("the URL carries credentials: name a secret in a header instead".into());
    }
    let host = uri.host().filter(|h| !h.is_empty()).ok_or("the URL names no host")?;
    let port = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    let path = uri.path_and_query().map_or("", |p| p.as_str());
    let slash = if path.starts_with('/') { "" } else { "/" };
    Ok(format!("{scheme}://{host}{port}{slash}{path}"))
}

/// The proposals of one execute phase, as they are made.
#[derive(Debug, Default)]
pub(crate) struct ProposalBook {
    pub(crate) proposals: Vec<Proposal>,
    bytes: usize,
    /// The first proposal refused: it fails the phase.
    pub(crate) refused: Option<String>,
    addresses: AddressVerdicts,
}

impl ProposalBook {
    /// Check `proposal` against `grant` as if it were being sent, and
    /// record it; its number, or why it is refused.
    pub(crate) async fn propose(
        &mut self,
        grant: &HttpGrant,
        secrets: &SecretStore,
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<u32, String> {
        if self.proposals.len() >= MAX_PROPOSALS {
            return Err(format!("an execute phase may propose at most {MAX_PROPOSALS} effects"));
        }
        let mut proposal = Proposal { n: self.proposals.len() as u32 + 1, method, url, headers, body };
        let size = proposal.size();
        if self.bytes + size > MAX_PROPOSED_BYTES {
            return Err(format!("an execute phase may propose at most {MAX_PROPOSED_BYTES} bytes"));
        }
        let (host, port) = checked(grant, secrets, &mut proposal)?;
        self.addresses.check(grant, &host, port).await?;
        self.bytes += size;
        let n = proposal.n;
        self.proposals.push(proposal);
        Ok(n)
    }
}

/// Check a proposal against `grant` as the host checks a request before
/// sending it (all but the address its host resolves to), putting its URL
/// in canonical form; the host and port it goes to.
pub(crate) fn checked(
    grant: &HttpGrant,
    secrets: &SecretStore,
    proposal: &mut Proposal,
) -> Result<(String, u16), String> {
    proposal.method.make_ascii_uppercase();
    let method = http::Method::from_bytes(proposal.method.as_bytes())
        .map_err(|_| format!("{:?} is not an HTTP method", proposal.method))?;
    if !grant.is_effect(method.as_str()) {
        return Err(format!("{method} is a safe method here: send it in the execute phase, do not propose it"));
    }
    if proposal.url.len() > MAX_PROPOSAL_URL_BYTES {
        return Err(format!("the URL is over {MAX_PROPOSAL_URL_BYTES} bytes"));
    }
    let uri: http::Uri = proposal.url.parse().map_err(|e| format!("{:?} is not a URL: {e}", proposal.url))?;
    proposal.url = canonical_url(&uri)?;
    let shown = format!("{method} {}", proposal.url);
    let limit = MAX_PROPOSAL_BODY_BYTES.min(usize::try_from(grant.limits.request_bytes).unwrap_or(usize::MAX));
    if proposal.body.len() > limit {
        return Err(format!(
            "{shown}: the body is {} bytes, over the {limit} a proposal may carry",
            proposal.body.len()
        ));
    }
    if proposal.headers.len() > MAX_PROPOSAL_HEADERS {
        return Err(format!("{shown}: more than {MAX_PROPOSAL_HEADERS} headers"));
    }
    let mut map = http::HeaderMap::new();
    for (name, value) in &proposal.headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{shown}: {name:?} is not a header name"))?;
        if HOST_SET_HEADERS.contains(&name.as_str()) {
            return Err(format!("{shown}: the host sets the {name} header itself: leave it out"));
        }
        let value = http::HeaderValue::from_str(value)
            .map_err(|_| format!("{shown}: the value of {name} is not a valid header value"))?;
        map.append(name, value);
    }
    let scheme = if uri.scheme_str() == Some("http") { HttpScheme::Http } else { HttpScheme::Https };
    let host = uri.host().unwrap_or_default().to_owned();
    let port = uri.port_u16().unwrap_or(scheme.default_port());
    if !grant.allows(method.as_str(), scheme, &host, port) {
        let rule = format!("{method} {}://{host}{}", uri.scheme_str().unwrap_or("https"), port_text(&uri));
        return Err(format!("{shown}: not granted; grant it with --allow-host '{rule}'"));
    }
    // Checked on a copy: the proposal keeps the secret's name, never its value.
    secrets::substitute(&mut map, secrets, grant, (method.as_str(), scheme, &host, port))
        .map_err(|why| format!("{shown}: {why}"))?;
    Ok((host, port))
}

fn port_text(uri: &http::Uri) -> String {
    uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default()
}

/// Hosts already looked up, with the verdict on their addresses: each
/// host of a set of proposals is resolved once.
#[derive(Debug, Default)]
pub(crate) struct AddressVerdicts(HashMap<(String, u16), Result<(), String>>);

impl AddressVerdicts {
    /// Whether `host` is an address, or resolves to at least one, that
    /// `grant` lets a request reach.
    pub(crate) async fn check(&mut self, grant: &HttpGrant, host: &str, port: u16) -> Result<(), String> {
        let key = (host.to_owned(), port);
        if let Some(verdict) = self.0.get(&key) {
            return verdict.clone();
        }
        let verdict = address_allowed(grant, host, port).await;
        self.0.insert(key, verdict.clone());
        verdict
    }
}

/// Whether `host` is an address, or resolves to one, the grant lets a
/// request reach.
async fn address_allowed(grant: &HttpGrant, host: &str, port: u16) -> Result<(), String> {
    let addresses: Vec<IpAddr> = match parse_ip_host(host) {
        Some(ip) => vec![ip],
        None => match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await {
            Err(_) => return Err(format!("{host} did not resolve in time")),
            Ok(Err(e)) => return Err(format!("{host} does not resolve: {e}")),
            Ok(Ok(found)) => found.map(|a| a.ip()).collect(),
        },
    };
    if addresses.iter().any(|ip| grant.address_allowed(host, *ip)) {
        return Ok(());
    }
    let listed = addresses.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(", ");
    Err(format!(
        "{host} resolves to {listed}, a private address no range is granted for; grant it with --allow-private {}",
        addresses.first().map(IpAddr::to_string).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(rules: &[&str]) -> HttpGrant {
        let mut grant = HttpGrant { hosts: rules.iter().map(|r| r.parse().unwrap()).collect(), ..HttpGrant::default() };
        grant.bind_secret("TOKEN".parse().unwrap(), "PUT https://api.example.com".parse().unwrap());
        grant
    }

    fn secrets() -> SecretStore {
        SecretStore::from_pairs([("TOKEN".into(), "t0ken".into())]).unwrap()
    }

    fn proposal(method: &str, url: &str, headers: &[(&str, &str)]) -> Proposal {
        Proposal {
            n: 1,
            method: method.into(),
            url: url.into(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: b"{}".to_vec(),
        }
    }

    fn check(grant: &HttpGrant, mut p: Proposal) -> Result<Proposal, String> {
        checked(grant, &secrets(), &mut p).map(|_| p)
    }

    #[test]
    fn a_proposal_is_checked_as_its_request_would_be() {
        let g = grant(&["PUT https://api.example.com"]);
        let ok = check(&g, proposal("put", "https://api.example.com/a?b=1", &[("authorization", "{secret:TOKEN}")]))
            .unwrap();
        assert_eq!((ok.method.as_str(), ok.url.as_str()), ("PUT", "https://api.example.com/a?b=1"));
        assert_eq!(ok.headers[0].1, "{secret:TOKEN}", "the secret's name is kept, never its value");
        let err = check(&g, proposal("POST", "https://api.example.com/a", &[])).unwrap_err();
        assert!(err.contains("not granted; grant it with --allow-host 'POST https://api.example.com'"), "{err}");
        let err = check(&g, proposal("GET", "https://api.example.com/a", &[])).unwrap_err();
        assert!(err.contains("safe method"), "{err}");
        let err = check(&g, proposal("PUT", "https://api.example.com/a", &[("x", "{secret:OTHER}")])).unwrap_err();
        assert!(err.contains("secret OTHER"), "{err}");
        let err = check(&g, proposal("PUT", "https://user:pw@api.example.com/a", &[])).unwrap_err();
        assert!(err.contains("credentials"), "{err}");
        let err = check(&g, proposal("PUT", "https://api.example.com/a", &[("Host", "evil")])).unwrap_err();
        assert!(err.contains("sets the host header itself"), "{err}");
        let err = check(&g, proposal("PUT", "ftp://api.example.com/a", &[])).unwrap_err();
        assert!(err.contains("not http or https"), "{err}");
        let mut big = proposal("PUT", "https://api.example.com/a", &[]);
        big.body = vec![b'x'; MAX_PROPOSAL_BODY_BYTES + 1];
        assert!(check(&g, big).unwrap_err().contains("a proposal may carry"));
    }

    #[test]
    fn a_url_reads_the_same_proposed_and_sent() {
        for (written, canonical) in [
            ("http://h:8080", "http://h:8080/"),
            ("http://h?x=1", "http://h/?x=1"),
            ("https://h/a/b?c", "https://h/a/b?c"),
        ] {
            assert_eq!(canonical_url(&written.parse().unwrap()).unwrap(), canonical, "{written}");
        }
    }

    #[test]
    fn each_approved_proposal_is_claimed_once_and_only_as_proposed() {
        let p = |n, body: &str| Proposal { n, body: body.into(), ..proposal("PUT", "http://h/a", &[("a", "1")]) };
        let approved = ApprovedEffects::new(vec![p(1, "x"), p(2, "x"), p(3, "y")], &BTreeSet::from([3]));
        let headers = vec![("A".to_owned(), "1".to_owned()), ("content-length".to_owned(), "1".to_owned())];
        let x = Digest::of(b"x");
        assert_eq!(approved.claim("PUT", "http://h/a", &headers, &x), Some(1));
        assert_eq!(approved.claim("PUT", "http://h/a", &headers, &x), Some(2), "the next identical one");
        assert_eq!(approved.claim("PUT", "http://h/a", &headers, &x), None, "each once");
        assert_eq!(approved.claim("PUT", "http://h/a", &headers, &Digest::of(b"y")), None, "3 was sent before");
        approved.settle(2, false);
        assert_eq!(approved.pending().iter().map(|p| p.n).collect::<Vec<_>>(), [1, 2], "2 may be sent again");
        approved.settle(1, true);
        assert_eq!(approved.claim("PUT", "http://h/a", &[], &x), None, "a header left out");
        let report = approved.report();
        assert_eq!((report.proposals, report.not_sent.len(), report.refused), (3, 1, 3));
        assert_eq!(
            report.line(),
            "apply sent 2 of 3 approved proposals; not sent: #2 PUT http://h/a; 3 request(s) refused as not proposed"
        );
        // Nor by another method, URL or body.
        let one = ApprovedEffects::new(vec![p(1, "x")], &BTreeSet::new());
        assert_eq!(one.claim("POST", "http://h/a", &headers, &x), None, "another method");
        assert_eq!(one.claim("PUT", "http://h/a?b=1", &headers, &x), None, "another URL");
        assert_eq!(one.claim("PUT", "http://h/a", &headers, &Digest::of(b"z")), None, "another body");
        assert_eq!(one.claim("PUT", "http://h/a", &headers, &x), Some(1));
    }
}
