//! Hostile guests under load: a steady stream of `hello` jobs alone, then
//! the same stream while several copies of every hostile job (each hostile
//! test plugin, and each attack of the `hostile` plugin) run beside it, in
//! one process; then beside a compile of the largest component the compile
//! caps accept. Prints the containment of each hostile job (its error kind,
//! or its report that every escape failed), the hello throughput ratios
//! (with / without), the compile time and the host's memory.
//!
//! Run with `cargo bench -p leash --bench hostile` (`-- --quick`: shorter
//! windows, fewer copies; `LEASH_HOSTILE_ONLY=spin,panic` runs just those).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leash::job::{ErrorKind, Job, JobStatus, Target};
use leash::runtime::{PluginSource, Runtime, Submit};

#[path = "support/mod.rs"]
mod support;

const SLOTS: usize = 16;
/// Hello jobs kept in flight.
const IN_FLIGHT: usize = 8;

/// What containment means for each hostile job, by its label.
fn contained(name: &str, job: &Job) -> Result<(), String> {
    let kind = job.error_kind;
    let want = |k: ErrorKind| if kind == Some(k) { Ok(()) } else { Err(format!("{name}: {kind:?}, wanted {k:?}")) };
    let report = || -> Result<serde_json::Value, String> {
        if job.status != JobStatus::Succeeded {
            return Err(format!("{name}: {:?} {:?}", job.status, job.error_message));
        }
        serde_json::from_slice(job.output.as_deref().unwrap_or_default()).map_err(|e| e.to_string())
    };
    let all_failed =
        |report: serde_json::Value, attempts: &[&str]| match attempts.iter().find(|a| report[**a]["ok"] != false) {
            Some(a) => Err(format!("{name}: {a} was not refused: {}", report[*a])),
            None => Ok(()),
        };
    match name {
        "spin" | "sleep" | "log-empty-fields" => want(ErrorKind::Timeout),
        "alloc-bomb" => want(ErrorKind::MemoryLimit),
        "stack-overflow" | "panic" | "log-bad-utf8" | "log-bad-level" | "log-out-of-bounds" | "log-misaligned"
        | "exit" | "poll-empty" | "random-huge" | "stream-overwrite" | "oom-then-panic" => want(ErrorKind::Trap),
        "handles" => want(ErrorKind::ResourceLimit),
        "huge-error" => want(ErrorKind::GuestError),
        "big-output" => want(ErrorKind::OutputLimit),
        "log-spam" => (job.status == JobStatus::Succeeded).then_some(()).ok_or(format!("{name}: {:?}", job.status)),
        "fs-escape" => all_failed(report()?, &["read_etc_passwd", "list_root", "list_cwd"]),
        "net-escape" => all_failed(report()?, &["tcp_connect", "udp_send", "dns_lookup"]),
        "env-read" => {
            let r = report()?;
            if r["vars"] == serde_json::json!([]) && r["args"] == serde_json::json!([]) {
                Ok(())
            } else {
                Err(format!("{name}: saw {r}"))
            }
        }
        other => Err(format!("unknown hostile {other}")),
    }
}

