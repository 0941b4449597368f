//! Outbound HTTP from guests: what the job's grant lets through reaches a
//! loopback upstream of the tests' own (which records every request it
//! receives); everything else is refused before a byte is sent, logged on
//! the job and counted.

use std::sync::Arc;
use std::time::Duration;

use leash::job::grant::{HttpGrant, HttpLimits};
use leash::job::{EffectOutcome, ErrorKind, Grants};
use leash::sandbox::http::{EffectLedger, EffectTicket, SecretStore};
use leash::sandbox::{NoObserver, Outcome, RunLimits, RunRequest, Sandbox, SandboxConfig, StopHandle};
use serde_json::{Value, json};

use crate::support::{self, Upstream, limits, output_json, request};

fn grant(rules: &[&str]) -> HttpGrant {
    HttpGrant { hosts: rules.iter().map(|r| r.parse().unwrap()).collect(), ..HttpGrant::default() }
}

fn http_only(http: HttpGrant) -> Grants {
    Grants { http, ..Grants::default() }
}

/// A run on `input` with `grants` (and no effect ledger).
fn job(input: &Value, grants: Grants, limits: RunLimits) -> RunRequest {
    RunRequest { grants: Arc::new(grants), ..request(input.to_string().as_bytes(), limits) }
}

async fn run_job(sandbox: &Sandbox, plugin: &str, request: RunRequest) -> Outcome {
    let plugin = support::load(sandbox, plugin);
    sandbox.run(&plugin, request, &StopHandle::new(), Arc::new(NoObserver)).await
}

async fn run(sandbox: &Sandbox, plugin: &str, input: Value, grant: HttpGrant, limits: RunLimits) -> Outcome {
    run_job(sandbox, plugin, job(&input, http_only(grant), limits)).await
}

/// The job's log lines about HTTP refusals.
fn denials(outcome: &Outcome) -> Vec<String> {
    outcome
        .logs
        .iter()
        .filter(|r| r.fields.iter().any(|(k, v)| k == "leash.http" && v == "denied"))
        .map(|r| r.message.clone())
        .collect()
}

fn failure_message(outcome: &Outcome) -> &str {
    let failure = outcome.result.as_ref().expect_err("the request must fail");
    assert_eq!(failure.kind, ErrorKind::GuestError, "{}", failure.message);
    &failure.message
}

#[tokio::test]
async fn a_granted_request_reaches_the_upstream_and_an_ungranted_one_sends_nothing() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let input = json!({ "url": upstream.url("/hello?q=1") });

    let outcome = run(&sandbox, "http-get", input.clone(), HttpGrant::default(), limits()).await;
    assert!(failure_message(&outcome).contains("HttpRequestDenied"), "{:?}", outcome.result);
    assert_eq!(upstream.received(), Vec::<String>::new(), "a denied request sends nothing");
    let logged = denials(&outcome);
    assert_eq!(logged.len(), 1, "{logged:?}");
    let hint =
        format!("GET {}: not granted; grant it with --allow-host 'GET {}'", upstream.url("/hello"), upstream.url(""));
    assert!(logged[0].contains(&hint), "{logged:?}");
    assert!(!logged[0].contains("q=1"), "the query is not logged: {logged:?}");
    assert_eq!((outcome.usage.http_requests, outcome.usage.http_denied), (0, 1));

    let granted = grant(&[&format!("GET {}", upstream.url(""))]);
    let outcome = run(&sandbox, "http-get", input, granted.clone(), limits()).await;
    let output = output_json(&outcome);
    assert_eq!((output["status"].as_u64(), output["body_start"].as_str()), (Some(200), Some("hello")));
    assert_eq!(upstream.received(), vec!["GET /hello?q=1".to_owned()]);
    assert_eq!((outcome.usage.http_requests, outcome.usage.http_denied), (1, 0));

    // Headers that would redirect or reframe the request are the host's.
    for header in ["host", "transfer-encoding", "connection", "upgrade", "proxy-authorization"] {
        let forged = json!({ "url": upstream.url("/hello"), "headers": { header: "evil.example" } });
        let outcome = run(&sandbox, "http-get", forged, granted.clone(), limits()).await;
        assert!(failure_message(&outcome).contains(&format!("header {header}")), "{:?}", outcome.result);
    }
    assert_eq!(upstream.received().len(), 1, "no forged request was sent");

    // The method is part of the grant.
    let post = json!({ "url": upstream.url("/hello"), "method": "POST", "body": "x" });
    let outcome = run(&sandbox, "http-get", post, granted, limits()).await;
    assert!(failure_message(&outcome).contains("HttpRequestDenied"));
    assert_eq!(upstream.received().len(), 1, "the POST was not sent");
}

