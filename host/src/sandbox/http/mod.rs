//! Outbound HTTP for guests, through the standard
//! `wasi:http/outgoing-handler`, behind the job's
//! [`HttpGrant`](crate::job::grant::HttpGrant).
//!
//! Every request is checked before anything leaves the host: the method,
//! scheme, host and port must match a granted rule, and the job must be
//! under its request limit; otherwise the guest's request fails with
//! `HTTP-request-denied`, and the refusal is logged on the job and
//! counted. The host then resolves the name itself and connects only to
//! an address the grant allows (a private address needs a range granted
//! or the address written literally in a rule), so a DNS answer cannot
//! turn a grant into a way into the operator's network. Redirects are
//! not followed by the host: a guest that follows one sends a new request,
//! checked like the first. Bodies are capped both ways and every request
//! ends by its own time limit, never later than the job's deadline; when
//! the run ends (timeout, forced stop, lost lease) the store is dropped
//! and requests in flight are aborted with it.

mod fence;
mod pace;
mod secrets;
mod send;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub(crate) use fence::{AddressVerdicts, ProposalBook, checked as check_proposal};
pub use fence::{ApplyReport, ApprovedEffects, EffectFence};
pub(crate) use pace::RateTrip;
pub use pace::{EgressLimits, Pace};
pub use secrets::{SECRET_ENV_PREFIX, SecretStore};
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::journal::{Journal, LogLevel};
use crate::job::grant::{HttpScheme, SecretName};
use crate::job::{EffectOutcome, Grants};

/// The log field every HTTP refusal carries, so a job's log can be
/// searched for them.
pub const HTTP_LOG_FIELD: &str = "leash.http";

/// The runtime's side of a job's effects: the lease fence and the effect
/// ledger. The sandbox calls [`EffectLedger::begin`] before every
/// effectful request (any method the grant does not mark safe: by
/// default all but `GET` and `HEAD`) and sends nothing
/// unless it answers `Ok`; then it sends the request with the ticket's
/// `Idempotency-Key` and reports how it ended. A run without a ledger
/// (`leash run`) is neither fenced nor recorded.
#[async_trait::async_trait]
pub trait EffectLedger: Send + Sync + std::fmt::Debug {
    /// `Ok` once the attempt, still holding its lease and not stopping,
    /// has durably recorded the intent to send `method` to `url` (no
    /// query); `Err` says why the effect may not be made.
    /// `proposal`: the approved proposal it sends (an apply phase's).
    async fn begin(&self, method: &str, url: &str, proposal: Option<u32>) -> Result<EffectTicket, String>;

    /// Why the attempt may make no new effect, as far as it is known
    /// without asking the store (its lease is known lost, or it is
    /// stopping): checked before anything is resolved or connected, so
    /// a stopping guest's requests cost the host no connection.
    fn refusing(&self) -> Option<String>;

    /// Confirm, by asking the store, that the attempt still holds its
    /// lease, for a recorded intent whose ticket's `lease_until` passed
    /// before its request left (the process was paused, or the intent
    /// was slow to record): `Ok` with when the lease now runs out by the
    /// local clock, and the request is sent; `Err` says why it may not be.
    async fn reconfirm(&self) -> Result<std::time::Instant, String>;

    /// Record how the effect ended.
    async fn end(&self, ticket: &EffectTicket, outcome: EffectOutcome);
}

/// A recorded intent: the effect's place and the key its request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectTicket {
    /// The attempt making it.
    pub attempt: u32,
    /// Its place among the attempt's effects, from 1.
    pub seq: u32,
    /// The `Idempotency-Key` the request carries.
    pub idempotency_key: String,
    /// When the attempt's lease, as last confirmed, runs out by the local
    /// clock: the request is not sent after it unless
    /// [`EffectLedger::reconfirm`] renews it first. `None`: no lease.
    pub lease_until: Option<std::time::Instant>,
}

