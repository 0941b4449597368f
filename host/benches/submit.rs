//! Submit-rate benchmark: async job submits over HTTP from a load generator
//! on loopback (`wrk`, 64 connections), beside the same submits through the
//! embedding API, in one process, alternating.
//!
//! Run with `cargo bench -p leash --bench submit` (`-- --quick`: 2 s
//! phases, 2 rounds). Needs `wrk` (`apt-get install wrk`); without it
//! only the in-process rates are printed.
//!
//! The runtime runs no workers (submits only) on SQLite `normal`, the
//! server is `leash::api::router` on two tokio threads; every job names
//! `echo@1.0.0` with a small JSON input. Phases, each pair in process
//! first in even rounds and HTTP first in odd ones:
//!
//! 1. in process, single: 64 tasks each calling `Runtime::submit`.
//! 2. HTTP, single: `POST /v1/jobs` with `"execution": "async"`.
//! 3. in process, batch: 64 tasks each calling `Runtime::submit_many` with
//!    1,000 jobs.
//! 4. HTTP, batch: `POST /v1/jobs:batch` with 1,000 jobs.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use leash::api::{ApiConfig, router};
use leash::job::{PluginName, PluginRef, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::store::Durability;

#[path = "support/mod.rs"]
mod support;

const TOKEN: &str = "bench-token";
/// Connections (and in-process tasks) for single-job submits.
const CONNECTIONS: usize = 64;
/// Connections (and tasks) for batches: 8 batches of 1,000 in flight keep
/// the writer busy; 64 would queue each request for seconds.
const BATCH_CONNECTIONS: usize = 8;
const BATCH: usize = 1000;
/// The principal the in-process submits name, as HTTP's do.
const AS: Option<&str> = Some(leash::access::BOOTSTRAP);

/// A job of `name`, submitted as principal `by` (audited, as every HTTP
/// submit is: the server's token is the bootstrap `admin`), or as the
/// embedder itself (`None`: not audited).
fn job(name: &PluginName, by: Option<&str>) -> Submit {
    let mut job =
        Submit::new(PluginSource::Ref(PluginRef::Version(name.clone())), Target::Execute, br#"{"n":1}"#.to_vec());
    job.submitted_by = by.map(str::to_owned);
    job
}

/// Jobs per second from `tasks` tasks submitting `per_call` jobs a call
/// for `phase`.
async fn in_process(
    runtime: &Runtime,
    name: &PluginName,
    by: Option<&'static str>,
    (tasks, per_call): (usize, usize),
    phase: Duration,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let mut running = tokio::task::JoinSet::new();
    let start = Instant::now();
    for _ in 0..tasks {
        let (runtime, name, stop, done) = (runtime.clone(), name.clone(), stop.clone(), done.clone());
        running.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if per_call == 1 {
                    runtime.submit(job(&name, by)).await.unwrap();
                } else {
                    runtime.submit_many((0..per_call).map(|_| job(&name, by)).collect()).await.unwrap();
                }
                done.fetch_add(per_call, Ordering::Relaxed);
            }
        });
    }
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    while running.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Requests per second `wrk` reports for `body` posted to `url` over
/// `connections`; panics if any answer was not a 2xx.
fn wrk(url: &str, body: &str, connections: usize, phase: Duration, dir: &std::path::Path) -> f64 {
    let script = dir.join("post.lua");
    let lua = format!(
        "wrk.method = \"POST\"\nwrk.body = [==[{body}]==]\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
         wrk.headers[\"Authorization\"] = \"Bearer {TOKEN}\"\n"
    );
    std::fs::write(&script, lua).unwrap();
    let output = Command::new("wrk")
        .args(["-t1", &format!("-c{connections}"), &format!("-d{}s", phase.as_secs()), "-s"])
        .arg(&script)
        .arg(url)
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!text.contains("Non-2xx"), "some answers were errors:\n{text}");
    let line = text.lines().find(|l| l.starts_with("Requests/sec:")).unwrap_or_else(|| panic!("wrk said:\n{text}"));
    line.trim_start_matches("Requests/sec:").trim().parse().unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (phase, rounds) = if quick { (Duration::from_secs(2), 2) } else { (Duration::from_secs(4), 3) };
    let has_wrk = Command::new("wrk").arg("--version").output().is_ok();
    if !has_wrk {
        println!("wrk is not installed (apt-get install wrk): printing the in-process rates only\n");
    }

    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder(dir.path().join("bench.db"))
        .durability(Durability::Normal)
        .sandbox(support::sandbox_config(8))
        .max_queued(1 << 40)
        .without_workers()
        .build()
        .await
        .unwrap();
    let name = PluginName::new("echo", "1.0.0").unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("echo"), name.clone()).await.unwrap();

    let config = ApiConfig { token: TOKEN.into(), sync_ceiling: Duration::from_secs(30), max_body_bytes: 32 << 20 };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(runtime.clone(), config);
    // `leash serve`'s own listener (keep-alive, no delay, timeouts).
    tokio::spawn(leash::api::listen::serve(listener, app, Default::default(), std::future::pending()));
    let one = serde_json::json!({ "plugin": "echo@1.0.0", "input": { "n": 1 }, "execution": "async" });
    let many =
        serde_json::json!({ "jobs": vec![serde_json::json!({ "plugin": "echo@1.0.0", "input": { "n": 1 } }); BATCH] });
    let (one, many) = (one.to_string(), many.to_string());

    // Warm the statement cache, the plugin look-up and the connection path.
    in_process(&runtime, &name, AS, (CONNECTIONS, 1), Duration::from_millis(500)).await;
    // In process audited, HTTP, for singles then batches; then in process
    // unaudited, singles and batches (what the audit trail costs).
    let mut rates: [Vec<f64>; 6] = Default::default();
    // Requests wrk left in flight when it stopped end before the next phase.
    let settle = || tokio::time::sleep(Duration::from_secs(1));
    let http = |path: &str, body: &String, connections: usize| {
        let (url, body, d) = (format!("{base}{path}"), body.clone(), dir.path().to_owned());
        async move {
            let rate = tokio::task::spawn_blocking(move || wrk(&url, &body, connections, phase, &d)).await.unwrap();
            settle().await;
            rate
        }
    };
    for round in 0..rounds {
        // The table grows all run long and the phase run first sees it
        // smaller: odd rounds run the HTTP phase first.
        let http_first = round % 2 == 1;
        let pairs = [(0, CONNECTIONS, 1, "/v1/jobs", &one), (2, BATCH_CONNECTIONS, BATCH, "/v1/jobs:batch", &many)];
        for (slot, tasks, per_call, path, body) in pairs {
            if http_first && has_wrk {
                rates[slot + 1].push(http(path, body, tasks).await * per_call as f64);
            }
            rates[slot].push(in_process(&runtime, &name, AS, (tasks, per_call), phase).await);
            if !http_first && has_wrk {
                rates[slot + 1].push(http(path, body, tasks).await * per_call as f64);
            }
            rates[4 + slot / 2].push(in_process(&runtime, &name, None, (tasks, per_call), phase).await);
        }
        eprintln!("round {}: {:?}", round + 1, rates.iter().map(|r| r.last().copied()).collect::<Vec<_>>());
    }
    let queued = runtime.store().queued_count().await.unwrap();
    runtime.shutdown().await;

    let median = |v: &[f64]| support::median(v.to_vec());
    // Each round's ratio compares phases run back to back on the same
    // table (the in-process rate falls as the table grows).
    let ratios = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a / b).collect::<Vec<_>>();
    let single_ratios = ratios(&rates[1], &rates[0]);
    let batch_ratios = ratios(&rates[3], &rates[2]);
    let audit_single = ratios(&rates[0], &rates[4]);
    let audit_batch = ratios(&rates[2], &rates[5]);
    let [single, http_single, batch, http_batch, bare_single, bare_batch] = rates.clone().map(|r| median(&r));
    println!(
        "leash submit benchmark: {rounds} rounds of {} s per phase, {CONNECTIONS} concurrent singles, \
         {BATCH_CONNECTIONS} concurrent batches, medians ({queued} jobs queued in all)\n",
        phase.as_secs()
    );
    println!("{:<56} {:>12}", "path", "jobs/s");
    println!("{:<56} {:>12.0}", "in process, Runtime::submit as admin (1 job a call)", single);
    println!("{:<56} {:>12.0}", "HTTP, POST /v1/jobs (1 job a request)", http_single);
    println!("{:<56} {:>12.0}", "in process, Runtime::submit_many as admin (1,000)", batch);
    println!("{:<56} {:>12.0}", "HTTP, POST /v1/jobs:batch (1,000 a request)", http_batch);
    println!("{:<56} {:>12.0}", "in process, Runtime::submit, no principal (unaudited)", bare_single);
    println!("{:<56} {:>12.0}", "in process, Runtime::submit_many, no principal", bare_batch);
    let shown = |v: &[f64]| v.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
    println!(
        "\nHTTP single / in-process single, by round: {} (median {:.2})",
        shown(&single_ratios),
        median(&single_ratios)
    );
    println!("HTTP batch / in-process batch, by round: {} (median {:.2})", shown(&batch_ratios), median(&batch_ratios));
    println!("HTTP batch / in-process single (medians): {:.2}", http_batch / single);
    println!(
        "audited / unaudited in process, single by round: {} (median {:.2}); batch: {} (median {:.2})",
        shown(&audit_single),
        median(&audit_single),
        shown(&audit_batch),
        median(&audit_batch)
    );
}