#[tokio::test]
async fn a_granted_name_that_resolves_to_loopback_needs_the_range_granted() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let by_name = format!("http://localhost:{}", upstream.addr.port());
    let input = json!({ "url": format!("{by_name}/hello") });

    let outcome = run(&sandbox, "http-get", input.clone(), grant(&[&by_name]), limits()).await;
    assert!(failure_message(&outcome).contains("DestinationIpProhibited"), "{:?}", outcome.result);
    let hint = "a private address no range is granted for; grant it with --allow-private ";
    assert!(denials(&outcome)[0].contains(hint), "{:?}", denials(&outcome));
    assert_eq!(upstream.received(), Vec::<String>::new());
    assert_eq!((outcome.usage.http_requests, outcome.usage.http_denied), (0, 1), "refused, not sent");

    let mut with_range = grant(&[&by_name]);
    with_range.private_ranges = vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()];
    let outcome = run(&sandbox, "http-get", input, with_range, limits()).await;
    assert_eq!(output_json(&outcome)["status"], 200);
    assert_eq!(upstream.received(), vec!["GET /hello".to_owned()]);
}

#[tokio::test]
async fn every_escape_of_http_escape_is_refused_and_sends_nothing() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let port = upstream.addr.port();
    let granted = format!("GET http://127.0.0.1:{port}");
    let tries = json!([
        // Another port of the same address.
        { "url": format!("http://127.0.0.1:{}/", port.wrapping_add(1)) },
        // The cloud metadata address, and loopback by another literal.
        { "url": "http://169.254.169.254/latest/meta-data/" },
        { "url": format!("http://127.0.0.2:{port}/hello") },
        // Loopback by a name, and https to the granted address.
        { "url": format!("http://localhost:{port}/hello") },
        { "url": format!("https://127.0.0.1:{port}/hello") },
        // A method not granted.
        { "url": upstream.url("/hello"), "method": "DELETE" },
        // A granted request redirected to the metadata address.
        { "url": upstream.url("/redirect?to=http://169.254.169.254/latest/") },
        // Credentials in the authority, to another address.
        { "url": format!("http://user:hunter2@127.0.0.2:{port}/hello") },
    ]);
    let input = json!({ "tries": tries, "flood": { "url": upstream.url("/hello"), "count": 10_000 } });
    let mut grant = grant(&[&granted]);
    grant.limits = HttpLimits { requests: 25, ..HttpLimits::default() };
    let outcome = run(&sandbox, "http-escape", input, grant, limits()).await;
    let output = output_json(&outcome);

    let results = output["tries"].as_array().unwrap();
    for result in &results[..6] {
        assert_eq!(result["error"], "HttpRequestDenied", "{result}");
    }
    let redirected = &results[6];
    assert_eq!(redirected["visited"].as_array().unwrap().len(), 2, "{redirected}");
    assert_eq!(redirected["error"], "HttpRequestDenied", "the redirect is checked like any request: {redirected}");
    assert_eq!(results[7]["error"], "HttpRequestDenied", "{}", results[7]);
    // One request reached the upstream (the redirect), then 24 of the flood.
    assert_eq!(output["flood"]["ok"], 24, "{output}");
    assert_eq!(output["flood"]["errors"]["HttpRequestDenied"], 10_000 - 24, "{output}");
    let received = upstream.received();
    assert_eq!(received.len(), 25, "only the granted requests arrived");
    assert!(received[0].starts_with("GET /redirect"));
    assert!(received[1..].iter().all(|r| r == "GET /hello"), "{received:?}");
    assert_eq!((outcome.usage.http_requests, outcome.usage.http_denied), (25, 8 + 10_000 - 24));
    // Every refusal is logged, except the flood past the limit: once.
    let logged = denials(&outcome);
    assert_eq!(logged.len(), 9, "{logged:#?}");
    assert!(logged.iter().any(|l| l.contains("GET http://127.0.0.2:")), "{logged:#?}");
    assert!(!logged.iter().any(|l| l.contains("hunter2")), "credentials in a URL are never logged: {logged:#?}");
    assert_eq!(logged.iter().filter(|l| l.contains("limit of 25 requests")).count(), 1);
}

#[tokio::test]
async fn a_response_past_the_limit_fails_the_request() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let mut grant = grant(&[&upstream.url("")]);
    grant.limits.response_bytes = 1 << 20;
    let input = json!({ "url": upstream.url("/big/1073741824") });
    let outcome = run(&sandbox, "http-get", input, grant.clone(), limits()).await;
    assert!(
        failure_message(&outcome).contains("response body size exceeds limit: 1048576 bytes"),
        "{:?}",
        outcome.result
    );
    // Under the limit, the whole body arrives.
    let outcome = run(&sandbox, "http-get", json!({ "url": upstream.url("/big/1048576") }), grant, limits()).await;
    assert_eq!(output_json(&outcome)["body_bytes"], 1 << 20);
}

