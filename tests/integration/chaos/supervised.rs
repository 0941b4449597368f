//! `leash serve`'s supervised pool against real processes: the pool child
//! is SIGKILLed while jobs run; the API answers throughout, no job is
//! lost, and a job under which two processes died is quarantined.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::server::{Server, is_terminal};
use crate::support::{GENEROUS, eventually};

const JOBS: usize = 500;
const KILLS: u64 = 5;

/// The pool process's pid and restarts, as `GET /v1/health` tells them.
async fn supervision(server: &Server) -> (Option<u64>, u64) {
    let (status, health) = server.call(Method::GET, "/v1/health", None).await;
    assert_eq!(status, 200, "{health}");
    let supervision = &health["health"]["supervision"];
    (supervision["pid"].as_u64(), supervision["restarts"].as_u64().expect("restarts"))
}

/// Wait until the pool process is up after `restarts` restarts; its pid.
async fn pool_pid(server: &Server, restarts: u64) -> u64 {
    eventually(format!("the pool process is back after {restarts} restarts"), async || {
        match supervision(server).await {
            (Some(pid), seen) if seen == restarts => Some(pid),
            _ => None,
        }
    })
    .await
}

async fn job(server: &Server, id: &str) -> Value {
    let (status, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(status, 200, "{job}");
    job
}

fn kill(pid: u64) {
    let status = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill -9 {pid}");
}

/// Read the API every few milliseconds until told to stop; every answer
/// must be a 200. Returns each request's latency.
async fn probe(
    url: String,
    token: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (Vec<Duration>, Vec<String>) {
    let http = reqwest::Client::new();
    let mut latencies = Vec::new();
    let mut failures = Vec::new();
    let paths = ["/v1/jobs?limit=5", "/v1/health", "/healthz", "/v1/workers"];
    for n in 0.. {
        if *stop.borrow() {
            break;
        }
        let path = paths[n % paths.len()];
        let asked = Instant::now();
        let request = http.get(format!("{url}{path}")).bearer_auth(&token).timeout(Duration::from_secs(10));
        match request.send().await {
            Ok(response) if response.status().as_u16() == 200 => match response.bytes().await {
                Ok(_) => latencies.push(asked.elapsed()),
                Err(e) => failures.push(format!("{path}: body: {e}")),
            },
            Ok(response) => failures.push(format!("{path}: {}", response.status())),
            Err(e) => failures.push(format!("{path}: {e}")),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            _ = stop.changed() => {}
        }
    }
    (latencies, failures)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn killing_the_pool_process_five_times_loses_no_job_and_quarantines_the_job_killed_twice() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let start_log = dir.path().join("starts.log");
    let start_log_arg = start_log.display().to_string();
    let server = Server::start(&db, &["--start-log", &start_log_arg, "--max-workers", "4"]);
    server.add_plugin("sleep").await;
    let first_pid = pool_pid(&server, 0).await;

    // The poison: a long job with attempts to spare, killed under twice.
    let (status, poison) = server
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({ "plugin": "sleep", "input": { "ms": 600_000 }, "execution": "async", "max_attempts": 5 })),
        )
        .await;
    assert_eq!(status, 202, "{poison}");
    let poison = poison["job_id"].as_str().unwrap().to_owned();
    let mut ids = vec![poison.clone()];
    let jobs: Vec<Value> = (1..JOBS)
        .map(|n| json!({ "plugin": "sleep", "input": { "ms": 60 + n % 5 * 20 }, "execution": "async" }))
        .collect();
    let (status, answer) = server.call(Method::POST, "/v1/jobs:batch", Some(json!({ "jobs": jobs }))).await;
    assert_eq!(status, 202, "{answer}");
    ids.extend(answer["jobs"].as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap().to_owned()));
    assert_eq!(ids.len(), JOBS);

    let (stop_probe, stop_rx) = tokio::sync::watch::channel(false);
    let probing = tokio::spawn(probe(server.url.clone(), server.token.clone(), stop_rx));

    // Kills 1 and 2 land while the poison runs (attempts 1 and 2); 3 to 5
    // while the rest of the run goes on.
    let mut pid = first_pid;
    for kill_n in 1..=KILLS {
        if kill_n <= 2 {
            let start = Instant::now();
            loop {
                let poisoned = job(&server, &poison).await;
                // Running, and its start written to the log the check below
                // reads (the pool writes it just after the claim).
                let logged = std::fs::read_to_string(&start_log)
                    .is_ok_and(|log| log.lines().any(|l| l.starts_with(&format!("{poison} {kill_n} "))));
                if poisoned["status"] == "running" && poisoned["attempt"] == kill_n && logged {
                    break;
                }
                assert!(start.elapsed() < GENEROUS, "the poison never ran attempt {kill_n}: {poisoned}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        kill(pid);
        pid = pool_pid(&server, kill_n).await;
        assert_ne!(pid, first_pid);
    }

    // Every job ends; none is lost.
    let start = Instant::now();
    let mut endings: HashMap<String, usize> = HashMap::new();
    let mut ended: HashMap<String, Value> = HashMap::new();
    while ended.len() < ids.len() {
        for id in &ids {
            if !ended.contains_key(id) {
                let job = job(&server, id).await;
                if is_terminal(&job) {
                    ended.insert(id.clone(), job);
                }
            }
        }
        assert!(start.elapsed() < GENEROUS * 2, "{} of {JOBS} jobs never ended", ids.len() - ended.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_probe.send(true);
    let (mut latencies, failures) = probing.await.unwrap();

    for (id, job) in &ended {
        let ending = format!("{}/{}", job["status"].as_str().unwrap(), job["error_kind"].as_str().unwrap_or("-"));
        *endings.entry(ending.clone()).or_default() += 1;
        if id == &poison {
            continue;
        }
        match ending.as_str() {
            "succeeded/-" => {}
            // Running under two of the kills quarantines any job.
            "failed/host_crash" => assert_eq!(job["process_deaths"], 2, "{job}"),
            _ => panic!("{id} ended {ending}: {job}"),
        }
    }
    let poisoned = &ended[&poison];
    assert_eq!(
        (&poisoned["status"], &poisoned["error_kind"], &poisoned["process_deaths"], &poisoned["attempt"]),
        (&json!("failed"), &json!("host_crash"), &json!(2), &json!(2)),
        "{poisoned}"
    );
    let message = poisoned["error_message"].as_str().unwrap();
    assert!(
        message.contains("2 processes died while running it (the last was killed by signal 9 (SIGKILL))"),
        "{message}"
    );
    assert!(message.contains("The last process's stderr ended:"), "{message}");

    // Quarantined: never claimed again. The start log says where each
    // attempt ran: two starts, in two different processes.
    let starts = std::fs::read_to_string(&start_log).unwrap();
    let poison_starts: Vec<&str> = starts.lines().filter(|l| l.starts_with(poison.as_str())).collect();
    assert_eq!(poison_starts.len(), 2, "{poison_starts:?}");
    assert_ne!(poison_starts[0].split(' ').nth(2), poison_starts[1].split(' ').nth(2), "{poison_starts:?}");
    assert_eq!(job(&server, &poison).await["attempt"], 2, "not claimed again after the run");

    // The API answered every request, through every restart.
    assert!(failures.is_empty(), "requests that failed: {failures:?}");
    latencies.sort();
    let (p50, p99, max) = (percentile(&latencies, 0.50), percentile(&latencies, 0.99), latencies[latencies.len() - 1]);
    eprintln!(
        "supervised pool, {KILLS} SIGKILLs during {JOBS} jobs: {} API requests, all answered 200; \
         p50 {p50:?}, p99 {p99:?}, max {max:?}; endings {endings:?}",
        latencies.len()
    );
    assert!(max < Duration::from_secs(10), "an API request took {max:?}");
    let (_, restarts) = supervision(&server).await;
    assert_eq!(restarts, KILLS);
    let metrics = server.request(Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(&format!("leash_pool_restarts_total {KILLS}")), "{metrics}");
}
