//! Control-plane responsiveness under guest load: how fast a `leash serve`
//! answers `GET /v1/jobs?limit=1`, and how fresh its lease renewals stay,
//! while every slot runs a CPU-bound `coop` guest — with guests on their
//! own lower-priority threads (the default) and, as the baseline, on the
//! same tokio threads as the HTTP server. The idle figures come from the
//! same runtime in the same run, so the ratios hold on a noisy machine.
//!
//! Run with `cargo bench -p leash --bench control_plane` (`-- --quick` for
//! fewer requests).
//!
//! The server side is `leash serve`'s: a runtime with its pool and sweeps
//! and the API router on a loopback listener, on a two-thread tokio
//! runtime. The client is a plain keep-alive HTTP/1.1 connection on its own
//! OS thread, so it never waits for the server's runtime.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leash::api::listen::{ListenLimits, serve};
use leash::api::{ApiConfig, router};
use leash::job::{JobStatus, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::store::JobListParams;

#[path = "support/mod.rs"]
mod support;
use support::{ms, percentile};

const TOKEN: &str = "bench-token";
/// The lease renews every third of this.
const LEASE_TTL: Duration = Duration::from_secs(3);

/// `GET` `path` `n` times on one keep-alive connection, a few ms apart;
/// each request's latency.
fn sample(address: std::net::SocketAddr, path: &str, n: usize) -> Vec<Duration> {
    let stream = TcpStream::connect(address).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let request = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\n\r\n");
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        writer.write_all(request.as_bytes()).unwrap();
        let mut length = 0usize;
        let mut line = String::new();
        let mut status = String::new();
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if status.is_empty() {
                status = line.clone();
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).unwrap();
        samples.push(started.elapsed());
        assert!(status.contains(" 200 "), "{status}");
        std::thread::sleep(Duration::from_millis(5));
    }
    samples.sort();
    samples
}

struct Figures {
    p50: f64,
    p97: f64,
    p99: f64,
}

fn figures(samples: &[Duration]) -> Figures {
    Figures {
        p50: ms(percentile(samples, 0.5)),
        p97: ms(percentile(samples, 0.97)),
        p99: ms(percentile(samples, 0.99)),
    }
}

/// One configuration: idle figures, then loaded figures with every slot
/// busy, and the oldest lease renewal seen while loaded.
async fn measure(slots: usize, isolate: bool, nice: i32, requests: usize) -> (Figures, Figures, f64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder(dir.path().join("bench.db"))
        .sandbox(support::sandbox_config(slots))
        .max_workers(slots)
        .lease_ttl(LEASE_TTL)
        .isolate_guests(isolate)
        .guest_nice(nice)
        .build()
        .await
        .unwrap();
    let config = ApiConfig { token: TOKEN.into(), sync_ceiling: Duration::from_secs(60), max_body_bytes: 1 << 20 };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, router(runtime.clone(), config), ListenLimits::default(), async {
        let _ = stop_rx.await;
    }));
    let coop = leash_tests::plugin_bytes("coop");
    // One job first, so the list is not empty and the plugin is compiled.
    runtime
        .submit(Submit::new(PluginSource::Bytes(coop.clone()), Target::Execute, br#"{"steps":1}"#.to_vec()))
        .await
        .unwrap();
    let path = "/v1/jobs?limit=1";
    let idle = tokio::task::spawn_blocking(move || sample(address, path, requests)).await.unwrap();

    let mut jobs = Vec::new();
    for _ in 0..slots {
        jobs.push(
            runtime.submit(Submit::new(PluginSource::Bytes(coop.clone()), Target::Execute, Vec::new())).await.unwrap(),
        );
    }
    let all_running = Instant::now();
    while runtime.health().await.unwrap().running_here < slots {
        assert!(all_running.elapsed() < Duration::from_secs(120), "the slots never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = tokio::task::spawn_blocking(move || sample(address, path, requests));
    // Meanwhile: the oldest renewal among the running jobs, every 100 ms.
    let mut oldest = Duration::ZERO;
    while !client.is_finished() {
        let running = runtime
            .list(JobListParams { status: vec![JobStatus::Running], limit: 500, ..JobListParams::default() })
            .await
            .unwrap();
        let now = runtime.now().unix_ms();
        for job in running {
            let age = now - job.last_heartbeat.map_or(now, |t| t.unix_ms());
            oldest = oldest.max(Duration::from_millis(age.max(0) as u64));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let loaded = client.await.unwrap();
    let lost = runtime.health().await.unwrap().leases_lost;
    for id in jobs {
        let _ = runtime.cancel(id).await;
    }
    runtime.shutdown().await;
    let _ = stop_tx.send(());
    let _ = server.await;
    (figures(&idle), figures(&loaded), ms(oldest), lost)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let requests = if quick { 200 } else { 600 };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("control plane under guest load: {requests} GET /v1/jobs?limit=1 per phase, {cores} cores");
    println!("lease TTL {LEASE_TTL:?}: renewals every {:?}", LEASE_TTL / 3);
    println!(
        "{:<10} {:>5} | {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>10} | {:>13} {:>5}",
        "guests",
        "slots",
        "idle p50",
        "idle p99",
        "busy p50",
        "busy p97",
        "busy p99",
        "p99 / idle",
        "oldest renew",
        "lost"
    );
    for slots in [4, 64] {
        for (mode, isolate, nice) in [("shared", false, 0), ("isolated", true, 0), ("nice+10", true, 10)] {
            let (idle, busy, oldest, lost) = measure(slots, isolate, nice, requests).await;
            println!(
                "{:<10} {:>5} | {:>6.2}ms {:>6.2}ms | {:>6.2}ms {:>6.2}ms {:>6.2}ms | {:>9.1}x | {:>11.0}ms {:>5}",
                mode,
                slots,
                idle.p50,
                idle.p99,
                busy.p50,
                busy.p97,
                busy.p99,
                busy.p99 / idle.p99,
                oldest,
                lost
            );
        }
    }
}