#[tokio::test]
async fn a_silent_upstream_is_cut_off_at_the_request_time_limit_and_never_past_the_job() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let mut grant = grant(&[&upstream.url("")]);
    grant.limits.request_timeout = Duration::from_millis(300);
    let input = json!({ "url": upstream.url("/slow") });
    let outcome = run(&sandbox, "http-get", input.clone(), grant.clone(), limits()).await;
    // Normally the answer is what times out; on a starved machine the
    // connect itself may reach the limit first.
    let message = failure_message(&outcome);
    assert!(message.contains("HttpResponseTimeout") || message.contains("ConnectionTimeout"), "{message}");

    // A request limit longer than the job's: the job's timeout ends it.
    grant.limits.request_timeout = support::GENEROUS;
    let short = RunLimits { timeout: Duration::from_millis(500), ..limits() };
    let outcome = run(&sandbox, "http-get", input, grant, short).await;
    let failure = outcome.result.as_ref().expect_err("the job must end");
    let request_timed_out = ["HttpResponseTimeout", "ConnectionTimeout"].iter().any(|c| failure.message.contains(c));
    assert!(failure.kind == ErrorKind::Timeout || request_timed_out, "ended by the job's deadline: {failure:?}");
    assert!(outcome.usage.duration < Duration::from_secs(10), "ended near the deadline: {:?}", outcome.usage.duration);
}

#[tokio::test]
async fn a_forced_stop_aborts_the_request_in_flight() {
    let sandbox = Arc::new(support::sandbox());
    let upstream = Upstream::start().await;
    let plugin = support::load(&sandbox, "http-get");
    let request = job(&json!({ "url": upstream.url("/slow") }), http_only(grant(&[&upstream.url("")])), limits());
    let stop = StopHandle::new();
    let run = tokio::spawn({
        let (sandbox, stop) = (sandbox.clone(), stop.clone());
        async move { sandbox.run(&plugin, request, &stop, Arc::new(NoObserver)).await }
    });
    upstream.wait_for("GET /slow").await;
    stop.force();
    let outcome = tokio::time::timeout(support::GENEROUS, run).await.expect("the run ends").unwrap();
    assert_eq!(outcome.result.as_ref().unwrap_err().kind, ErrorKind::Cancelled, "{:?}", outcome.result);
    // The host dropped the connection with the run: the upstream sees its
    // client go away.
    upstream.wait_for("closed /slow").await;
}

/// A sandbox whose operator has set `TOKEN`.
fn sandbox_with_secret(value: &str) -> Sandbox {
    let secrets = SecretStore::from_pairs([("TOKEN".to_owned(), value.to_owned())]).unwrap();
    Sandbox::new(SandboxConfig { secrets: Arc::new(secrets), ..support::sandbox_config() }).unwrap()
}

#[tokio::test]
async fn a_secret_reaches_only_its_bound_host_and_never_the_jobs_logs() {
    const VALUE: &str = "s3cr3t-t0ken-value";
    let sandbox = sandbox_with_secret(VALUE);
    let upstream = Upstream::start().await;
    let input = json!({
        "url": upstream.url("/echo-auth"),
        "headers": { "authorization": "Bearer {secret:TOKEN}" },
        "log_body": true,
    });
    let mut bound = grant(&[&upstream.url("")]);
    bound.bind_secret("TOKEN".parse().unwrap(), upstream.url("").parse().unwrap());
    let outcome = run(&sandbox, "http-get", input.clone(), bound, limits()).await;
    assert_eq!(upstream.received(), vec![format!("GET /echo-auth authorization=Bearer {VALUE}")]);
    // The output the host keeps names the secret; its value is not in it.
    assert_eq!(output_json(&outcome)["body_start"], "Bearer {secret:TOKEN}");
    // The upstream echoed it; the guest logged what it got back.
    let logged: Vec<&str> = outcome.logs.iter().map(|r| r.message.as_str()).collect();
    assert!(logged.contains(&"response 200: Bearer {secret:TOKEN}"), "{logged:?}");
    assert!(!format!("{:?}", outcome.logs).contains(VALUE), "the value is in no log record");

    // Bound to another host: refused before anything is sent.
    let mut elsewhere = grant(&[&upstream.url("")]);
    elsewhere.bind_secret("TOKEN".parse().unwrap(), "https://api.example.com".parse().unwrap());
    let outcome = run(&sandbox, "http-get", input.clone(), elsewhere, limits()).await;
    assert!(failure_message(&outcome).contains("HttpRequestDenied"));
    assert!(denials(&outcome)[0].ends_with("secret TOKEN is not granted for this request"), "{:?}", denials(&outcome));
    assert_eq!(upstream.received().len(), 1, "nothing more was sent");

    // Granted, but not set on this host: refused the same way.
    let unset = Sandbox::new(support::sandbox_config()).unwrap();
    let mut bound = grant(&[&upstream.url("")]);
    bound.bind_secret("TOKEN".parse().unwrap(), upstream.url("").parse().unwrap());
    let outcome = run(&unset, "http-get", input, bound, limits()).await;
    assert!(denials(&outcome)[0].ends_with("secret TOKEN is not set on this host"), "{:?}", denials(&outcome));
    assert_eq!(upstream.received().len(), 1);
}

