//! Effect benchmark: what the lease fence and the effect ledger add to one
//! effectful request, measured in one process and interleaved so machine
//! noise hits every series alike.
//!
//! Run with `cargo bench -p leash --bench effects` (`-- --quick` for fewer
//! requests).
//!
//! One `POST` to an upstream on loopback that answers `200` at once, a new
//! connection each time (as a guest's request always opens one):
//!
//! 1. The host makes it directly (hyper, no sandbox).
//! 2. The `webhook` guest makes it, granted, with the ledger off (`leash
//!    run`'s shape): sandbox + `wasi:http` + the grant check.
//! 3. The same guest with the ledger on, as a durable job runs it: the
//!    lease fence, the intent committed to SQLite before the request, the
//!    outcome after.
//! 4. As 3, under a rate limit on the upstream's host rule that never
//!    holds a request back (1,000,000/s, burst 100,000): what reserving
//!    each request's slot in the store adds.
//!
//! Then throughput: 8 guests at once, ledger off and on, and the store's
//! own rate of intent + outcome pairs, and of rate slots reserved, from 32
//! tasks (slots on PostgreSQL too with `LEASH_BENCH_POSTGRES` set to a
//! server URL).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use leash::clock::{Clock, SystemClock};
use leash::job::grant::HttpGrant;
use leash::job::rate::RateLimit;
use leash::job::{EffectOutcome, Grants, Target};
use leash::sandbox::http::{EffectLedger, EgressLimits};
use leash::sandbox::{NoObserver, Plugin, RunLimits, RunRequest, Sandbox, StopHandle};
use leash::store::sqlite::SqliteStore;
use leash::store::{EffectBeginParams, EffectEndParams, JobClaimParams, JobInsertParams, JobStore, RateReserveParams};
use leash::worker::egress::StoreEgress;
use leash::worker::lease::{LeaseKeeper, LeaseLedger, LeaseWatch};

#[path = "support/mod.rs"]
mod support;
use support::{percentile, raw_job, us};

const TTL: Duration = Duration::from_secs(3600);

/// A claimed job in a fresh SQLite store, and a ledger holding its lease.
async fn ledger(store: Arc<dyn JobStore>, input: &str) -> Arc<LeaseLedger> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let job = leash::job::NewJob {
        input: input.as_bytes().to_vec(),
        queue_ttl: TTL,
        ..raw_job(leash::job::Digest::of(b"webhook"))
    };
    store.job_insert(JobInsertParams { jobs: vec![job], now: clock.now() }).await.unwrap();
    let claim =
        JobClaimParams { worker_id: "bench".into(), limit: 1, alone: false, lease_ttl: TTL, now: clock.now(), aged: 0 };
    let lease = store.job_claim(claim).await.unwrap().remove(0);
    let keeper = LeaseKeeper {
        store: store.clone(),
        clock: clock.clone(),
        id: lease.job.id,
        token: lease.token,
        lease_ttl: TTL,
        metrics: Arc::new(leash::metrics::Metrics::new()),
    };
    let watch = Arc::new(LeaseWatch::default());
    watch.confirmed_at_ms.store(clock.now().unix_ms(), Ordering::SeqCst);
    Arc::new(LeaseLedger { keeper, effects: store, stop: StopHandle::new(), watch })
}

/// The guest's POST, with the ledger and egress limits given.
async fn guest_post(
    sandbox: &Sandbox,
    plugin: &Plugin,
    input: &[u8],
    grants: &Arc<Grants>,
    effects: Option<Arc<dyn EffectLedger>>,
    egress: Option<Arc<dyn EgressLimits>>,
) -> Duration {
    let request_had_ledger = effects.is_some();
    let request = RunRequest {
        grants: grants.clone(),
        effects,
        egress,
        ..RunRequest::new(Target::Execute, input.to_vec(), RunLimits::default())
    };
    let start = Instant::now();
    let outcome = sandbox.run(plugin, request, &StopHandle::new(), Arc::new(NoObserver)).await;
    let elapsed = start.elapsed();
    assert!(outcome.result.is_ok(), "ledger on: {request_had_ledger}: {:?}", outcome.result.err());
    elapsed
}

