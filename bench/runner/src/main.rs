//! `peer-bench`: leash beside the tools a user would pick instead, measured
//! in the same run on the same machine. `bash bench/run.sh` builds the
//! guests and both binaries and runs `peer-bench compare`.
//!
//! - `peer-bench compare <leash-work.wasm> <extism-work.wasm> <apalis-peer> <out-dir> [--quick]`
//!   runs everything, alternating the peers (A B A B …), prints a Markdown
//!   table and writes `results.json` and two SVG charts to `<out-dir>`.
//! - `peer-bench queue-leash drain <db> <wasm> <jobs> <workers>` and
//!   `peer-bench queue-leash latency <db> <wasm> <rate> <seconds> <workers>`
//!   are the leash side of the queue comparison, one process per run (`<db>`:
//!   an SQLite path or a `postgres://` URL), as
//!   `apalis-peer drain|latency` is the other.
//! - `peer-bench pg-compare <leash-work.wasm> <apalis-peer> <graphile-peer-dir> <out-dir> [--quick]`
//!   and `peer-bench pg-stress <leash-work.wasm> <out-dir> [--quick] [idle] [overload] [backlog]`
//!   are the PostgreSQL benchmarks (see `pg.rs`).

mod pg;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leash::job::{JobId, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::{Allocator, NoObserver, RunLimits, RunRequest, Sandbox, SandboxConfig, StopHandle};
use leash::store::Durability;
use serde_json::{Value, json};

const WORKERS: usize = 16;
const APALIS_BATCH: usize = 64;
const LATENCY_RATE: f64 = 500.0;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // Every mode but queue-leash: `--quick` anywhere, paths in order.
    let quick = args.iter().any(|a| a == "--quick");
    let paths: Vec<&Path> = args.iter().skip(2).filter(|a| !a.starts_with("--")).map(Path::new).collect();
    match args.get(1).map(String::as_str) {
        Some("queue-leash") => tokio.block_on(queue_leash(&args[2..])),
        Some("compare") => {
            anyhow::ensure!(
                paths.len() == 4,
                "usage: peer-bench compare <leash.wasm> <extism.wasm> <apalis-peer> <out-dir> [--quick]"
            );
            compare(paths[0], paths[1], paths[2], paths[3], quick)
        }
        Some("pg-compare") => {
            anyhow::ensure!(
                paths.len() == 4,
                "usage: peer-bench pg-compare <leash.wasm> <apalis-peer> <graphile-peer-dir> <out-dir> [--quick]"
            );
            tokio.block_on(pg::compare(paths[0], paths[1], paths[2], paths[3], quick))
        }
        Some("pg-stress") => {
            anyhow::ensure!(
                paths.len() >= 2,
                "usage: peer-bench pg-stress <leash.wasm> <out-dir> [--quick] [idle] [overload] [backlog]"
            );
            let only: Vec<String> = paths[2..].iter().map(|p| p.display().to_string()).collect();
            tokio.block_on(pg::stress(paths[0], paths[1], quick, &only))
        }
        _ => anyhow::bail!("usage: peer-bench compare|queue-leash|pg-compare|pg-stress ..."),
    }
}

// ---- statistics ----

/// Median, min and max of one figure over the alternating runs.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(mut values: Vec<f64>) -> Spread {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    let median = if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 };
    Spread { median, min: values[0], max: values[values.len() - 1] }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

// ---- plugin runtimes ----

struct LeashCaller {
    tokio: tokio::runtime::Runtime,
    sandbox: Sandbox,
    plugin: leash::sandbox::Plugin,
}

impl LeashCaller {
    fn new(bytes: &[u8]) -> anyhow::Result<Self> {
        let config =
            SandboxConfig { allocator: Allocator::Pooling { slots: 4 }, cache_dir: None, ..SandboxConfig::default() };
        let sandbox = Sandbox::new(config)?;
        let plugin = sandbox.load(bytes)?;
        let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(LeashCaller { tokio, sandbox, plugin })
    }