/// A ledger that records in memory, or refuses every effect; its tickets
/// carry `lease_until`.
#[derive(Debug, Default)]
struct Ledger {
    refuse: Option<String>,
    /// What `refusing` says: known without the store.
    stopping: Option<String>,
    lease_until: Option<std::time::Instant>,
    /// What `reconfirm` says when a ticket's `lease_until` has passed:
    /// why the lease is gone, or (`None`) that it holds for another minute.
    lapsed: Option<String>,
    reconfirmed: std::sync::atomic::AtomicU32,
    begun: std::sync::Mutex<Vec<(String, String)>>,
    ended: std::sync::Mutex<Vec<(u32, EffectOutcome)>>,
}

#[async_trait::async_trait]
impl EffectLedger for Ledger {
    fn refusing(&self) -> Option<String> {
        self.stopping.clone()
    }

    async fn begin(&self, method: &str, url: &str, _proposal: Option<u32>) -> Result<EffectTicket, String> {
        if let Some(why) = &self.refuse {
            return Err(why.clone());
        }
        let mut begun = self.begun.lock().unwrap();
        begun.push((method.to_owned(), url.to_owned()));
        let seq = begun.len() as u32;
        Ok(EffectTicket { attempt: 1, seq, idempotency_key: format!("job/{seq}"), lease_until: self.lease_until })
    }

    async fn reconfirm(&self) -> Result<std::time::Instant, String> {
        self.reconfirmed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.lapsed.clone().map_or_else(|| Ok(std::time::Instant::now() + Duration::from_secs(60)), Err)
    }

    async fn end(&self, ticket: &EffectTicket, outcome: EffectOutcome) {
        self.ended.lock().unwrap().push((ticket.seq, outcome));
    }
}

#[tokio::test]
async fn an_effect_is_recorded_before_it_is_sent_and_refused_when_the_ledger_says_no() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let attempt = |input: Value, ledger: Arc<Ledger>| {
        let request = job(&input, http_only(grant(&[&upstream.url("")])), limits());
        run_job(&sandbox, "http-get", RunRequest { effects: Some(ledger), ..request })
    };
    let post = json!({ "url": upstream.url("/hello?card=4242"), "method": "POST", "body": "effect" });
    let closed = Arc::new(Ledger { refuse: Some("the attempt's lease is lost".into()), ..Ledger::default() });

    let outcome = attempt(post.clone(), closed).await;
    assert!(failure_message(&outcome).contains("HttpRequestDenied"));
    assert!(denials(&outcome)[0].ends_with("no new effects: the attempt's lease is lost"), "{:?}", denials(&outcome));
    assert!(upstream.received().is_empty(), "a refused effect sends nothing");
    assert_eq!((outcome.usage.http_requests, outcome.usage.http_denied), (0, 1));

    let ledger = Arc::new(Ledger::default());
    let outcome = attempt(json!({ "url": upstream.url("/hello") }), ledger.clone()).await;
    assert_eq!(output_json(&outcome)["status"], 200);
    assert!(ledger.begun.lock().unwrap().is_empty(), "a GET is not an effect");
    let outcome = attempt(post, ledger.clone()).await;
    assert_eq!(output_json(&outcome)["status"], 200);
    let begun = ledger.begun.lock().unwrap().clone();
    assert_eq!(begun, vec![("POST".to_owned(), upstream.url("/hello"))], "recorded without the query");
    assert_eq!(*ledger.ended.lock().unwrap(), vec![(1, EffectOutcome::Status(200))]);
    assert_eq!(
        upstream.received(),
        vec!["GET /hello".to_owned(), "POST /hello?card=4242 idempotency-key=job/1".to_owned()],
        "the effect carries its idempotency key"
    );

    // Recorded, but the lease ran out (by the host's clock) before the
    // request could leave, and the store says it is lost: it is not sent,
    // and the ledger says so.
    let lost = "the attempt's lease is lost".to_owned();
    let expired =
        Arc::new(Ledger { lease_until: Some(std::time::Instant::now()), lapsed: Some(lost), ..Ledger::default() });
    let post = json!({ "url": upstream.url("/hello"), "method": "POST" });
    let outcome = attempt(post.clone(), expired.clone()).await;
    assert!(failure_message(&outcome).contains("HttpRequestDenied"));
    assert!(denials(&outcome)[0].ends_with("no new effects: the attempt's lease is lost"), "{:?}", denials(&outcome));
    assert_eq!(expired.begun.lock().unwrap().len(), 1);
    assert_eq!(expired.reconfirmed.load(std::sync::atomic::Ordering::SeqCst), 1);
    let ended = expired.ended.lock().unwrap().clone();
    assert_eq!(ended, vec![(1, EffectOutcome::Error("not sent: the attempt's lease is lost".into()))]);
    assert_eq!(upstream.received().len(), 2, "nothing more was sent");

    // The store confirms the lease still holds: the request leaves (a
    // pause is no failure of the guest's).
    let renewed = Arc::new(Ledger { lease_until: Some(std::time::Instant::now()), ..Ledger::default() });
    let outcome = attempt(post, renewed.clone()).await;
    assert_eq!(output_json(&outcome)["status"], 200);
    assert_eq!(renewed.reconfirmed.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(*renewed.ended.lock().unwrap(), vec![(1, EffectOutcome::Status(200))]);
    assert_eq!(upstream.received().len(), 3);
}