/// The host's own POST: a new connection, the request, the answer.
async fn host_post(addr: std::net::SocketAddr, body: &'static str) -> Duration {
    let start = Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let request = http::Request::post("/hook")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    start.elapsed()
}

fn row(name: &str, samples: &mut [Duration], base: f64) -> f64 {
    samples.sort();
    let p50 = us(percentile(samples, 0.5));
    println!("{name:<56} {p50:>9.0} {:>9.0} {:>7.2}×", us(percentile(samples, 0.99)), p50 / base);
    p50
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 300 } else { 2000 };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // A receiver reads the delivery, then answers.
    let app =
        axum::Router::new().route("/hook", axum::routing::post(|body: Bytes| async move { body.len().to_string() }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let base = format!("http://{addr}");
    let input = serde_json::json!({ "url": format!("{base}/hook"), "event": { "n": 1 } }).to_string();
    let body = r#"{"delivery":1,"job":"","attempt":1,"event":{"n":1}}"#;

    let sandbox = Sandbox::new(support::sandbox_config(16)).unwrap();
    let plugin = sandbox.load(&leash_tests::plugin_bytes("webhook")).unwrap();
    let grants = Arc::new(Grants {
        http: HttpGrant { hosts: vec![format!("POST {base}").parse().unwrap()], ..HttpGrant::default() },
        ..Grants::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn JobStore> =
        Arc::new(SqliteStore::open(dir.path().join("effects.db"), Default::default()).unwrap());
    let fenced = ledger(store.clone(), &input).await;
    let never_holds_back = RateLimit::new("bench", "1000000/s".parse().unwrap(), 100_000, None, SystemClock.now())
        .unwrap()
        .with_egress(vec![base.parse().unwrap()], Vec::new())
        .unwrap();
    store.rate_limit_set(never_holds_back.clone()).await.unwrap();
    let metrics = Arc::new(leash::metrics::Metrics::new());
    let egress: Arc<dyn EgressLimits> = Arc::new(StoreEgress::new(store.clone(), Arc::new(SystemClock), metrics));
    let limited =
        || guest_post(&sandbox, &plugin, input.as_bytes(), &grants, Some(fenced.clone()), Some(egress.clone()));

    for _ in 0..50 {
        host_post(addr, body).await;
        guest_post(&sandbox, &plugin, input.as_bytes(), &grants, None, None).await;
        guest_post(&sandbox, &plugin, input.as_bytes(), &grants, Some(fenced.clone()), None).await;
        limited().await;
    }
    let (mut direct, mut off, mut on, mut paced) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        direct.push(host_post(addr, body).await);
        off.push(guest_post(&sandbox, &plugin, input.as_bytes(), &grants, None, None).await);
        on.push(guest_post(&sandbox, &plugin, input.as_bytes(), &grants, Some(fenced.clone()), None).await);
        paced.push(limited().await);
    }
    println!("one effectful POST on loopback, {rounds} each, interleaved (µs)");
    println!("{:<56} {:>9} {:>9} {:>8}", "", "p50", "p99", "vs host");
    direct.sort();
    let base_p50 = us(percentile(&direct, 0.5));
    row("the host, directly (hyper)", &mut direct, base_p50);
    let off_p50 = row("the webhook guest, ledger off", &mut off, base_p50);
    let on_p50 = row("the webhook guest, ledger on (fence + intent + outcome)", &mut on, base_p50);
    let paced_p50 = row("the webhook guest, ledger on, under an egress limit", &mut paced, base_p50);
    println!(
        "ledger cost per effect: {:.0} µs at p50 ({:.2}× the guest without it)",
        on_p50 - off_p50,
        on_p50 / off_p50
    );
    println!(
        "egress limit cost per request: {:.0} µs at p50 ({:.2}× the guest with the ledger alone)",
        paced_p50 - on_p50,
        paced_p50 / on_p50
    );

    // Throughput: 8 guests at once.
    let n = if quick { 400 } else { 2000 };
    let mut rates = Vec::new();
    for with_ledger in [false, true, false, true] {
        let sandbox = &sandbox;
        let start = Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let tasks = (0..8).map(|_| async {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let effects: Option<Arc<dyn EffectLedger>> = if with_ledger { Some(fenced.clone()) } else { None };
                guest_post(sandbox, &plugin, input.as_bytes(), &grants, effects, None).await;
            }
        });
        futures_util::future::join_all(tasks).await;
        rates.push((with_ledger, n as f64 / start.elapsed().as_secs_f64()));
    }
    let mean = |on: bool| {
        let picked: Vec<f64> = rates.iter().filter(|(l, _)| *l == on).map(|(_, r)| *r).collect();
        picked.iter().sum::<f64>() / picked.len() as f64
    };
    let (rate_off, rate_on) = (mean(false), mean(true));
    println!(
        "8 guests at once: {rate_off:.0} effects/s ledger off, {rate_on:.0} ledger on ({:.2}×)",
        rate_on / rate_off
    );

    // The store alone: intent + outcome pairs from 32 tasks.
    let pairs = if quick { 2000 } else { 10_000 };
    let start = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let tasks = (0..32).map(|_| async {
        while next.fetch_add(1, Ordering::Relaxed) < pairs {
            let params = EffectBeginParams {
                id: fenced.keeper.id,
                token: fenced.keeper.token.clone(),
                method: "POST".into(),
                url: format!("{base}/hook"),
                proposal: None,
                now: SystemClock.now(),
            };
            let effect = store.effect_begin(params).await.unwrap().unwrap();
            let params = EffectEndParams {
                id: fenced.keeper.id,
                attempt: effect.attempt,
                seq: effect.seq,
                outcome: EffectOutcome::Status(200),
                now: SystemClock.now(),
            };
            store.effect_end(params).await.unwrap();
        }
    });
    futures_util::future::join_all(tasks).await;
    println!(
        "the store alone: {:.0} intent + outcome pairs/s from 32 tasks",
        pairs as f64 / start.elapsed().as_secs_f64()
    );
    println!("SQLite: {:.0} rate slots reserved/s from 32 tasks", reservations(&*store, pairs).await);
    let postgres = std::env::var("LEASH_BENCH_POSTGRES").or_else(|_| std::env::var("LEASH_TEST_POSTGRES"));
    if let Ok(base) = postgres {
        let name = format!("leash_bench_effects_{}", std::process::id());
        let (admin, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        admin.batch_execute(&format!("CREATE SCHEMA {name}")).await.unwrap();
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-csearch_path%3D{name}");
        let pg: Arc<dyn JobStore> = Arc::new(leash::store::postgres::PostgresStore::open(&url).await.unwrap());
        pg.rate_limit_set(never_holds_back).await.unwrap();
        println!("PostgreSQL: {:.0} rate slots reserved/s from 32 tasks", reservations(&*pg, pairs).await);
        drop(pg);
        admin.batch_execute(&format!("DROP SCHEMA {name} CASCADE")).await.unwrap();
    }
}

/// Reserve `n` requests' slots in one bucket from 32 tasks; slots per
/// second.
async fn reservations(store: &dyn JobStore, n: usize) -> f64 {
    let start = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let tasks = (0..32).map(|_| async {
        while next.fetch_add(1, Ordering::Relaxed) < n {
            let now = SystemClock.now();
            let buckets = vec![("bench".to_owned(), leash::job::rate::HOSTS_BUCKET.to_owned())];
            store.rate_reserve(RateReserveParams { buckets, now, latest: now }).await.unwrap();
        }
    });
    futures_util::future::join_all(tasks).await;
    n as f64 / start.elapsed().as_secs_f64()
}