    /// One call in a fresh store and instance: the only way leash runs a job.
    fn call(&self, work: &str, input: &[u8]) -> Vec<u8> {
        let request = RunRequest::new(Target::action(work).expect("action name"), input.to_vec(), RunLimits::default());
        let outcome =
            self.tokio.block_on(self.sandbox.run(&self.plugin, request, &StopHandle::new(), Arc::new(NoObserver)));
        outcome.result.unwrap_or_else(|f| panic!("leash {work}: {f:?}"))
    }
}

struct ExtismCaller {
    compiled: extism::CompiledPlugin,
    reused: extism::Plugin,
}

impl ExtismCaller {
    fn new(bytes: &[u8]) -> anyhow::Result<Self> {
        let manifest = extism::Manifest::new([extism::Wasm::data(bytes.to_vec())]);
        // Compile once (Extism's documented way to make many instances).
        let compiled = extism::CompiledPlugin::new(extism::PluginBuilder::new(manifest).with_wasi(false))?;
        let reused = extism::Plugin::new_from_compiled(&compiled)?;
        Ok(ExtismCaller { compiled, reused })
    }

    /// A fresh instance per call: the isolation a job runner needs.
    fn call_fresh(&self, work: &str, input: &[u8]) -> Vec<u8> {
        let mut plugin = extism::Plugin::new_from_compiled(&self.compiled).expect("instantiate");
        plugin.call::<&[u8], Vec<u8>>(work, input).unwrap_or_else(|e| panic!("extism {work}: {e}"))
    }

    /// One instance, called again and again.
    fn call_reused(&mut self, work: &str, input: &[u8]) -> Vec<u8> {
        self.reused.call::<&[u8], Vec<u8>>(work, input).unwrap_or_else(|e| panic!("extism {work}: {e}"))
    }
}

/// Mean microseconds per call over `n` calls.
fn per_call(n: usize, mut call: impl FnMut() -> Vec<u8>) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(call());
    }
    start.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn plugin_figures(leash_wasm: &Path, extism_wasm: &Path, runs: usize, quick: bool) -> anyhow::Result<Value> {
    let leash = LeashCaller::new(&std::fs::read(leash_wasm)?)?;
    let mut extism = ExtismCaller::new(&std::fs::read(extism_wasm)?)?;

    // ~10 ms of CPU work, calibrated on leash and given to both.
    let probe = 2_000_000u64;
    let t = per_call(3, || leash.call("cpu", probe.to_string().as_bytes()));
    let rounds = ((probe as f64) * 10_000.0 / t) as u64;
    let cases: [(&str, &str, Vec<u8>, usize); 3] = [
        ("echo_1k", "echo", vec![b'x'; 1024], if quick { 300 } else { 2000 }),
        ("json_10k", "transform", bench_work::sample_document(), if quick { 200 } else { 1000 }),
        ("cpu_10ms", "cpu", rounds.to_string().into_bytes(), if quick { 10 } else { 40 }),
    ];
    let mut out = serde_json::Map::new();
    for (name, work, input, n) in cases {
        let expected = leash.call(work, &input);
        assert_eq!(extism.call_fresh(work, &input), expected, "{name}: the two plugins disagree");
        // Warm both.
        per_call(n / 10 + 1, || leash.call(work, &input));
        per_call(n / 10 + 1, || extism.call_fresh(work, &input));
        per_call(n / 10 + 1, || extism.call_reused(work, &input));
        let (mut l, mut ef, mut er) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            l.push(per_call(n, || leash.call(work, &input)));
            ef.push(per_call(n, || extism.call_fresh(work, &input)));
            er.push(per_call(n, || extism.call_reused(work, &input)));
        }
        let (l, ef, er) = (spread(l), spread(ef), spread(er));
        eprintln!(
            "  {name}: leash {:.1} µs, extism fresh {:.1} µs, extism reused {:.1} µs",
            l.median, ef.median, er.median
        );
        out.insert(
            name.into(),
            json!({ "calls_per_run": n, "input_bytes": input.len(), "leash_fresh_us": l, "extism_fresh_us": ef,
                    "extism_reused_us": er, "ratio_fresh": l.median / ef.median }),
        );
    }
    out.insert("cpu_rounds".into(), json!(rounds));
    Ok(Value::Object(out))
}