#[tokio::test]
async fn the_grant_says_which_methods_are_effects() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let attempt = |method: &str, safe: &[&str], ledger: Arc<Ledger>| {
        let mut http = grant(&[&upstream.url("")]);
        http.safe_methods = safe.iter().map(|m| m.to_string()).collect();
        let request = job(&json!({ "url": upstream.url("/hello"), "method": method }), http_only(http), limits());
        run_job(&sandbox, "http-get", RunRequest { effects: Some(ledger), ..request })
    };
    let ledger = Arc::new(Ledger::default());
    output_json(&attempt("POST", &["GET", "HEAD", "POST"], ledger.clone()).await);
    assert!(ledger.begun.lock().unwrap().is_empty(), "a POST marked safe is not recorded");
    output_json(&attempt("GET", &[], ledger.clone()).await);
    assert_eq!(ledger.begun.lock().unwrap().len(), 1, "with no safe method, a GET is an effect");
    assert_eq!(upstream.received().last().unwrap(), "GET /hello idempotency-key=job/1");
}

#[tokio::test]
async fn the_lease_ledger_renews_a_stale_lease_records_intents_and_closes_when_the_lease_is_lost() {
    use leash::clock::{Clock, ManualClock, Timestamp};
    use leash::store::{JobClaimParams, JobInsertParams, JobStore, LeaseReclaimParams};
    use leash::worker::lease::{LeaseKeeper, LeaseLedger, LeaseWatch};
    use std::sync::atomic::Ordering;

    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn JobStore> =
        Arc::new(leash::store::sqlite::SqliteStore::open(dir.path().join("f.db"), Default::default()).unwrap());
    let clock = ManualClock::new(Timestamp::from_unix_ms(1_800_000_000_000));
    let ttl = Duration::from_secs(30);
    let job = crate::store::conformance::cases::new_job("fenced");
    store.job_insert(JobInsertParams { jobs: vec![job], now: clock.now() }).await.unwrap();
    let claim =
        JobClaimParams { worker_id: "w1".into(), limit: 1, alone: true, lease_ttl: ttl, now: clock.now(), aged: 0 };
    let lease = store.job_claim(claim).await.unwrap().remove(0);
    let metrics = Arc::new(leash::metrics::Metrics::new());
    let keeper = LeaseKeeper {
        store: store.clone(),
        clock: Arc::new(clock.clone()),
        id: lease.job.id,
        token: lease.token.clone(),
        lease_ttl: ttl,
        metrics: metrics.clone(),
    };
    let watch = Arc::new(LeaseWatch::default());
    watch.confirmed_at_ms.store(clock.now().unix_ms(), Ordering::SeqCst);
    let stop = StopHandle::new();
    let ledger = LeaseLedger { keeper, effects: store.clone(), stop: stop.clone(), watch: watch.clone() };

    let url = "https://api.example.com/charge";
    let first = ledger.begin("POST", url, None).await.unwrap();
    assert_eq!((first.attempt, first.seq, first.idempotency_key.clone()), (1, 1, format!("{}/1", lease.job.id)));
    assert_eq!(metrics.lease_renewals.get(), 0, "a lease confirmed within a period is trusted as it is");
    let lease_left = first.lease_until.unwrap().saturating_duration_since(std::time::Instant::now());
    assert!(
        lease_left > ttl - Duration::from_secs(5) && lease_left <= ttl,
        "sent only within the lease: {lease_left:?}"
    );
    ledger.end(&first, EffectOutcome::Status(201)).await;
    clock.advance(ttl / 3);
    let second = ledger.begin("PUT", url, None).await.unwrap();
    assert_eq!((second.seq, metrics.lease_renewals.get()), (2, 1), "an older lease is renewed first");
    let recorded = store.effects(lease.job.id).await.unwrap();
    assert_eq!(recorded.len(), 2);
    assert_eq!((recorded[0].status, recorded[1].status, recorded[1].finished_at), (Some(201), None, None));

    // A ticket whose lease ran out by the local clock (a pause) is
    // confirmed again by renewing, and holds a whole lease from then.
    clock.advance(ttl / 6);
    let until = ledger.reconfirm().await.unwrap();
    assert_eq!(metrics.lease_renewals.get(), 2, "reconfirming asks the store");
    let lease_left = until.saturating_duration_since(std::time::Instant::now());
    assert!(lease_left > ttl - Duration::from_secs(5) && lease_left <= ttl, "{lease_left:?}");

    // The lease runs out and the sweeper takes the job back.
    clock.advance(ttl * 2);
    let reclaimed = store.lease_reclaim_expired(LeaseReclaimParams { now: clock.now(), queue_ttl: ttl }).await.unwrap();
    assert_eq!(reclaimed.requeued + reclaimed.failed, 1);
    let lost = "the attempt's lease is lost".to_owned();
    assert_eq!(ledger.reconfirm().await, Err(lost.clone()), "a paused attempt whose job was taken back sends nothing");
    assert!(watch.lost.load(Ordering::SeqCst) && stop.is_forced(), "the keeper saw it lost and stopped the guest");
    assert_eq!(ledger.begin("POST", url, None).await, Err(lost));
    assert_eq!(store.effects(lease.job.id).await.unwrap().len(), 2, "nothing more was recorded");

    let stopping = LeaseLedger {
        keeper: ledger.keeper.clone(),
        effects: store.clone(),
        stop: StopHandle::new(),
        watch: Arc::new(LeaseWatch::default()),
    };
    stopping.stop.request();
    assert!(stopping.begin("POST", url, None).await.unwrap_err().contains("stopping"));
}

