//! The first job of a new plugin, and what its compile costs the others.
//!
//! Run with `cargo bench -p leash --bench first_job` (`-- --quick`: one
//! round). The large guests are the Python and JavaScript `hello` and
//! `echo` (~19 and ~13 MB), built with the pinned componentize-py and
//! componentize-js (`leash_tests::polyglot`); without them only the Rust
//! figures are printed.
//!
//! 1. **Time to first output**: `Runtime::plugin_register` (what `leash
//!    plugins add` does: validate, compile into the caches, store), then a
//!    submit and the wait for its output, in a runtime with 16 slots (a
//!    `leash serve`), with empty caches and a digest never seen: with the
//!    tiered compiler (the default), and with Cranelift alone. *Optimized*:
//!    when the tiered plugin's optimized code was ready. *New worker*: a
//!    fresh runtime on the same store with an empty compile cache (another
//!    machine): its first job reads the code from the store. *Warm*: a
//!    fresh runtime on the same compile cache (a restarted worker).
//! 2. **A second plugin**: in the runtime the cold hello left, the same
//!    for the language's `echo`, tiered and with Cranelift alone.
//! 3. **Throughput beside a compile**: `echo` jobs kept queued on the same
//!    16 slots; their completions per second while a job of a new large
//!    plugin (a fresh digest each round: the Python guest with a custom
//!    section appended) is compiled (until its optimized code is ready,
//!    when tiered), against the same seconds before it, alternating. The rounds share the function cache, so
//!    after the first they compile little.
//!
//! `LEASH_BENCH_COMPILE_NICE=N` sets the compile threads' niceness (default
//! 10), `LEASH_BENCH_FUNCTION_CACHE=0` turns the function cache off in
//! part 3, and `LEASH_BENCH_COMPILER=cranelift` (or `winch`) compiles
//! parts 1 and 3 with that compiler alone, for A/B runs.
//! `LEASH_BENCH_POSTGRES` (or `LEASH_TEST_POSTGRES`), a server URL, adds
//! part 1's new worker with the store on PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leash::job::{PluginName, PluginRef, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::{Compiler, SandboxConfig};
use leash_tests::polyglot::{self, Lang};

#[path = "support/mod.rs"]
mod support;

const SLOTS: usize = 16;

/// A guest measured: its label, its bytes, and its language's second plugin.
type Guest<'a> = (&'a str, Vec<u8>, Option<Vec<u8>>);

async fn runtime(dir: &std::path::Path, cache: &std::path::Path, completions: Arc<AtomicU64>) -> Runtime {
    let functions = match std::env::var("LEASH_BENCH_FUNCTION_CACHE").as_deref() {
        Ok("0") => FUNCTIONS_OFF,
        _ => FUNCTIONS_ON,
    };
    runtime_with(dir, cache, completions, functions, compiler()).await
}

/// The function cache's bound: the default, or 0 (off).
const FUNCTIONS_ON: u64 = leash::sandbox::DEFAULT_FUNCTION_CACHE_BYTES;
const FUNCTIONS_OFF: u64 = 0;

async fn runtime_with(
    dir: &std::path::Path,
    cache: &std::path::Path,
    completions: Arc<AtomicU64>,
    function_cache_bytes: u64,
    compiler: Compiler,
) -> Runtime {
    Runtime::builder(dir.join("first.db"))
        .sandbox(SandboxConfig {
            cache_dir: Some(cache.to_owned()),
            compile_nice: compile_nice(),
            function_cache_bytes,
            compiler,
            ..support::sandbox_config(SLOTS)
        })
        // The "new worker" reads the code from the store: SQLite keeps
        // none unless told.
        .shared_code_bytes(leash::runtime::DEFAULT_SHARED_CODE_BYTES)
        .max_workers(SLOTS)
        .poll_interval(Duration::from_millis(50))
        .on_complete(move |_| {
            completions.fetch_add(1, Ordering::Relaxed);
        })
        .build()
        .await
        .unwrap()
}