// ---- job queues ----

/// The sandbox of a leash queue run: one pooled slot per worker, and a
/// compile cache shared by every run.
fn queue_sandbox(workers: usize) -> SandboxConfig {
    SandboxConfig {
        allocator: Allocator::Pooling { slots: workers as u32 },
        cache_dir: Some(std::env::temp_dir().join("leash-peer-bench-cache")),
        ..SandboxConfig::default()
    }
}

async fn queue_leash(args: &[String]) -> anyhow::Result<()> {
    let arg = |i: usize| args.get(i).map(String::as_str).ok_or_else(|| anyhow::anyhow!("missing argument {i}"));
    // An SQLite path or a `postgres://` URL.
    let (mode, db, wasm) = (arg(0)?, leash::store::Database::parse(arg(1)?), std::fs::read(arg(2)?)?);
    let workers: usize = arg(if mode == "drain" { 4 } else { 5 })?.parse()?;
    let sandbox = queue_sandbox(workers);
    let builder = || {
        Runtime::builder(db.clone())
            .durability(Durability::Normal)
            .sandbox(sandbox.clone())
            .max_workers(workers)
            .max_queued(u64::MAX)
            .poll_interval(Duration::from_millis(50))
    };
    let job = |digest| Submit::new(PluginSource::Digest(digest), Target::action("echo").unwrap(), b"x".to_vec());
    match mode {
        "drain" => {
            let jobs: usize = arg(3)?.parse()?;
            // Enqueue with no workers, so the drain starts from a full queue.
            let filler = builder().without_workers().build().await?;
            let digest = filler.plugin_add(wasm.clone()).await?;
            let enqueue = Instant::now();
            for chunk in (0..jobs).collect::<Vec<_>>().chunks(1000) {
                filler.submit_many(chunk.iter().map(|_| job(digest)).collect()).await?;
            }
            let enqueue_per_s = jobs as f64 / enqueue.elapsed().as_secs_f64();
            filler.shutdown().await;
            drop(filler);
            let done = Arc::new((std::sync::atomic::AtomicUsize::new(0), tokio::sync::Notify::new()));
            let start = Instant::now();
            let counter = done.clone();
            // Subscribed before the workers start, so no completion is missed.
            let runtime = builder()
                .on_complete(move |_| {
                    if counter.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == jobs {
                        counter.1.notify_one();
                    }
                })
                .build()
                .await?;
            let all = done.1.notified();
            tokio::pin!(all);
            if done.0.load(std::sync::atomic::Ordering::SeqCst) < jobs {
                all.await;
            }
            let seconds = start.elapsed().as_secs_f64();
            runtime.shutdown().await;
            println!(
                "{}",
                json!({ "jobs": jobs, "seconds": seconds, "jobs_per_s": jobs as f64 / seconds, "enqueue_per_s": enqueue_per_s })
            );
        }
        "latency" => {
            let (rate, seconds): (f64, f64) = (arg(3)?.parse()?, arg(4)?.parse()?);
            let jobs = (rate * seconds) as usize;
            let runtime = builder().build().await?;
            let digest = runtime.plugin_add(wasm).await?;
            let starts: Arc<Mutex<HashMap<JobId, Instant>>> = Arc::default();
            let seen = starts.clone();
            runtime.on_start(move |s| {
                seen.lock().unwrap().insert(s.id, Instant::now());
            });
            // Open loop: each submit starts at its own time, whether or not
            // the ones before it have answered, so the load is the rate
            // asked however long a submit takes. Its latency counts from
            // the submit's start (a wait for a pooled connection included).
            let gap = Duration::from_secs_f64(1.0 / rate);
            let mut next = tokio::time::Instant::now();
            let began = Instant::now();
            let mut submits = tokio::task::JoinSet::new();
            for _ in 0..jobs {
                tokio::time::sleep_until(next).await;
                next += gap;
                let at = Instant::now();
                let (runtime, job) = (runtime.clone(), job(digest));
                submits.spawn(async move { runtime.submit(job).await.map(|id| (id, at, at.elapsed())) });
            }
            let mut sent = Vec::with_capacity(jobs);
            while let Some(submitted) = submits.join_next().await {
                sent.push(submitted??);
            }
            // The rate reached: below the one asked only if the submits
            // could not keep up at all.
            let submitted_per_s = jobs as f64 / began.elapsed().as_secs_f64();
            for (id, _, _) in &sent {
                runtime.wait(*id, Duration::from_secs(60)).await?;
            }
            runtime.shutdown().await;
            let starts = starts.lock().unwrap();
            let latencies: Vec<u64> =
                sent.iter().map(|(id, at, _)| starts[id].saturating_duration_since(*at).as_micros() as u64).collect();
            // How long each submit took to answer (part of its latency).
            let answers: Vec<u64> = sent.iter().map(|(_, _, took)| took.as_micros() as u64).collect();
            println!(
                "{}",
                json!({ "latencies_us": latencies, "submit_us": answers, "submitted_per_s": submitted_per_s })
            );
        }
        other => anyhow::bail!("unknown queue-leash mode {other:?}"),
    }
    Ok(())
}