#[tokio::test]
async fn wasi_config_shows_the_granted_keys_and_no_others() {
    let sandbox = support::sandbox();
    let input = json!({ "keys": ["region", "HOME", "PATH", "mode"] });
    let run_with = |config: &[(&str, &str)]| {
        let config = config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        run_job(&sandbox, "config-read", job(&input, Grants { config, ..Grants::default() }, limits()))
    };
    let output = output_json(&run_with(&[("region", "eu-west"), ("mode", "")]).await);
    assert_eq!(output["get"], json!({ "region": "eu-west", "HOME": null, "PATH": null, "mode": "" }));
    assert_eq!(output["all"], json!({ "region": "eu-west", "mode": "" }), "exactly the granted keys");
    let output = output_json(&run_with(&[]).await);
    assert_eq!(output["all"], json!({}), "nothing granted, nothing seen");
}

#[tokio::test]
async fn webhook_deliveries_carry_the_secret_and_one_idempotency_key_each() {
    let sandbox = sandbox_with_secret("hook-s3cret");
    let upstream = Upstream::start().await;
    let mut http = grant(&[&format!("POST {}", upstream.url(""))]);
    http.bind_secret("TOKEN".parse().unwrap(), upstream.url("").parse().unwrap());
    let input = json!({ "url": upstream.url("/hello"), "event": { "kind": "deploy" }, "count": 3, "secret": "TOKEN" });
    let ledger = Arc::new(Ledger::default());
    let request = RunRequest { effects: Some(ledger.clone()), ..job(&input, http_only(http), limits()) };
    let outcome = run_job(&sandbox, "webhook", request).await;
    assert_eq!(output_json(&outcome), json!({ "delivered": 3, "statuses": [200, 200, 200] }));
    let expected: Vec<String> =
        (1..=3).map(|n| format!("POST /hello authorization=Bearer hook-s3cret idempotency-key=job/{n}")).collect();
    assert_eq!(upstream.received(), expected);
    assert_eq!(ledger.ended.lock().unwrap().len(), 3, "each delivery's outcome is recorded");
}

