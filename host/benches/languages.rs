//! What a guest's language costs: the `hello` plugin in Rust, Python and
//! JavaScript, each measured in one process.
//!
//! Run with `cargo bench -p leash --bench languages` (add `-- --quick` for
//! fewer samples). It builds the Python and JavaScript guests with the
//! pinned toolchains (see `leash_tests::polyglot`) and skips a language
//! whose tool is missing. For each language it prints the component's
//! size, a cold compile (no cache), a load from the compile cache, the
//! cached artifact's size, and the per-job cost (fresh store, instantiate,
//! run `hello`) as p50/p99, with each figure's ratio to Rust's; then each
//! component's size in bytes as built and after `leash plugins shrink`
//! (its names in one compressed section).
//! `LEASH_BENCH_JOBS=N` sets the number of jobs (300; 50 with `--quick`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use leash::job::Target;
use leash::sandbox::{NoObserver, RunLimits, RunRequest, Sandbox, StopHandle};
use leash_tests::polyglot::{self, Lang};

#[path = "support/mod.rs"]
mod support;
use support::{ms, percentile, sandbox_config, us};

struct Figures {
    lang: &'static str,
    bytes: usize,
    /// After `leash plugins shrink`, or why it would not.
    shrunk: Result<leash::sandbox::names::Shrunk, String>,
    cold: Duration,
    cached: Duration,
    artifact_bytes: u64,
    job_p50: Duration,
    job_p99: Duration,
}

fn measure(lang: &'static str, bytes: &[u8], jobs: usize, runtime: &tokio::runtime::Runtime) -> Figures {
    let cache = tempfile::tempdir().expect("cache dir");
    let config = || leash::sandbox::SandboxConfig { cache_dir: Some(cache.path().to_path_buf()), ..sandbox_config(4) };
    let sandbox = Sandbox::new(config()).expect("sandbox");
    let started = Instant::now();
    sandbox.load(bytes).expect("cold load");
    let cold = started.elapsed();
    drop(sandbox);
    let artifact_bytes = walk_size(cache.path());

    // A fresh sandbox (a restarted worker) reads the cache.
    let sandbox = Sandbox::new(config()).expect("sandbox");
    let started = Instant::now();
    let plugin = sandbox.load(bytes).expect("cached load");
    let cached = started.elapsed();
    assert!(plugin.loaded().from_cache, "{lang}: the second load did not come from the cache");

    let input = br#"{"name":"Ada"}"#;
    let mut samples = Vec::with_capacity(jobs);
    runtime.block_on(async {
        for _ in 0..jobs {
            let request = RunRequest::new(Target::Execute, input.to_vec(), RunLimits::default());
            let started = Instant::now();
            let outcome = sandbox.run(&plugin, request, &StopHandle::new(), Arc::new(NoObserver)).await;
            samples.push(started.elapsed());
            assert!(outcome.result.is_ok(), "{lang}: {:?}", outcome.result);
        }
    });
    samples.sort();
    Figures {
        lang,
        bytes: bytes.len(),
        shrunk: leash::sandbox::names::shrink(bytes),
        cold,
        cached,
        artifact_bytes,
        job_p50: percentile(&samples, 0.5),
        job_p99: percentile(&samples, 0.99),
    }
}

fn walk_size(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                let meta = e.metadata().expect("metadata");
                if meta.is_dir() { walk_size(&e.path()) } else { meta.len() }
            })
            .sum()
    })
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `LEASH_BENCH_JOBS=N` runs N jobs of each language, for a profiler.
    let jobs = std::env::var("LEASH_BENCH_JOBS").map_or(if quick { 50 } else { 300 }, |n| n.parse().unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    let mut rows = vec![measure("rust", &leash_tests::plugin_bytes("hello"), jobs, &runtime)];
    for (lang, name) in [(Lang::Python, "python"), (Lang::Js, "js")] {
        match polyglot::guest_bytes(lang, "hello") {
            Some(bytes) => rows.push(measure(name, &bytes, jobs, &runtime)),
            None => println!("{name}: skipped (its toolchain is missing)"),
        }
    }
    let base = &rows[0];
    println!("hello in each language ({jobs} jobs each; ratios are to Rust in this run)");
    println!(
        "{:<7} {:>10} {:>13} {:>14} {:>12} {:>15} {:>15}",
        "lang", "size KB", "cold compile", "cached load", "cache KB", "job p50", "job p99"
    );
    for row in &rows {
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "{:<7} {:>10.0} {:>8.0} ms {:>4.0}x {:>6.2} ms {:>4.0}x {:>12.0} {:>6.0} us {:>4.1}x {:>6.0} us {:>4.1}x",
            row.lang,
            row.bytes as f64 / 1024.0,
            ms(row.cold),
            ratio(row.cold, base.cold),
            ms(row.cached),
            ratio(row.cached, base.cached),
            row.artifact_bytes as f64 / 1024.0,
            us(row.job_p50),
            ratio(row.job_p50, base.job_p50),
            us(row.job_p99),
            ratio(row.job_p99, base.job_p99),
        );
    }
    println!("size in bytes, as built and after `leash plugins shrink` (names moved into one compressed section)");
    println!("{:<7} {:>12} {:>12} {:>14} {:>14}", "lang", "built", "shrunk", "names before", "names after");
    for row in &rows {
        match &row.shrunk {
            Ok(s) => println!(
                "{:<7} {:>12} {:>12} {:>14} {:>14}",
                row.lang,
                row.bytes,
                s.bytes.len(),
                s.names_before,
                s.names_after
            ),
            Err(e) => println!("{:<7} {:>12} not shrunk: {e}", row.lang, row.bytes),
        }
    }
}