fn run_json(command: &mut Command) -> anyhow::Result<Value> {
    let output = command.output()?;
    anyhow::ensure!(output.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout)?;
    let last = stdout.lines().last().unwrap_or_default();
    Ok(serde_json::from_str(last)?)
}

fn queue_figures(
    leash_wasm: &Path,
    apalis: &Path,
    runs: usize,
    quick: bool,
) -> anyhow::Result<(Value, Vec<f64>, Vec<f64>)> {
    let me = std::env::current_exe()?;
    let mut out = serde_json::Map::new();
    let sizes: &[usize] = if quick { &[10_000] } else { &[10_000, 100_000] };
    for &jobs in sizes {
        let (mut l, mut a, mut le, mut ae) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for run in 0..runs {
            let dir = tempfile::tempdir()?;
            let leash = run_json(
                Command::new(&me)
                    .args(["queue-leash", "drain"])
                    .arg(dir.path().join("leash.db"))
                    .arg(leash_wasm)
                    .args([jobs.to_string(), WORKERS.to_string()]),
            )?;
            let peer = run_json(Command::new(apalis).arg("drain").arg(dir.path().join("apalis.db")).args([
                jobs.to_string(),
                WORKERS.to_string(),
                APALIS_BATCH.to_string(),
            ]))?;
            eprintln!(
                "  drain {jobs} run {run}: leash {:.0} jobs/s, apalis {:.0} jobs/s",
                leash["jobs_per_s"], peer["jobs_per_s"]
            );
            l.push(leash["jobs_per_s"].as_f64().unwrap_or(0.0));
            a.push(peer["jobs_per_s"].as_f64().unwrap_or(0.0));
            le.push(leash["enqueue_per_s"].as_f64().unwrap_or(0.0));
            ae.push(peer["enqueue_per_s"].as_f64().unwrap_or(0.0));
        }
        let (l, a) = (spread(l), spread(a));
        out.insert(
            format!("drain_{jobs}"),
            json!({ "leash_jobs_per_s": l, "apalis_jobs_per_s": a, "ratio": l.median / a.median,
                    "leash_enqueue_per_s": spread(le), "apalis_enqueue_per_s": spread(ae) }),
        );
    }
    let seconds = if quick { 3.0 } else { 10.0 };
    let (mut l50, mut l99, mut a50, mut a99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut all_l, mut all_a) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let dir = tempfile::tempdir()?;
        let rate = LATENCY_RATE.to_string();
        let secs = seconds.to_string();
        let leash = run_json(
            Command::new(&me).args(["queue-leash", "latency"]).arg(dir.path().join("leash.db")).arg(leash_wasm).args([
                rate.as_str(),
                secs.as_str(),
                &WORKERS.to_string(),
            ]),
        )?;
        let peer = run_json(Command::new(apalis).arg("latency").arg(dir.path().join("apalis.db")).args([
            rate.as_str(),
            secs.as_str(),
            &WORKERS.to_string(),
            &APALIS_BATCH.to_string(),
        ]))?;
        let sorted = |v: &Value| {
            let mut xs: Vec<f64> =
                v["latencies_us"].as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
            xs.sort_by(f64::total_cmp);
            xs
        };
        let (ls, ps) = (sorted(&leash), sorted(&peer));
        eprintln!(
            "  latency run {run}: leash p50 {:.0} µs p99 {:.0} µs; apalis p50 {:.0} µs p99 {:.0} µs",
            percentile(&ls, 0.5),
            percentile(&ls, 0.99),
            percentile(&ps, 0.5),
            percentile(&ps, 0.99)
        );
        l50.push(percentile(&ls, 0.5));
        l99.push(percentile(&ls, 0.99));
        a50.push(percentile(&ps, 0.5));
        a99.push(percentile(&ps, 0.99));
        all_l.extend(ls);
        all_a.extend(ps);
    }
    let (l50, l99, a50, a99) = (spread(l50), spread(l99), spread(a50), spread(a99));
    out.insert(
        "latency".into(),
        json!({ "rate_per_s": LATENCY_RATE, "seconds": seconds, "leash_p50_us": l50, "leash_p99_us": l99,
                "apalis_p50_us": a50, "apalis_p99_us": a99, "ratio_p50": l50.median / a50.median, "ratio_p99": l99.median / a99.median }),
    );
    all_l.sort_by(f64::total_cmp);
    all_a.sort_by(f64::total_cmp);
    Ok((Value::Object(out), all_l, all_a))
}