#[tokio::test]
async fn a_request_body_past_the_limit_fails_the_request() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let mut grant = grant(&[&upstream.url("")]);
    grant.limits.request_bytes = 1024;
    let big = json!({ "url": upstream.url("/hello"), "method": "PUT", "body": "x".repeat(64 << 10) });
    let outcome = run(&sandbox, "http-get", big, grant.clone(), limits()).await;
    assert!(failure_message(&outcome).contains("HttpRequestBodySize"), "{:?}", outcome.result);
    let small = json!({ "url": upstream.url("/hello"), "method": "PUT", "body": "x".repeat(1024) });
    let outcome = run(&sandbox, "http-get", small, grant, limits()).await;
    assert_eq!(output_json(&outcome)["status"], 200, "at the limit, the body goes through");
}

#[tokio::test]
async fn the_upstream_host_header_is_the_checked_authority_without_user_info() {
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let port = upstream.addr.port();
    let granted = grant(&[&format!("GET http://127.0.0.1:{port}")]);
    let forged = format!("http://evil.example:hunter2@127.0.0.1:{port}/echo-host");
    let outcome = run(&sandbox, "http-get", json!({ "url": forged }), granted, limits()).await;
    let output = output_json(&outcome);
    assert_eq!(output["body_start"], format!("127.0.0.1:{port}"), "{output}");
}

#[tokio::test]
async fn a_wildcard_rule_never_reaches_an_address_literal() {
    use leash::job::grant::{HostPattern, HostRule, HttpScheme};
    let sandbox = support::sandbox();
    let upstream = Upstream::start().await;
    let port = upstream.addr.port();
    // Rules that no longer parse, built by hand as an old store might hold them.
    for parent in ["0.0.1", "1"] {
        let rule =
            HostRule { methods: vec![], scheme: HttpScheme::Http, host: HostPattern::Subdomains(parent.into()), port };
        let granted = HttpGrant { hosts: vec![rule], ..HttpGrant::default() };
        let outcome = run(&sandbox, "http-get", json!({ "url": upstream.url("/hello") }), granted, limits()).await;
        assert!(failure_message(&outcome).contains("HttpRequestDenied"), "*.{parent}: {:?}", outcome.result);
    }
    assert!(upstream.received().is_empty(), "nothing reached loopback through a wildcard");
}

#[tokio::test]
async fn a_stopping_attempts_effects_are_refused_before_connecting_and_count_against_the_limit() {
    let sandbox = support::sandbox();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = tokio::spawn({
        let accepted = accepted.clone();
        async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(stream);
            }
        }
    });
    let url = format!("http://127.0.0.1:{port}/hook");
    let mut granted = grant(&[&format!("http://127.0.0.1:{port}")]);
    granted.limits = HttpLimits { requests: 10, ..HttpLimits::default() };
    let input = json!({ "flood": { "url": url, "count": 1000, "method": "POST" } });
    let stopping = Arc::new(Ledger { stopping: Some("the attempt is stopping".into()), ..Ledger::default() });
    let request = RunRequest { effects: Some(stopping.clone()), ..job(&input, http_only(granted), limits()) };
    let outcome = run_job(&sandbox, "http-escape", request).await;
    let output = output_json(&outcome);
    assert_eq!(output["flood"]["errors"]["HttpRequestDenied"], 1000, "{output}");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0, "no connection was opened");
    assert!(stopping.begun.lock().unwrap().is_empty());
    assert_eq!((outcome.usage.http_requests, outcome.usage.http_denied), (0, 1000));
    let logged = denials(&outcome);
    assert_eq!(logged.iter().filter(|l| l.ends_with("no new effects: the attempt is stopping")).count(), 10);
    assert_eq!(logged.iter().filter(|l| l.contains("limit of 10 requests")).count(), 1, "{logged:#?}");
    counting.abort();
}

