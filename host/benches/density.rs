//! Density benchmark: a thousand guests running at once in one process.
//!
//! Run with `cargo bench -p leash --bench density` (`-- --quick`: 250
//! guests). It starts a real `leash serve --pool in-process --max-workers
//! 1000` (the worker pool and its pooling allocator sized to 1,000 slots,
//! the HTTP API in the same process, so one `VmRSS` holds it all) and, for the `sleep` guest (blocked in a WASI sleep)
//! and the `coop` guest (computing, checking for cancellation):
//!
//! 1. queues 1,000 jobs in one `POST /v1/jobs:batch` and times until
//!    `GET /v1/health` reports all 1,000 running (polled every 5 ms);
//! 2. reads the server's resident memory (`VmRSS`) and address space
//!    (`VmSize`) with all of them running, against the same process idle;
//! 3. cancels every job (`POST /v1/jobs/{id}/cancel`, 64 at a time) and
//!    times until none is running.
//!
//! Then it starts `leash serve --max-workers 10000` and prints how it
//! answers.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TOKEN: &str = "density-bench-token";

struct Serve {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(dir: &std::path::Path, slots: usize, extra: &[&str]) -> Result<Serve, String> {
    let db = dir.join(format!("density-{slots}-{}.db", extra.join("")));
    let mut child = Command::new(env!("CARGO_BIN_EXE_leash"))
        .args([
            "serve",
            "--pool",
            "in-process",
            "--listen",
            "127.0.0.1:0",
            "--poll-interval",
            "50ms",
            "--lease-ttl",
            "10s",
        ])
        .args(["--max-workers", &slots.to_string(), "--max-queued", "100000"])
        .args(extra)
        .arg("--db")
        .arg(db)
        .arg("--cache-dir")
        .arg(std::env::temp_dir().join("leash-bench-cache"))
        .env("LEASH_API_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start leash serve");
    let stderr = child.stderr.take().unwrap();
    let mut said = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        if let Some(rest) = line.split("serving ").nth(1) {
            let url = rest.split_whitespace().next().unwrap().to_owned();
            return Ok(Serve { child, url, http: reqwest::Client::new() });
        }
        said.push(line);
    }
    let status = child.wait().unwrap();
    Err(format!("exited ({status}) saying:\n{}", said.join("\n")))
}

impl Serve {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.url)).bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let answer: Value = response.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {answer}");
        answer
    }

    async fn running(&self) -> u64 {
        self.call(reqwest::Method::GET, "/v1/health", None).await["health"]["running_here"].as_u64().unwrap()
    }

    /// `VmRSS` and `VmSize` of the server, in MiB.
    fn memory(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1024.0
        };
        (field("VmRSS:"), field("VmSize:"))
    }

    async fn until_running(&self, want: u64, limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if self.running().await == want {
                return start.elapsed();
            }
            assert!(start.elapsed() < limit, "{want} running not reached within {limit:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let guests: usize = if quick { 250 } else { 1000 };
    let dir = tempfile::tempdir().unwrap();
    println!("leash density benchmark: {guests} guests in one `leash serve --max-workers {guests}`\n");
    println!(
        "{:<8} {:<20} {:>10} {:>12} {:>12} {:>12} {:>10}",
        "guest", "flags", "idle RSS", "start all", "cancel all", "RSS running", "per guest"
    );
    // The default cancel grace (5 s) first; then a short one, which shows
    // the forced stop of guests that cannot see a cancel (blocked in a
    // host sleep) at this scale.
    for (plugins, extra) in [(&["sleep", "coop"][..], &[][..]), (&["sleep"][..], &["--cancel-grace", "100ms"][..])] {
        let server = serve(dir.path(), guests, extra).unwrap_or_else(|e| panic!("leash serve: {e}"));
        for plugin in plugins {
            let response = server
                .http
                .post(format!("{}/v1/plugins?name={plugin}", server.url))
                .bearer_auth(TOKEN)
                .body(leash_tests::plugin_bytes(plugin))
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success());
            // One short job first, so the compile (or cache load) is not timed.
            let input = if *plugin == "sleep" { json!({ "ms": 1 }) } else { json!({ "steps": 1 }) };
            server.call(reqwest::Method::POST, "/v1/jobs", Some(json!({ "plugin": plugin, "input": input }))).await;
        }
        let idle = server.memory();
        for plugin in plugins {
            let job = json!({ "plugin": plugin, "input": {}, "timeout_ms": 600_000 });
            let started = Instant::now();
            let batch = json!({ "jobs": vec![job; guests] });
            let accepted = server.call(reqwest::Method::POST, "/v1/jobs:batch", Some(batch)).await;
            let ids: Vec<String> =
                accepted["jobs"].as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap().to_owned()).collect();
            server.until_running(guests as u64, Duration::from_secs(120)).await;
            let start_all = started.elapsed();
            // Let every guest get past its start before reading memory.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (rss, _) = server.memory();
            let started = Instant::now();
            let mut cancels = tokio::task::JoinSet::new();
            for chunk in ids.chunks(ids.len().div_ceil(64)) {
                let (http, url, chunk) = (server.http.clone(), server.url.clone(), chunk.to_vec());
                cancels.spawn(async move {
                    for id in chunk {
                        let response =
                            http.post(format!("{url}/v1/jobs/{id}/cancel")).bearer_auth(TOKEN).send().await.unwrap();
                        assert!(response.status().is_success() || response.status().as_u16() == 409);
                    }
                });
            }
            while cancels.join_next().await.is_some() {}
            server.until_running(0, Duration::from_secs(120)).await;
            let cancel_all = started.elapsed();
            println!(
                "{plugin:<8} {:<20} {:>6.0} MiB {:>10.0}ms {:>10.0}ms {:>8.0} MiB {:>6.3} MiB",
                if extra.is_empty() { "(defaults)".to_owned() } else { extra.join(" ") },
                idle.0,
                start_all.as_secs_f64() * 1000.0,
                cancel_all.as_secs_f64() * 1000.0,
                rss,
                (rss - idle.0) / guests as f64
            );
        }
        if extra.is_empty() {
            let (_, size) = server.memory();
            println!("(address space reserved by the server: {:.1} TiB)", size / (1024.0 * 1024.0));
        }
    }

    let tenfold = guests * 10;
    println!("\nleash serve --max-workers {tenfold}:");
    match serve(dir.path(), tenfold, &[]) {
        Ok(server) => {
            let (rss, size) = server.memory();
            println!("  started: RSS {rss:.0} MiB, address space {:.1} TiB", size / (1024.0 * 1024.0));
        }
        Err(e) => println!("  refused: {e}"),
    }
}
