//! Rate limits on outbound requests, through a real pool and a loopback
//! upstream of the test's own: requests carrying a limited secret, from
//! two jobs at once, leave no faster than the limit; a request whose slot
//! is past its job's deadline ends the attempt `rate_limited`, retryable
//! from that slot, having sent nothing more.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leash::clock::Timestamp;
use leash::job::grant::HttpGrant;
use leash::job::{ErrorKind, Grants, JobStatus, PluginName, Target};
use leash::runtime::{EgressRules, PluginSource, Runtime, Submit};
use leash::sandbox::SandboxConfig;
use leash::sandbox::http::SecretStore;

use crate::support::{self, GENEROUS};

/// An upstream that answers every POST to `/hook` with 200 and keeps when
/// each arrived (ms since the epoch).
async fn hook_upstream() -> (String, Arc<Mutex<Vec<i64>>>) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = arrivals.clone();
    let hook = axum::routing::post(async move |_body: axum::body::Bytes| {
        seen.lock().unwrap().push(Timestamp::now().unix_ms());
        axum::http::StatusCode::OK
    });
    tokio::spawn(async move { axum::serve(listener, axum::Router::new().route("/hook", hook)).await.unwrap() });
    (base, arrivals)
}

/// A pool of two workers on a fresh SQLite store, whose operator has set
/// `TOKEN`, with `webhook` registered and granted POST to `base`, the
/// secret bound to it.
async fn pool(dir: &tempfile::TempDir, base: &str) -> Runtime {
    let secrets = SecretStore::from_pairs([("TOKEN".to_owned(), "t0ken".to_owned())]).unwrap();
    let runtime = Runtime::builder(dir.path().join("jobs.db").to_string_lossy().into_owned())
        .sandbox(SandboxConfig {
            cache_dir: Some(support::cache_dir()),
            secrets: Arc::new(secrets),
            ..Default::default()
        })
        .max_workers(2)
        .build()
        .await
        .unwrap();
    let name = PluginName::new("webhook", "1").unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("webhook"), name.clone()).await.unwrap();
    let rule: leash::job::grant::HostRule = format!("POST {base}").parse().unwrap();
    let mut http = HttpGrant { hosts: vec![rule.clone()], ..HttpGrant::default() };
    http.bind_secret("TOKEN".parse().unwrap(), rule);
    runtime.plugin_grant(name, Grants { http, ..Grants::default() }).await.unwrap();
    runtime
}

/// A job delivering `count` events to `base`, with 30 s to do it.
fn deliveries(base: &str, count: u32) -> Submit {
    let input = serde_json::json!({ "url": format!("{base}/hook"), "count": count, "secret": "TOKEN" });
    let mut submit =
        Submit::new(PluginSource::Ref("webhook@1".parse().unwrap()), Target::Execute, input.to_string().into_bytes());
    submit.timeout = Some(Duration::from_secs(30));
    submit
}

/// Two jobs of three deliveries each, run at once, all carrying `TOKEN`
/// under a limit of 5/s on it: the six requests hold six slots 200 ms
/// apart, so the last leaves at least a second after the first job
/// started (unlimited, they take a few milliseconds), and the job's log
/// says it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carrying_a_limited_secret_leave_no_faster_than_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (base, arrivals) = hook_upstream().await;
    let runtime = pool(&dir, &base).await;
    let rules = EgressRules { hosts: Vec::new(), secrets: vec!["TOKEN".parse().unwrap()] };
    let limit = runtime.rate_limit_set("upstream", "5/s".parse().unwrap(), None, rules).await.unwrap();
    assert_eq!(limit.secrets.len(), 1);
    let ids =
        [runtime.submit(deliveries(&base, 3)).await.unwrap(), runtime.submit(deliveries(&base, 3)).await.unwrap()];
    let mut first_start = i64::MAX;
    let mut waited = false;
    for id in ids {
        let done = runtime.wait(id, GENEROUS).await.unwrap();
        assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
        first_start = first_start.min(done.started_at.unwrap().unix_ms());
        waited |= runtime
            .logs(id)
            .await
            .unwrap()
            .records
            .iter()
            .any(|r| r.message.contains("slot under rate limit upstream"));
    }
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 6);
    let last = arrivals.iter().max().unwrap();
    // Six slots at 5/s: the sixth is 5 × 200 ms after the first, which
    // came no earlier than the first start.
    assert!(
        last - first_start >= 1000,
        "six requests within {} ms of the first start: {arrivals:?}",
        last - first_start
    );
    assert!(waited, "a job's log says it waited for its slot");
    runtime.shutdown().await;
}

/// A limit of 1/h on the upstream's host rule: a job's first delivery
/// leaves, its second's slot is an hour away, past its deadline (30 s
/// away), so the
/// attempt ends there as `rate_limited`, the second never sent. With an
/// attempt left, the job is queued again from the slot, not after its
/// short backoff; with none, it fails and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_slot_is_past_the_deadline_ends_the_attempt_retryable_from_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let (base, arrivals) = hook_upstream().await;
    let runtime = pool(&dir, &base).await;
    let rules = EgressRules { hosts: vec![base.parse().unwrap()], secrets: Vec::new() };
    runtime.rate_limit_set("hourly", "1/h".parse().unwrap(), None, rules).await.unwrap();

    let mut once = deliveries(&base, 2);
    once.max_attempts = Some(1);
    let id = runtime.submit(once).await.unwrap();
    let done = runtime.wait(id, GENEROUS).await.unwrap();
    assert_eq!((done.status, done.error_kind), (JobStatus::Failed, Some(ErrorKind::RateLimited)), "{done:?}");
    let message = done.error_message.clone().unwrap_or_default();
    assert!(message.contains("rate limit hourly") && message.contains("after the job's deadline"), "{message}");
    assert!(message.contains("max_attempts is 1"), "{message}");
    assert_eq!(arrivals.lock().unwrap().len(), 1, "the second delivery was not sent");

    let mut twice = deliveries(&base, 1);
    twice.max_attempts = Some(2);
    twice.backoff = Some(leash::job::Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(10) });
    let submitted = Timestamp::now();
    let id = runtime.submit(twice).await.unwrap();
    let queued = support::eventually("the attempt ends and the job is queued again", async || {
        let job = runtime.get(id).await.unwrap();
        (job.retries == 1).then_some(job)
    })
    .await;
    assert_eq!(queued.status, JobStatus::Queued, "{queued:?}");
    assert!(
        queued.run_after >= submitted.plus(Duration::from_secs(3590)),
        "queued again from its slot an hour away, not after its 10 ms backoff: {queued:?}"
    );
    assert_eq!(arrivals.lock().unwrap().len(), 1, "nothing more was sent");
    runtime.shutdown().await;
}