/// Hostile jobs: a label, the plugin, and its input (`{addr}` is replaced
/// by a local address nothing answers on).
const HOSTILE: [(&str, &str, &str); 22] = [
    ("spin", "spin", ""),
    ("sleep", "sleep", ""),
    ("alloc-bomb", "alloc-bomb", ""),
    ("stack-overflow", "stack-overflow", ""),
    ("panic", "panic", ""),
    ("big-output", "big-output", ""),
    ("log-spam", "log-spam", r#"{"lines":20000}"#),
    ("fs-escape", "fs-escape", ""),
    ("env-read", "env-read", ""),
    ("net-escape", "net-escape", r#"{"addr":"{addr}"}"#),
    ("log-empty-fields", "hostile", r#"{"attack":"log-empty-fields","n":20000}"#),
    ("log-bad-utf8", "hostile", r#"{"attack":"log-bad-utf8"}"#),
    ("log-bad-level", "hostile", r#"{"attack":"log-bad-level"}"#),
    ("log-out-of-bounds", "hostile", r#"{"attack":"log-out-of-bounds"}"#),
    ("log-misaligned", "hostile", r#"{"attack":"log-misaligned"}"#),
    ("exit", "hostile", r#"{"attack":"exit"}"#),
    ("poll-empty", "hostile", r#"{"attack":"poll-empty"}"#),
    ("random-huge", "hostile", r#"{"attack":"random-huge","n":67108864}"#),
    ("stream-overwrite", "hostile", r#"{"attack":"stream-overwrite","n":1048576}"#),
    ("handles", "hostile", r#"{"attack":"handles"}"#),
    ("oom-then-panic", "hostile", r#"{"attack":"oom-then-panic","n":1073741824}"#),
    ("huge-error", "hostile", r#"{"attack":"huge-error","n":1048576}"#),
];

/// A component just under every compile cap: the most a compile may cost.
/// `salt` makes each one new to the compile cache.
fn largest_accepted_component(salt: u32) -> Vec<u8> {
    let limits = leash::sandbox::ComponentLimits::default();
    let funcs = "(func)".repeat(limits.max_functions as usize - 1);
    wat::parse_str(format!("(component (core module {funcs} (func (result i32) i32.const {salt})))")).unwrap()
}

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Run the hello stream for `window`, keeping `IN_FLIGHT` jobs queued or
/// running; returns completed jobs per second.
async fn hello_stream(runtime: &Runtime, digest: leash::job::Digest, window: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + window;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (runtime, done) = (runtime.clone(), done.clone());
        tasks.spawn(async move {
            while Instant::now() < stop_at {
                let job = Submit::new(PluginSource::Digest(digest), Target::Execute, br#"{"name":"load"}"#.to_vec());
                let id = runtime.submit(job).await.unwrap();
                let job = runtime.wait(id, Duration::from_secs(60)).await.unwrap();
                assert_eq!(job.status, JobStatus::Succeeded);
                if Instant::now() < stop_at {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (window, copies, rounds) = if quick { (Duration::from_secs(2), 2, 3) } else { (Duration::from_secs(5), 4, 5) };
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder(dir.path().join("hostile.db"))
        .sandbox(support::sandbox_config(SLOTS))
        .max_workers(SLOTS)
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let hello = runtime.plugin_add(leash_tests::plugin_bytes("hello")).await.unwrap();
    // LEASH_HOSTILE_ONLY=a,b runs just those hostile jobs (to see which costs what).
    let only = std::env::var("LEASH_HOSTILE_ONLY").ok();
    let chosen = HOSTILE.iter().filter(|(n, ..)| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == *n)));
    let mut hostile = Vec::new();
    for &(name, plugin, input) in chosen {
        let digest = runtime.plugin_add(leash_tests::plugin_bytes(plugin)).await.unwrap();
        hostile.push((name, digest, input));
    }
    hello_stream(&runtime, hello, Duration::from_secs(1)).await; // warm
    let rss_before = rss_kib("VmRSS:");

    // Alternate windows alone and beside hostiles (A B A B …): the store
    // grows and checkpoints as the run goes on, and that must hit both.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (mut alone, mut loaded, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        alone.push(hello_stream(&runtime, hello, window).await);
        // Every hostile plugin `copies` times, spread over the window, each
        // with tight limits.
        let submitter = {
            let runtime = runtime.clone();
            let hostile = hostile.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                let gap = window / (copies as u32 + 1);
                for _ in 0..copies {
                    tokio::time::sleep(gap).await;
                    for (name, digest, input) in &hostile {
                        let input = input.replace("{addr}", &addr.to_string()).into_bytes();
                        let mut job = Submit::new(PluginSource::Digest(*digest), Target::Execute, input);
                        job.timeout = Some(Duration::from_millis(300));
                        job.memory_bytes = Some(32 << 20);
                        ids.push((*name, runtime.submit(job).await.unwrap()));
                    }
                }
                ids
            })
        };
        loaded.push(hello_stream(&runtime, hello, window).await);
        ids.extend(submitter.await.unwrap());
    }
    // A compile of the largest component the caps accept, beside the same
    // hello stream: what one compile costs, and what it costs other jobs.
    let (mut compiling, mut compile_times) = (Vec::new(), Vec::new());
    let peak_hostiles = rss_kib("VmHWM:");
    // New to the compile cache on every run of the benchmark, too.
    let salt = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() >> 2;
    for round in 0..rounds.min(3) {
        let compile = {
            let runtime = runtime.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                // Compiled in full, then refused for exporting no `run`: the
                // compile is what this measures.
                let refused = runtime.plugin_add(largest_accepted_component(salt + round as u32)).await.unwrap_err();
                assert!(refused.to_string().contains("no export `run`"), "{refused}");
                started.elapsed()
            })
        };
        compiling.push(hello_stream(&runtime, hello, window).await);
        compile_times.push(compile.await.unwrap());
    }
    let mut failures = Vec::new();
    for (name, id) in &ids {
        let job = runtime.wait(*id, Duration::from_secs(60)).await.unwrap();
        if let Err(e) = contained(name, &job) {
            failures.push(e);
        }
    }
    let (alone_runs, loaded_runs) = (alone.clone(), loaded.clone());
    let (alone, loaded) = (support::median(alone), support::median(loaded));
    let rss_after = rss_kib("VmRSS:");
    let peak = rss_kib("VmHWM:");
    let compiling_runs = compiling.clone();
    let compiling = support::median(compiling);
    runtime.shutdown().await;
    drop(listener);

    println!(
        "leash hostile-guests-under-load benchmark, {SLOTS} slots, {IN_FLIGHT} hello jobs in flight, 2 runtime threads\n"
    );
    println!(
        "hostile jobs: {} ({} plugins × {copies} copies × {rounds} windows), contained: {}",
        ids.len(),
        hostile.len(),
        ids.len() - failures.len()
    );
    for failure in &failures {
        println!("  NOT CONTAINED: {failure}");
    }
    println!("hello alone:          {alone:>8.0} jobs/s (median of {rounds} windows of {window:?}: {alone_runs:.0?})");
    println!(
        "hello beside hostile: {loaded:>8.0} jobs/s (median of {rounds} windows of {window:?}: {loaded_runs:.0?})"
    );
    println!("kept: {:.0}% (target ≥ 80%)", loaded / alone * 100.0);
    println!(
        "hello beside a compile: {compiling:>7.0} jobs/s (median of {} windows: {compiling_runs:.0?}), kept {:.0}%",
        compiling_runs.len(),
        compiling / alone * 100.0
    );
    println!(
        "compile of the largest accepted component ({} functions): {:.1?}",
        leash::sandbox::ComponentLimits::default().max_functions,
        compile_times
    );
    println!(
        "host RSS: {} MiB before, peak {} MiB with the hostiles, peak {} MiB with the compiles too, {} MiB after",
        rss_before / 1024,
        peak_hostiles / 1024,
        peak / 1024,
        rss_after / 1024
    );
    assert!(failures.is_empty(), "every hostile job must be contained");
}
