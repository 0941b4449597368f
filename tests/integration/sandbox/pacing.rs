//! Granted requests under egress rate limits, in the sandbox: what the
//! limits are asked (the request as granted, with the secrets the host put
//! in), a wait for the slot, a slot past the deadline ending the run
//! `rate_limited` and retryable, and the refusals: no slot could be given,
//! or the attempt began stopping while its effect waited.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leash::job::grant::{HttpGrant, HttpScheme, SecretName};
use leash::job::rate::Outbound;
use leash::job::{EffectOutcome, ErrorKind, Grants};
use leash::sandbox::http::{EffectLedger, EffectTicket, EgressLimits, Pace, SecretStore};
use leash::sandbox::{NoObserver, Outcome, RunRequest, Sandbox, SandboxConfig, StopHandle};
use serde_json::{Value, json};

use crate::support::{self, Upstream, limits, request};

/// What `pace` was asked: method, scheme, host, port, secrets, and the
/// longest wait.
type Asked = (String, HttpScheme, String, u16, Vec<SecretName>, Duration);

/// Limits that answer `pace` with one answer, and keep what they were
/// asked.
#[derive(Debug)]
struct Fixed {
    answer: Result<Pace, String>,
    asked: Mutex<Vec<Asked>>,
}

impl Fixed {
    fn new(answer: Result<Pace, String>) -> Arc<Fixed> {
        Arc::new(Fixed { answer, asked: Mutex::default() })
    }
}

#[async_trait::async_trait]
impl EgressLimits for Fixed {
    async fn pace(&self, request: &Outbound<'_>, at_most: Duration) -> Result<Pace, String> {
        let asked = (
            request.method.to_owned(),
            request.scheme,
            request.host.to_owned(),
            request.port,
            request.secrets.to_vec(),
            at_most,
        );
        self.asked.lock().unwrap().push(asked);
        self.answer.clone()
    }
}

/// A ledger that lets the first check through and says the attempt is
/// stopping from then on; it records every effect it begins.
#[derive(Debug, Default)]
struct StopsWhileWaiting {
    checks: AtomicUsize,
    begun: AtomicUsize,
}

#[async_trait::async_trait]
impl EffectLedger for StopsWhileWaiting {
    fn refusing(&self) -> Option<String> {
        (self.checks.fetch_add(1, Ordering::SeqCst) > 0).then(|| "the attempt is stopping".to_owned())
    }

    async fn begin(&self, _method: &str, _url: &str, _proposal: Option<u32>) -> Result<EffectTicket, String> {
        let seq = self.begun.fetch_add(1, Ordering::SeqCst) as u32 + 1;
        Ok(EffectTicket { attempt: 1, seq, idempotency_key: format!("job/{seq}"), lease_until: None })
    }

    async fn reconfirm(&self) -> Result<std::time::Instant, String> {
        unreachable!("its tickets carry no lease")
    }

    async fn end(&self, _ticket: &EffectTicket, _outcome: EffectOutcome) {}
}

/// A sandbox whose operator has set `TOKEN`.
fn sandbox_with_token() -> Sandbox {
    let secrets = SecretStore::from_pairs([("TOKEN".to_owned(), "t0ken".to_owned())]).unwrap();
    Sandbox::new(SandboxConfig { secrets: Arc::new(secrets), ..support::sandbox_config() }).unwrap()
}

/// `webhook` delivering `count` events to the upstream's `/hello`, with
/// `TOKEN` bound to it, under `egress`.
fn deliveries(upstream: &Upstream, count: u32, egress: Arc<dyn EgressLimits>) -> RunRequest {
    let rule: leash::job::grant::HostRule = format!("POST {}", upstream.url("")).parse().unwrap();
    let mut http = HttpGrant { hosts: vec![rule.clone()], ..HttpGrant::default() };
    http.bind_secret("TOKEN".parse().unwrap(), rule);
    let input = json!({ "url": upstream.url("/hello"), "count": count, "secret": "TOKEN" });
    RunRequest {
        grants: Arc::new(Grants { http, ..Grants::default() }),
        egress: Some(egress),
        ..request(input.to_string().as_bytes(), limits())
    }
}

async fn run(sandbox: &Sandbox, plugin: &str, request: RunRequest) -> Outcome {
    let plugin = support::load(sandbox, plugin);
    sandbox.run(&plugin, request, &StopHandle::new(), Arc::new(NoObserver)).await
}

fn logged(outcome: &Outcome, field: &str) -> Vec<String> {
    outcome
        .logs
        .iter()
        .filter(|r| r.fields.iter().any(|(k, v)| k == "leash.http" && v == field))
        .map(|r| r.message.clone())
        .collect()
}