/// `LEASH_BENCH_COMPILER=cranelift` (or `winch`) compiles parts 1 and 3's
/// plugins with that compiler alone; tiered unless told.
fn compiler() -> Compiler {
    std::env::var("LEASH_BENCH_COMPILER").map_or(Compiler::Tiered, |c| c.parse().unwrap())
}

/// `LEASH_BENCH_COMPILE_NICE` overrides the default, for A/B runs.
fn compile_nice() -> i32 {
    std::env::var("LEASH_BENCH_COMPILE_NICE").map_or(leash::sandbox::DEFAULT_COMPILE_NICE, |v| v.parse().unwrap())
}

fn by_name(name: &PluginName, input: &[u8]) -> Submit {
    Submit::new(PluginSource::Ref(PluginRef::Version(name.clone())), Target::Execute, input.to_vec())
}

/// The bytes with a custom section appended: the same guest, a new digest.
fn fresh_digest(bytes: &[u8], salt: u64) -> Vec<u8> {
    let name = b"leash-bench-salt";
    let payload = salt.to_le_bytes();
    let size = 1 + name.len() + payload.len();
    assert!(size < 128, "one-byte LEB128 sizes");
    let mut out = bytes.to_vec();
    out.extend_from_slice(&[0, size as u8, name.len() as u8]);
    out.extend_from_slice(name);
    out.extend_from_slice(&payload);
    out
}