/// Why a request was refused before anything was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Denial {
    /// No rule matches the method, scheme, host and port: the rule that
    /// would.
    NotGranted(String),
    /// The job has sent its most requests.
    RequestLimit(u32),
    /// The URL has no host.
    NoHost,
    /// A header names a secret the request may not carry, or one not set.
    Secret(String),
    /// The attempt may make no new effect (the fence, asked before
    /// connecting).
    Fenced(String),
    /// An effect in a plan's execute phase.
    ReadOnly,
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denial::NotGranted(rule) => write!(f, "not granted; grant it with --allow-host '{rule}'"),
            Denial::RequestLimit(n) => {
                write!(f, "the job's limit of {n} requests is reached (later ones are only counted)")
            }
            Denial::NoHost => write!(f, "the URL names no host"),
            Denial::Secret(why) => f.write_str(why),
            Denial::Fenced(why) => write!(f, "no new effects: {why}"),
            Denial::ReadOnly => f.write_str("effects are not allowed in the execute phase; propose them"),
        }
    }
}

/// Requests a run sent and refused.
#[derive(Debug, Default)]
pub(crate) struct HttpMeter {
    /// Granted requests, sent or not: what the request limit counts, so
    /// a guest that retries refused requests in a loop reaches it.
    admitted: AtomicU64,
    /// Admitted requests refused before they were sent.
    withdrawn: AtomicU64,
    denied: AtomicU64,
}

impl HttpMeter {
    /// (sent, denied) so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let admitted = self.admitted.load(Ordering::Relaxed);
        (admitted.saturating_sub(self.withdrawn.load(Ordering::Relaxed)), self.denied.load(Ordering::Relaxed))
    }
}

/// Where an admitted request goes.
pub(super) struct Target {
    scheme: HttpScheme,
    /// As the URL wrote it (an IPv6 literal keeps its brackets).
    host: String,
    port: u16,
    /// When the request must be over (from when it leaves, after any wait
    /// for its rate slot).
    until: Instant,
    /// The job's deadline.
    deadline: Instant,
    /// The secrets the host put into its headers.
    secrets: Vec<SecretName>,
    method: String,
    /// `scheme://host[:port]/path`, query and credentials left out: what
    /// logs and the ledger show.
    url: String,
    /// Record the effect here before sending (the method is not a safe
    /// one).
    ledger: Option<Arc<dyn EffectLedger>>,
    /// An apply phase's effect: sent only as an approved proposal.
    approved: Option<ApprovedRequest>,
}

/// What an apply phase's effectful request is matched on: the approved
/// proposals, and the request's URL and headers as the guest wrote them
/// (before the host put in any secret).
pub(super) struct ApprovedRequest {
    effects: Arc<ApprovedEffects>,
    url: String,
    headers: Vec<(String, String)>,
}

impl Target {
    /// `METHOD url`, as refusals are logged.
    fn shown(&self) -> String {
        format!("{} {}", self.method, self.url)
    }
}

/// The hooks wasmtime-wasi-http calls for one job's requests.
pub(crate) struct HttpGate {
    grants: Arc<Grants>,
    secrets: Arc<SecretStore>,
    ledger: Option<Arc<dyn EffectLedger>>,
    egress: Option<Arc<dyn EgressLimits>>,
    trip: Arc<RateTrip>,
    journal: Journal,
    meter: Arc<HttpMeter>,
    deadline: Instant,
    /// Whether the request limit's first denial has been logged.
    limit_logged: bool,
    /// What the phase may do with effects.
    fence: EffectFence,
    /// An execute phase's proposals.
    pub(crate) book: ProposalBook,
}