// ---- report ----

fn compare(leash_wasm: &Path, extism_wasm: &Path, apalis: &Path, out_dir: &Path, quick: bool) -> anyhow::Result<()> {
    let runs = if quick { 3 } else { 5 };
    std::fs::create_dir_all(out_dir)?;
    eprintln!("plugin runtimes ({runs} alternating runs)");
    let plugins = plugin_figures(leash_wasm, extism_wasm, runs, quick)?;
    eprintln!("job queues ({runs} alternating runs, {WORKERS} workers)");
    let (queues, leash_lat, apalis_lat) = queue_figures(leash_wasm, apalis, runs, quick)?;
    let machine = json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "os": std::env::consts::OS,
        "durability": "WAL, synchronous=NORMAL (both)",
    });
    let settings = json!({
        "leash": { "version": env!("CARGO_PKG_VERSION"), "wasmtime": "48.0.8", "allocator": "pooling", "fuel": "counted",
                   "epoch": "1 ms ticks", "workers": WORKERS, "enqueue": "submit_many, batches of 1000" },
        "extism": { "version": "1.30.0", "wasmtime": "43", "instances": "CompiledPlugin once, Plugin::new_from_compiled per fresh call", "wasi": false, "fuel": "off (default)" },
        "apalis": { "version": "1.0.0", "apalis_sqlite": "1.0.0", "concurrency": WORKERS, "batch_size": APALIS_BATCH,
                    "fetch": "wake on each in-process push + 50 ms interval", "persist_results": true, "enqueue": "push_bulk, batches of 1000" },
    });
    let results = json!({ "quick": quick, "runs": runs, "machine": machine, "settings": settings, "plugins": plugins, "queues": queues });
    std::fs::write(out_dir.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    charts(out_dir, &queues, &leash_lat, &apalis_lat)?;
    print_table(&results);
    Ok(())
}

