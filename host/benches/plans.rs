//! Plans benchmark: what proposing and checking effects costs a plan.
//!
//! Run with `cargo bench -p leash --bench plans` (`-- --quick` for one
//! round).
//!
//! The `plan-probe` guest makes N `PUT`s (small JSON bodies) to an upstream
//! on loopback that answers `204` at once, in a durable runtime on SQLite,
//! two ways, interleaved so machine noise hits both alike:
//!
//! 1. **Direct**: one plain job that sends the N writes itself (no plan,
//!    no proposals): submit to succeeded.
//! 2. **Plan**: a plan (`auto`) whose execute phase proposes the N writes
//!    (each checked against the grant, all stored with its success) and
//!    whose apply phase sends them with `plan::send_approved` (each matched
//!    to its proposal, body digest and all): submit to applied.
//!
//! The plan's extra time over the direct job is all of what plans add —
//! proposing, checking, storing, reading back, matching, and the second
//! job — and is printed as a share of the plan's run time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leash::job::grant::HttpGrant;
use leash::job::{ApplyMode, Grants, JobStatus, PlanStatus, PluginName, PluginRef, Target};
use leash::runtime::{PlanSubmit, PluginSource, Runtime, Submit};

#[path = "support/mod.rs"]
mod support;
use support::{median, ms};

const WRITES: usize = 1000;

async fn upstream(received: Arc<AtomicU64>) -> std::net::SocketAddr {
    let app = axum::Router::new().fallback(move || {
        received.fetch_add(1, Ordering::Relaxed);
        async { axum::http::StatusCode::NO_CONTENT }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn input(addr: std::net::SocketAddr, execute: &str) -> Vec<u8> {
    let writes: Vec<serde_json::Value> = (0..WRITES)
        .map(|i| {
            serde_json::json!({ "method": "PUT", "url": format!("http://{addr}/records/{i}"),
                                "body": format!("{{\"key\":{i},\"value\":\"v{i}\"}}") })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({ "writes": writes, "execute": execute })).unwrap()
}

fn probe() -> PluginSource {
    PluginSource::Ref(PluginRef::Version(PluginName::new("plan-probe", "1").unwrap()))
}

async fn direct(runtime: &Runtime, input: &[u8]) -> Duration {
    let started = Instant::now();
    let job = runtime.submit(Submit::new(probe(), Target::Execute, input.to_vec())).await.unwrap();
    let done = runtime.wait(job, Duration::from_secs(300)).await.unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{:?}", done.error_message);
    started.elapsed()
}

/// Plan phases finished in this process: (plan id, status).
type Finished = tokio::sync::mpsc::UnboundedReceiver<(String, JobStatus)>;

async fn plan(runtime: &Runtime, input: &[u8], finished: &mut Finished) -> Duration {
    let started = Instant::now();
    let submit = Submit::new(probe(), Target::Execute, input.to_vec());
    let created = runtime.plan_submit(PlanSubmit { job: submit, apply: ApplyMode::Auto }).await.unwrap();
    let id = created.view.plan.plan_id;
    // Its execute phase, then its apply phase, finish.
    for phase in ["execute", "apply"] {
        let (plan_id, status) = finished.recv().await.unwrap();
        assert_eq!((plan_id.as_str(), status), (id.as_str(), JobStatus::Succeeded), "{phase}");
    }
    let elapsed = started.elapsed();
    assert_eq!(runtime.plan(&id).await.unwrap().status, PlanStatus::Applied);
    elapsed
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 1 } else { 5 };
    let dir = tempfile::tempdir().unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let addr = upstream(received.clone()).await;
    let (tx, mut finished) = tokio::sync::mpsc::unbounded_channel();
    let runtime = Runtime::builder(dir.path().join("plans.db"))
        .sandbox(support::sandbox_config(2))
        .max_workers(2)
        .poll_interval(Duration::from_millis(5))
        .on_complete(move |c| {
            if let Some(plan) = &c.plan_id {
                let _ = tx.send((plan.clone(), c.status));
            }
        })
        .build()
        .await
        .unwrap();
    let name = PluginName::new("plan-probe", "1").unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("plan-probe"), name.clone()).await.unwrap();
    let mut http = HttpGrant { hosts: vec![format!("PUT http://{addr}").parse().unwrap()], ..HttpGrant::default() };
    http.limits.requests = WRITES as u32;
    runtime.plugin_grant(name, Grants { http, ..Grants::default() }).await.unwrap();

    let (send, propose) = (input(addr, "send"), input(addr, "propose"));
    // One of each first: the compile and the first connections.
    direct(&runtime, &send).await;
    plan(&runtime, &propose, &mut finished).await;
    let (mut directs, mut plans) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        directs.push(direct(&runtime, &send).await);
        plans.push(plan(&runtime, &propose, &mut finished).await);
    }
    assert_eq!(received.load(Ordering::Relaxed), (2 + 2 * rounds as u64) * WRITES as u64, "every write arrived once");
    let (d, p) = (ms(median(directs)), ms(median(plans)));
    println!("{WRITES} PUTs to a loopback upstream, median of {rounds} rounds, SQLite, 2 slots");
    println!("  direct (one plain job sends them)              {d:>9.1} ms");
    println!("  plan (execute proposes, apply sends approved)  {p:>9.1} ms");
    println!("  what plans add: {:.1} ms, {:.1}% of the plan's run time", p - d, 100.0 * (p - d) / p);
    runtime.shutdown().await;
}