impl HttpGate {
    pub(crate) fn new(
        grants: Arc<Grants>,
        secrets: Arc<SecretStore>,
        ledger: Option<Arc<dyn EffectLedger>>,
        egress: Option<Arc<dyn EgressLimits>>,
        fence: EffectFence,
        journal: Journal,
        deadline: Instant,
    ) -> Self {
        HttpGate {
            grants,
            secrets,
            ledger,
            egress,
            trip: Arc::default(),
            journal,
            meter: Arc::default(),
            deadline,
            limit_logged: false,
            fence,
            book: ProposalBook::default(),
        }
    }

    /// Propose an effect (a plan's execute phase only): checked against
    /// the grant as if it were being sent, and recorded; its number, or
    /// why it was refused (logged; it fails the phase).
    pub(crate) async fn propose(
        &mut self,
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<u32, String> {
        if !matches!(self.fence, EffectFence::Propose) {
            return Err("effects are proposed only in a plan's execute phase".into());
        }
        let shown = format!("{method} {url}");
        let made = self.book.propose(&self.grants.http, &self.secrets, method, url, headers, body).await;
        if let Err(why) = &made {
            let mut why = why.clone();
            self.journal.clean(&mut why);
            self.journal.record(
                LogLevel::Warn,
                format!("proposal refused: {why}"),
                vec![(HTTP_LOG_FIELD.to_owned(), "proposal_refused".to_owned())],
            );
            self.book.refused.get_or_insert_with(|| if why.contains(&shown) { why } else { format!("{shown}: {why}") });
        }
        made
    }

    /// An apply phase's approved proposals not sent yet.
    pub(crate) fn approved(&self) -> Vec<crate::job::Proposal> {
        match &self.fence {
            EffectFence::Approved(effects) => effects.pending(),
            _ => Vec::new(),
        }
    }

    pub(crate) fn meter(&self) -> Arc<HttpMeter> {
        self.meter.clone()
    }

    /// What ends the run when a request's rate slot is past its deadline.
    pub(crate) fn trip(&self) -> Arc<RateTrip> {
        self.trip.clone()
    }

    /// Check a request against the grant and the request limit, and put
    /// in the secrets its headers name.
    fn admit(&self, request: &mut http::Request<WasiBody>) -> Result<Target, (String, Denial)> {
        let uri = request.uri();
        let method = request.method().as_str();
        // Host and port only: a user-info part (`user:password@`) of the
        // authority is never logged or recorded.
        let port_text = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
        let mut url = format!(
            "{}://{}{port_text}{}",
            uri.scheme_str().unwrap_or("https"),
            uri.host().unwrap_or_default(),
            uri.path()
        );
        // What the ledger records and refusals show holds no secret value.
        self.journal.clean(&mut url);
        let shown = format!("{method} {url}");
        let scheme = match uri.scheme_str() {
            Some("http") => HttpScheme::Http,
            _ => HttpScheme::Https,
        };
        let Some(host) = uri.host().filter(|h| !h.is_empty()) else { return Err((shown, Denial::NoHost)) };
        let grant = &self.grants.http;
        let effect = grant.is_effect(method);
        if effect && matches!(self.fence, EffectFence::Propose) {
            return Err((shown, Denial::ReadOnly));
        }
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        // The upstream's `Host` is the checked host and port, never the
        // guest's authority text: a user-info part would put whatever the
        // guest wrote before `@` into it.
        let host_header =
            http::HeaderValue::from_str(&format!("{host}{port_text}")).map_err(|_| (shown.clone(), Denial::NoHost))?;
        if !grant.allows(method, scheme, host, port) {
            let rule = format!("{method} {}://{host}{port_text}", uri.scheme_str().unwrap_or("https"));
            return Err((shown, Denial::NotGranted(rule)));
        }
        let approved = match (&self.fence, effect) {
            (EffectFence::Approved(effects), true) => Some(ApprovedRequest {
                effects: effects.clone(),
                url: fence::canonical_url(uri).map_err(|_| (shown.clone(), Denial::NoHost))?,
                headers: request
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                    .collect(),
            }),
            _ => None,
        };
        let (method, host) = (method.to_owned(), host.to_owned());
        let secrets =
            match secrets::substitute(request.headers_mut(), &self.secrets, grant, (&method, scheme, &host, port)) {
                Ok(carried) => carried,
                Err(why) => return Err((shown, Denial::Secret(why))),
            };
        let limits = &grant.limits;
        // Count first, so requests racing for the last places cannot pass together.
        if self.meter.admitted.fetch_add(1, Ordering::Relaxed) >= u64::from(limits.requests) {
            self.meter.admitted.fetch_sub(1, Ordering::Relaxed);
            return Err((shown, Denial::RequestLimit(limits.requests)));
        }
        let ledger = self.ledger.clone().filter(|_| effect);
        if let Some(why) = ledger.as_ref().and_then(|l| l.refusing()) {
            // Still counted against the limit; not counted as sent.
            self.meter.withdrawn.fetch_add(1, Ordering::Relaxed);
            return Err((shown, Denial::Fenced(why)));
        }
        request.headers_mut().insert(http::header::HOST, host_header);
        let until = (Instant::now() + limits.request_timeout).min(self.deadline);
        let deadline = self.deadline;
        Ok(Target { scheme, host, port, until, deadline, secrets, method, url, ledger, approved })
    }
}

/// Log and count a request refused after it was admitted (by the address
/// its name resolved to, or by the fence): it was not sent, and still
/// counts against the request limit.
fn withdrawn(journal: &Journal, meter: &HttpMeter, shown: &str, why: &dyn std::fmt::Display) {
    meter.withdrawn.fetch_add(1, Ordering::Relaxed);
    denied(journal, meter, shown, why);
}

/// Log and count a request the host refused.
fn denied(journal: &Journal, meter: &HttpMeter, shown: &str, why: &dyn std::fmt::Display) {
    meter.denied.fetch_add(1, Ordering::Relaxed);
    journal.record(
        LogLevel::Warn,
        format!("HTTP request denied: {shown}: {why}"),
        vec![(HTTP_LOG_FIELD.to_owned(), "denied".to_owned())],
    );
}

type SendFuture = Box<
    dyn Future<Output = Result<(http::Response<WasiBody>, Box<dyn Future<Output = Result<(), Error>> + Send>), Error>>
        + Send,
>;

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> SendFuture {
        match self.admit(&mut request) {
            Err((shown, denial)) => {
                if matches!(denial, Denial::RequestLimit(_)) && self.limit_logged {
                    // Logged once; a flood past the limit is only counted.
                    self.meter.denied.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.limit_logged |= matches!(denial, Denial::RequestLimit(_));
                    denied(&self.journal, &self.meter, &shown, &denial);
                }
                Box::new(async { Err(Error::HttpRequestDenied) })
            }
            Ok(target) => Box::new(send::send(
                target,
                request,
                options,
                self.grants.clone(),
                (self.egress.clone(), self.trip.clone()),
                self.journal.clone(),
                self.meter.clone(),
            )),
        }
    }

    fn p2_error_from_connect(&mut self, err: &std::io::Error) -> ErrorCode {
        match err.kind() {
            std::io::ErrorKind::ConnectionRefused => ErrorCode::ConnectionRefused,
            std::io::ErrorKind::TimedOut => ErrorCode::ConnectionTimeout,
            _ => ErrorCode::DestinationUnavailable,
        }
    }

    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        // A request body cut at its limit reaches hyper as the body's error.
        let cause = std::error::Error::source(err).and_then(|e| e.downcast_ref::<Error>());
        if let Some(Error::HttpRequestBodySize(limit)) = cause {
            return ErrorCode::HttpRequestBodySize(*limit);
        }
        if err.is_timeout() {
            ErrorCode::ConnectionReadTimeout
        } else if err.is_incomplete_message() {
            ErrorCode::HttpResponseIncomplete
        } else {
            ErrorCode::HttpProtocolError
        }
    }
}