fn print_table(r: &Value) {
    let s = |v: &Value| {
        format!(
            "{:.1} ({:.1}–{:.1})",
            v["median"].as_f64().unwrap_or(0.0),
            v["min"].as_f64().unwrap_or(0.0),
            v["max"].as_f64().unwrap_or(0.0)
        )
    };
    println!("| figure | leash | peer | leash / peer |\n| --- | --- | --- | --- |");
    for (name, label) in
        [("echo_1k", "(a) echo 1 KiB"), ("json_10k", "(b) JSON ~10 KB transform"), ("cpu_10ms", "(c) CPU loop ~10 ms")]
    {
        let p = &r["plugins"][name];
        println!(
            "| {label}, fresh instance, µs/call | {} | Extism {} | {:.2} |",
            s(&p["leash_fresh_us"]),
            s(&p["extism_fresh_us"]),
            p["ratio_fresh"].as_f64().unwrap_or(0.0)
        );
        println!(
            "| {label}, reused instance, µs/call | n/a (a fresh instance per job) | Extism {} | |",
            s(&p["extism_reused_us"])
        );
    }
    for (key, label) in
        [("drain_10000", "drain 10k queued jobs, jobs/s"), ("drain_100000", "drain 100k queued jobs, jobs/s")]
    {
        let q = &r["queues"][key];
        if q.is_null() {
            continue;
        }
        println!(
            "| {label} | {} | apalis-sqlite {} | {:.2} |",
            s(&q["leash_jobs_per_s"]),
            s(&q["apalis_jobs_per_s"]),
            q["ratio"].as_f64().unwrap_or(0.0)
        );
    }
    let l = &r["queues"]["latency"];
    for p in ["p50", "p99"] {
        println!(
            "| enqueue→start {p} at {} jobs/s, µs | {} | apalis-sqlite {} | {:.2} |",
            l["rate_per_s"],
            s(&l[format!("leash_{p}_us")]),
            s(&l[format!("apalis_{p}_us")]),
            l[format!("ratio_{p}")].as_f64().unwrap_or(0.0)
        );
    }
}

fn charts(out_dir: &Path, queues: &Value, leash_lat: &[f64], apalis_lat: &[f64]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    // Jobs/s bars with min–max whiskers.
    let path = out_dir.join("peer-jobs-per-s.svg");
    let root = SVGBackend::new(&path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let keys: Vec<&str> = ["drain_10000", "drain_100000"].into_iter().filter(|k| !queues[*k].is_null()).collect();
    let top = keys
        .iter()
        .flat_map(|k| [queues[*k]["leash_jobs_per_s"]["max"].as_f64(), queues[*k]["apalis_jobs_per_s"]["max"].as_f64()])
        .flatten()
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption("Jobs/s draining a full queue (median, min–max)", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..(keys.len() as f64 * 3.0), 0.0..top)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).y_desc("jobs/s").draw()?;
    for (i, key) in keys.iter().enumerate() {
        for (j, (who, colour)) in [("leash_jobs_per_s", BLUE), ("apalis_jobs_per_s", RED)].into_iter().enumerate() {
            let x0 = i as f64 * 3.0 + 0.5 + j as f64;
            let v = &queues[*key][who];
            let (median, min, max) = (
                v["median"].as_f64().unwrap_or(0.0),
                v["min"].as_f64().unwrap_or(0.0),
                v["max"].as_f64().unwrap_or(0.0),
            );
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x0 + 0.9, median)],
                colour.mix(0.7).filled(),
            )))?;
            chart.draw_series(std::iter::once(PathElement::new(vec![(x0 + 0.45, min), (x0 + 0.45, max)], BLACK)))?;
            let label = format!("{} {}", if j == 0 { "leash" } else { "apalis" }, key.trim_start_matches("drain_"));
            chart.draw_series(std::iter::once(Text::new(label, (x0, median * 0.5), ("sans-serif", 13))))?;
        }
    }
    root.present()?;

    // Enqueue→start latency distribution (CDF, log-scale x).
    let path = out_dir.join("peer-latency.svg");
    let root = SVGBackend::new(&path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let hi = leash_lat.last().copied().unwrap_or(1.0).max(apalis_lat.last().copied().unwrap_or(1.0)).max(10.0);
    let mut chart = ChartBuilder::on(&root)
        .caption("Enqueue→start latency at a fixed moderate rate (CDF)", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((1.0..hi).log_scale(), 0.0..1.0)?;
    chart.configure_mesh().x_desc("µs (log)").y_desc("fraction of jobs").draw()?;
    for (name, data, colour) in [("leash", leash_lat, BLUE), ("apalis-sqlite", apalis_lat, RED)] {
        let n = data.len().max(1) as f64;
        let points =
            data.iter().enumerate().step_by((data.len() / 500).max(1)).map(|(i, v)| (v.max(1.0), (i + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(points, colour))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