#[tokio::test]
async fn a_guest_visible_error_carries_no_host_backtrace() {
    let upstream = Upstream::start().await;
    let port = upstream.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    std::fs::write(&input, json!({ "url": upstream.url("/slow-body") }).to_string()).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_leash"));
    command
        .env("LEASH_CACHE_DIR", support::cache_dir())
        .env("RUST_BACKTRACE", "full")
        .env("RUST_LIB_BACKTRACE", "1")
        .args(["run", &leash_tests::plugin_path("http-get").display().to_string()])
        .args(["--allow-host", &format!("GET http://127.0.0.1:{port}"), "--http-timeout", "300ms"])
        .arg("--input")
        .arg(&input);
    let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().expect("leash runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(0), "the body read fails: {stderr}");
    // The read ends by the request's time limit or by the connection
    // closing at it, whichever the host sees first: either way the
    // guest's error text is reported, one line.
    let reported = stderr.lines().find(|l| l.starts_with("leash: failed (guest_error): Failed: GET "));
    assert!(reported.is_some_and(|l| l.contains("/slow-body: ")), "the guest's error is reported: {stderr}");
    assert!(stderr.len() < 4096, "{} bytes on stderr: {stderr}", stderr.len());
    for internal in ["backtrace", ".rs:", "tokio::", "wasmtime"] {
        assert!(!stderr.contains(internal), "{internal:?} reached the guest: {stderr}");
    }
}

/// A value with the characters JSON and URLs escape.
const AWKWARD: &str = "s3\"cr\\et-t0ken-value-long";

/// `TOKEN` bound to the upstream, the sandbox holding [`AWKWARD`].
fn bound_to(upstream: &Upstream) -> HttpGrant {
    let mut bound = grant(&[&upstream.url("")]);
    bound.bind_secret("TOKEN".parse().unwrap(), upstream.url("").parse().unwrap());
    bound
}

fn assert_no_part_of_the_value(what: &str, text: &str) {
    for part in ["s3\"cr", "s3\\\"cr", "s3%22", "t0ken", "value-long"] {
        assert!(!text.contains(part), "{what} holds {part:?}: {text:?}");
    }
}

#[tokio::test]
async fn a_secret_passed_on_in_json_is_cut_in_its_escaped_form() {
    let sandbox = sandbox_with_secret(AWKWARD);
    let upstream = Upstream::start().await;
    let input = json!({ "url": upstream.url("/echo-auth"), "headers": { "authorization": "Bearer {secret:TOKEN}" } });
    let outcome = run(&sandbox, "http-get", input, bound_to(&upstream), limits()).await;
    assert_eq!(upstream.received(), vec![format!("GET /echo-auth authorization=Bearer {AWKWARD}")]);
    let output = outcome.result.as_ref().expect("the job succeeds");
    assert_no_part_of_the_value("the output", &String::from_utf8_lossy(output));
    assert_eq!(output_json(&outcome)["body_start"], "Bearer {secret:TOKEN}");
}

#[tokio::test]
async fn a_secret_straddling_a_cut_is_cleaned_before_it_is_cut() {
    let sandbox = sandbox_with_secret(AWKWARD);
    let upstream = Upstream::start().await;
    // The value starts a few bytes before the capture's cut (8,180 bytes)
    // and the failure message's (8 KiB less its mark).
    let input = json!({
        "url": upstream.url("/echo-auth"),
        "headers": { "authorization": "Bearer {secret:TOKEN}" },
        "echo_at": 8165,
    });
    let capture = RunLimits { capture_bytes: 8180, ..limits() };
    let outcome = run(&sandbox, "http-get", input, bound_to(&upstream), capture).await;
    let message = failure_message(&outcome);
    assert!(message.ends_with("Bearer {secret:T…"), "{}", &message[message.len() - 40..]);
    assert_no_part_of_the_value("the failure message", message);
    for (what, captured) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
        assert_eq!(captured.bytes.len(), 8180, "{what} was cut at its cap");
        assert_eq!(captured.dropped, 6, "{what} counts what it cut of the cleaned text");
        let text = String::from_utf8_lossy(&captured.bytes);
        assert!(text.ends_with("Bearer {secret:"), "{what}: {}", &text[text.len() - 40..]);
        assert_no_part_of_the_value(what, &text);
    }
}

#[tokio::test]
async fn a_secret_the_guest_puts_in_an_effects_url_is_recorded_by_its_reference() {
    let sandbox = sandbox_with_secret(AWKWARD);
    let upstream = Upstream::start().await;
    let input = json!({
        "url": upstream.url("/echo-auth"),
        "headers": { "authorization": "Bearer {secret:TOKEN}" },
        "post_body_to": upstream.url("/p/"),
    });
    let ledger = Arc::new(Ledger::default());
    let request = RunRequest { effects: Some(ledger.clone()), ..job(&input, http_only(bound_to(&upstream)), limits()) };
    let outcome = run_job(&sandbox, "http-get", request).await;
    assert_eq!(output_json(&outcome)["posted"], 404, "the POST was sent");
    let begun = ledger.begun.lock().unwrap().clone();
    assert_eq!(begun.len(), 1);
    assert_eq!(begun[0].1, upstream.url("/p/Bearer%20{secret:TOKEN}"), "{begun:?}");
    assert_no_part_of_the_value("the effect's URL", &begun[0].1);
    assert!(upstream.received()[1].contains("t0ken"), "the upstream got what the guest sent");
}
