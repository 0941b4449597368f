//! Sync-call benchmark: one `hello` job at a time, three ways, and the
//! HTTP floor beside them, measured in the same process and interleaved so
//! machine noise hits all of them alike.
//!
//! Run with `cargo bench -p leash --bench http` (`-- --quick` for fewer
//! calls).
//!
//! 1. Raw sandbox call: fresh store + instantiate + call, no database.
//! 2. In-process durable call: `Runtime::submit` then `Runtime::wait`
//!    (queued in SQLite, claimed, run, recorded, woken).
//! 3. HTTP sync call: `POST /v1/jobs` with `"execution": "sync"` over
//!    loopback TCP to the same runtime served by `leash::api::router`,
//!    with a keep-alive client.
//! 4. The HTTP floor: `GET /healthz` on the same connection pool, no job
//!    and no auth: what the transport and the client cost by themselves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leash::api::{ApiConfig, router};
use leash::job::{PluginName, PluginRef, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::{NoObserver, RunLimits, RunRequest, Sandbox, SandboxConfig, StopHandle};

const TOKEN: &str = "bench-token";

#[path = "support/mod.rs"]
mod support;
use support::{percentile, us};

fn sandbox_config() -> SandboxConfig {
    support::sandbox_config(8)
}

struct Series {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Series {
    fn stats(&mut self) -> (f64, f64, f64) {
        self.samples.sort();
        (us(percentile(&self.samples, 0.5)), us(percentile(&self.samples, 0.99)), us(percentile(&self.samples, 0.0)))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 300 } else { 2000 };
    let input = br#"{"name":"bench"}"#.to_vec();

    let sandbox = Sandbox::new(sandbox_config()).unwrap();
    let plugin = sandbox.load(&leash_tests::plugin_bytes("hello")).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder(dir.path().join("bench.db"))
        .sandbox(sandbox_config())
        .max_workers(4)
        .poll_interval(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let name = PluginName::new("hello", "1.0.0").unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("hello"), name.clone()).await.unwrap();

    let config = ApiConfig { token: TOKEN.into(), sync_ceiling: Duration::from_secs(30), max_body_bytes: 1 << 20 };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/jobs", listener.local_addr().unwrap());
    let app = router(runtime.clone(), config);
    // `leash serve`'s own listener (keep-alive, no delay, timeouts).
    tokio::spawn(leash::api::listen::serve(listener, app, Default::default(), std::future::pending()));
    let http = reqwest::Client::new();
    let body = serde_json::json!({ "plugin": "hello@1.0.0", "input": { "name": "bench" }, "execution": "sync" });

    let raw_call = || async {
        let request = RunRequest::new(Target::Execute, input.clone(), RunLimits::default());
        let start = Instant::now();
        let outcome = sandbox.run(&plugin, request, &StopHandle::new(), Arc::new(NoObserver)).await;
        assert!(outcome.result.is_ok());
        start.elapsed()
    };
    let durable_call = || async {
        let start = Instant::now();
        let job = Submit::new(PluginSource::Ref(PluginRef::Version(name.clone())), Target::Execute, input.clone());
        let id = runtime.submit(job).await.unwrap();
        let done = runtime.wait(id, Duration::from_secs(30)).await.unwrap();
        assert!(done.output.is_some());
        start.elapsed()
    };
    let health_url = url.replace("/v1/jobs", "/healthz");
    let floor_call = || async {
        let start = Instant::now();
        let response = http.get(&health_url).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response.bytes().await.unwrap();
        start.elapsed()
    };
    let http_call = || async {
        let start = Instant::now();
        let response = http.post(&url).bearer_auth(TOKEN).json(&body).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let answer: serde_json::Value = response.json().await.unwrap();
        assert_eq!(answer["job"]["status"], "succeeded");
        start.elapsed()
    };

    // Warm every path (compile cache, connection, statement cache).
    for _ in 0..50 {
        raw_call().await;
        durable_call().await;
        http_call().await;
        floor_call().await;
    }
    let mut raw = Series { name: "raw sandbox call (no store)", samples: Vec::with_capacity(rounds) };
    let mut durable = Series { name: "in-process durable call (submit + wait)", samples: Vec::with_capacity(rounds) };
    let mut over_http = Series { name: "HTTP sync call over loopback", samples: Vec::with_capacity(rounds) };
    let mut floor = Series { name: "HTTP round trip, no job (GET /healthz)", samples: Vec::with_capacity(rounds) };
    for _ in 0..rounds {
        raw.samples.push(raw_call().await);
        durable.samples.push(durable_call().await);
        over_http.samples.push(http_call().await);
        floor.samples.push(floor_call().await);
    }
    runtime.shutdown().await;

    println!("leash sync-call benchmark, `hello`, {rounds} calls each, interleaved, 2 runtime threads\n");
    println!("{:<42} {:>10} {:>10} {:>10}", "path", "min µs", "p50 µs", "p99 µs");
    let (durable_p50, http_p50) = (durable.stats().0, over_http.stats().0);
    for series in [&mut raw, &mut durable, &mut over_http, &mut floor] {
        let (p50, p99, min) = series.stats();
        println!("{:<42} {min:>10.0} {p50:>10.0} {p99:>10.0}", series.name);
    }
    println!("\nHTTP sync p50 / in-process durable p50: {:.2}x", http_p50 / durable_p50);
}