/// Each request waits 1.5 s for its slot, and its own time limit (1 s)
/// runs from when it leaves, not from when it began waiting.
#[tokio::test]
async fn the_limits_see_each_request_as_granted_with_its_secrets_and_it_leaves_after_its_wait() {
    let sandbox = sandbox_with_token();
    let upstream = Upstream::start().await;
    let limits = Fixed::new(Ok(Pace::After(Duration::from_millis(1500), vec!["upstream".into()])));
    let mut request = deliveries(&upstream, 2, limits.clone());
    let mut grants = (*request.grants).clone();
    grants.http.limits.request_timeout = Duration::from_secs(1);
    request.grants = Arc::new(grants);
    let outcome = run(&sandbox, "webhook", request).await;
    assert_eq!(support::output_json(&outcome)["delivered"], 2);
    assert_eq!(upstream.received().len(), 2);
    let asked = limits.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2, "asked once a request");
    let (method, scheme, host, port, secrets, at_most) = &asked[0];
    assert_eq!(
        (method.as_str(), *scheme, host.as_str(), *port),
        ("POST", HttpScheme::Http, "127.0.0.1", upstream.addr.port())
    );
    assert_eq!(secrets, &vec!["TOKEN".parse::<SecretName>().unwrap()], "the secret the host put in");
    assert!(*at_most <= support::limits().timeout, "never past the deadline: {at_most:?}");
    let waits = logged(&outcome, "rate_wait");
    assert_eq!(waits.len(), 1, "the first wait is logged, the rest only counted: {waits:?}");
    assert!(waits[0].contains("for its slot under rate limit upstream"), "{waits:?}");
}

#[tokio::test]
async fn a_slot_past_the_deadline_ends_the_run_rate_limited_and_retryable_from_it() {
    let sandbox = sandbox_with_token();
    let upstream = Upstream::start().await;
    let hour = Duration::from_secs(3600);
    let limits = Fixed::new(Ok(Pace::TooLate(hour, vec!["hourly".into()])));
    let outcome = run(&sandbox, "webhook", deliveries(&upstream, 1, limits)).await;
    let failure = outcome.result.as_ref().expect_err("the run ends");
    assert_eq!((failure.kind, failure.retryable, failure.retry_after), (ErrorKind::RateLimited, true, Some(hour)));
    assert!(failure.message.contains("rate limit hourly") && failure.message.contains("after the job's deadline"));
    assert!(upstream.received().is_empty(), "nothing was sent");
    assert_eq!((outcome.usage.http_requests, outcome.usage.http_denied), (0, 1));
    // At once: not at its timeout (a minute), where a guest left waiting
    // in the request would have ended.
    assert!(outcome.usage.duration < support::limits().timeout, "{:?}", outcome.usage.duration);
}

#[tokio::test]
async fn a_request_no_slot_could_be_given_for_is_refused_not_sent_unlimited() {
    let sandbox = sandbox_with_token();
    let upstream = Upstream::start().await;
    let limits = Fixed::new(Err("the store is unreachable".into()));
    let outcome = run(&sandbox, "webhook", deliveries(&upstream, 1, limits)).await;
    let failure = outcome.result.as_ref().expect_err("the guest fails on the refusal");
    assert!(failure.message.contains("HttpRequestDenied"), "{failure:?}");
    assert!(upstream.received().is_empty());
    let denied = logged(&outcome, "denied");
    assert!(denied.iter().any(|l| l.ends_with("no rate slot could be given: the store is unreachable")), "{denied:?}");
}

#[tokio::test]
async fn an_effect_whose_attempt_began_stopping_while_it_waited_is_not_sent() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let limits = Fixed::new(Ok(Pace::After(Duration::from_millis(20), vec!["upstream".into()])));
    let ledger = Arc::new(StopsWhileWaiting::default());
    let post: Value = json!({ "url": upstream.url("/hello"), "method": "POST", "body": "x" });
    let rule = format!("POST {}", upstream.url("")).parse().unwrap();
    let request = RunRequest {
        grants: Arc::new(Grants { http: HttpGrant { hosts: vec![rule], ..HttpGrant::default() }, ..Grants::default() }),
        egress: Some(limits),
        effects: Some(ledger.clone()),
        ..request(post.to_string().as_bytes(), support::limits())
    };
    let outcome = run(&sandbox, "http-get", request).await;
    assert!(outcome.result.as_ref().unwrap_err().message.contains("HttpRequestDenied"), "{:?}", outcome.result);
    assert!(upstream.received().is_empty(), "not sent");
    assert_eq!(ledger.begun.load(Ordering::SeqCst), 0, "no intent recorded");
    let denied = logged(&outcome, "denied");
    assert!(denied.iter().any(|l| l.ends_with("no new effects: the attempt is stopping")), "{denied:?}");
}