/// `plugins add`, then one job's submit-to-output; (add, first output).
async fn add_then_first_output(runtime: &Runtime, bytes: Vec<u8>, name: &PluginName) -> (Duration, Duration) {
    let started = Instant::now();
    runtime.plugin_register(bytes, name.clone()).await.unwrap();
    let added = started.elapsed();
    let id = runtime.submit(by_name(name, br#"{"name":"first"}"#)).await.unwrap();
    let job = runtime.wait(id, Duration::from_secs(300)).await.unwrap();
    assert!(job.output.is_some(), "{job:?}");
    (added, started.elapsed())
}

/// A fresh runtime on the same database with the compile cache `cache`:
/// submit-to-output of its first job.
async fn first_output_of_a_new_process(dir: &std::path::Path, cache: &std::path::Path, name: &PluginName) -> Duration {
    let runtime = runtime(dir, cache, Arc::default()).await;
    let started = Instant::now();
    let id = runtime.submit(by_name(name, br#"{"name":"again"}"#)).await.unwrap();
    let job = runtime.wait(id, Duration::from_secs(300)).await.unwrap();
    assert!(job.output.is_some(), "{job:?}");
    let took = started.elapsed();
    runtime.shutdown().await;
    took
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 1 } else { 3 };
    let python = polyglot::guest_bytes(Lang::Python, "hello");
    if python.is_none() {
        println!("componentize-py is missing: the large guest is skipped\n");
    }
    let mut guests = vec![("rust hello", leash_tests::plugin_bytes("hello"), None)];
    for lang in Lang::ALL {
        if let (Some(hello), Some(echo)) = (polyglot::guest_bytes(lang, "hello"), polyglot::guest_bytes(lang, "echo")) {
            guests.push((if lang == Lang::Python { "python hello" } else { "js hello" }, hello, Some(echo)));
        }
    }

    let tiered = compiler();
    println!("leash first-job benchmark, {SLOTS} slots, {rounds} rounds (medians), compile nice {}\n", compile_nice());
    println!("Time to first output: `plugins add`, then a submit and its output, with empty caches and a new digest:");
    println!("with the {tiered:?} compiler, and with Cranelift alone (the ratio is the first over the second);");
    println!("optimized: when the plugin's optimized code was ready (tiered); new worker: a fresh runtime with an");
    println!("empty compile cache on the same store (another machine); warm: a fresh runtime on the same cache.\n");
    println!(
        "{:<14} {:>9} {:>12} {:>14} {:>15} {:>7} {:>12} {:>13} {:>13}",
        "guest",
        "size",
        "plugins add",
        "cold: output",
        "cranelift: out",
        "ratio",
        "optimized",
        "new worker",
        "warm: output"
    );
    let mut seconds = Vec::new();
    for (label, bytes, second) in &guests {
        let (mut adds, mut colds, mut cranes, mut optimized, mut fresh, mut warms) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut then_tiered, mut then_crane) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let name = PluginName::new("guest", "1.0.0").unwrap();
            for compiler in [tiered, Compiler::Cranelift] {
                let dir = tempfile::tempdir().unwrap();
                let cache = dir.path().join("cache");
                let bytes = fresh_digest(bytes, round as u64 + 1);
                let runtime = runtime_with(dir.path(), &cache, Arc::default(), FUNCTIONS_ON, compiler).await;
                let started = Instant::now();
                let (added, first) = add_then_first_output(&runtime, bytes, &name).await;
                if compiler == tiered {
                    runtime.sandbox().optimized().await;
                    optimized.push(started.elapsed());
                }
                // A second, different plugin of the same language, on the
                // caches the first left.
                if let Some(second) = second {
                    let other = PluginName::new("second", "1.0.0").unwrap();
                    let (_, took) =
                        add_then_first_output(&runtime, fresh_digest(second, round as u64 + 1), &other).await;
                    if compiler == tiered {
                        then_tiered.push(took)
                    } else {
                        then_crane.push(took)
                    }
                    runtime.sandbox().optimized().await;
                }
                runtime.shutdown().await;
                if compiler != tiered {
                    cranes.push(first);
                    continue;
                }
                adds.push(added);
                colds.push(first);
                fresh.push(first_output_of_a_new_process(dir.path(), &dir.path().join("fresh-cache"), &name).await);
                warms.push(first_output_of_a_new_process(dir.path(), &cache, &name).await);
            }
        }
        let (cold, crane) = (support::median(colds), support::median(cranes));
        println!(
            "{label:<14} {:>6.1} MB {:>9.0} ms {:>11.0} ms {:>12.0} ms {:>7.2} {:>9.0} ms {:>10.0} ms {:>10.0} ms",
            bytes.len() as f64 / 1e6,
            support::ms(support::median(adds)),
            support::ms(cold),
            support::ms(crane),
            cold.as_secs_f64() / crane.as_secs_f64(),
            support::ms(support::median(optimized)),
            support::ms(support::median(fresh)),
            support::ms(support::median(warms)),
        );
        if !then_tiered.is_empty() {
            seconds.push((label, support::median(then_tiered), support::median(then_crane)));
        }
    }
    if !seconds.is_empty() {
        println!("\nA second, different plugin of the same language (its echo), after the hello compiled:");
        println!("{:<14} {:>16} {:>17} {:>8}", "after", "cold: output", "cranelift: out", "ratio");
        for (label, tiered, crane) in seconds {
            println!(
                "{label:<14} {:>13.0} ms {:>14.0} ms {:>8.2}",
                support::ms(tiered),
                support::ms(crane),
                tiered.as_secs_f64() / crane.as_secs_f64(),
            );
        }
    }

    new_workers_on_postgres(&guests).await;

    let Some(large) = python else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let completions = Arc::new(AtomicU64::new(0));
    let runtime = runtime(dir.path(), &cache, completions.clone()).await;
    let echo = PluginName::new("echo", "1.0.0").unwrap();
    runtime.plugin_register(leash_tests::plugin_bytes("echo"), echo.clone()).await.unwrap();
    // Keep echo jobs queued: top the queue up whenever it runs low.
    let feeding = Arc::new(AtomicBool::new(true));
    let feeder = {
        let (runtime, echo, feeding) = (runtime.clone(), echo.clone(), feeding.clone());
        tokio::spawn(async move {
            while feeding.load(Ordering::Relaxed) {
                if runtime.store().queued_count().await.unwrap() < 2_000 {
                    runtime.submit_many((0..1_000).map(|_| by_name(&echo, b"x")).collect()).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!("\necho jobs/s on {SLOTS} slots, before and while a new large plugin compiles");
    println!("the new plugin's first output, and when its compiles (both tiers, when tiered) were done");
    println!("{:<7} {:>12} {:>14} {:>9} {:>9} {:>8}", "round", "before", "compiling", "output", "compiled", "ratio");
    let mut ratios = Vec::new();
    for round in 0..rounds {
        // The store, not the compile cache, holds the new plugin: the
        // worker compiles it when the job comes (as a worker that did
        // not run `plugins add` does).
        let bytes = fresh_digest(&large, 1_000 + round as u64);
        let digest = runtime
            .store()
            .plugin_put(leash::store::PluginPutParams { bytes, requests: None, actor: None, now: runtime.now() })
            .await;
        let digest = digest.unwrap();
        let window =
            |from: u64, took: Duration| (completions.load(Ordering::Relaxed) - from) as f64 / took.as_secs_f64();

        let (from, started) = (completions.load(Ordering::Relaxed), Instant::now());
        tokio::time::sleep(Duration::from_secs(6)).await;
        let before = window(from, started.elapsed());

        let (from, started) = (completions.load(Ordering::Relaxed), Instant::now());
        let job = Submit::new(PluginSource::Digest(digest), Target::Execute, br#"{"name":"new"}"#.to_vec());
        let id = runtime.submit(job).await.unwrap();
        let done = runtime.wait(id, Duration::from_secs(300)).await.unwrap();
        assert!(done.output.is_some(), "{done:?}");
        let output = started.elapsed();
        // Tiered, the optimizing compile goes on behind the first job:
        // the window lasts until it is done.
        runtime.sandbox().optimized().await;
        let took = started.elapsed();
        let during = window(from, took);
        ratios.push(during / before);
        println!(
            "{:<7} {before:>12.0} {during:>14.0} {:>7.1} s {:>7.1} s {:>8.2}",
            round + 1,
            output.as_secs_f64(),
            took.as_secs_f64(),
            during / before
        );
    }
    feeding.store(false, Ordering::Relaxed);
    feeder.await.unwrap();
    runtime.shutdown().await;
    println!("\nthroughput kept while compiling (median): {:.2}", support::median(ratios));
}

/// Part 1 again for the new worker alone, with the store on PostgreSQL
/// (`LEASH_BENCH_POSTGRES` or `LEASH_TEST_POSTGRES`, a fresh schema per
/// guest): one runtime adds the plugin and runs it until its optimized code
/// is kept; a second, with an empty compile cache, runs its first job.
async fn new_workers_on_postgres(guests: &[Guest<'_>]) {
    let Some(base) = std::env::var("LEASH_BENCH_POSTGRES").ok().or_else(|| std::env::var("LEASH_TEST_POSTGRES").ok())
    else {
        println!("\nLEASH_BENCH_POSTGRES is not set: the new worker on PostgreSQL is skipped");
        return;
    };
    println!("\nA new worker's first output with the store on PostgreSQL (code read from plugin_code):");
    println!("{:<14} {:>12}", "guest", "new worker");
    for (label, bytes, _) in guests {
        let schema = leash_tests::pg::Schema::create(&base).await;
        let dir = tempfile::tempdir().unwrap();
        let build = |cache: std::path::PathBuf| {
            Runtime::builder(schema.url.clone())
                .sandbox(SandboxConfig { cache_dir: Some(cache), ..support::sandbox_config(SLOTS) })
                .max_workers(SLOTS)
                .poll_interval(Duration::from_millis(50))
                .build()
        };
        let name = PluginName::new("guest", "1.0.0").unwrap();
        let first = build(dir.path().join("cache")).await.unwrap();
        add_then_first_output(&first, fresh_digest(bytes, 7), &name).await;
        first.sandbox().optimized().await;
        first.shutdown().await;
        let worker = build(dir.path().join("fresh-cache")).await.unwrap();
        let started = Instant::now();
        let id = worker.submit(by_name(&name, br#"{"name":"again"}"#)).await.unwrap();
        let job = worker.wait(id, Duration::from_secs(300)).await.unwrap();
        assert!(job.output.is_some(), "{job:?}");
        let took = started.elapsed();
        let logs = worker.logs(id).await.unwrap();
        assert!(logs.records[0].message.contains("fetched compiled from the store"), "{:?}", logs.records[0]);
        worker.shutdown().await;
        println!("{label:<14} {:>9.0} ms", support::ms(took));
    }
}
