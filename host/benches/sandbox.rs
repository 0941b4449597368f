//! Sandbox benchmark: prints figures and ratios measured in one process.
//!
//! Run with `cargo bench -p leash --bench sandbox` (add `-- --quick` for a
//! short run). Figures vary between runs on a noisy machine; the ratios
//! against baselines measured in the same run are what to compare.
//!
//! 1. Trivial-call rate (fresh store + instantiate + call of `echo`):
//!    leash pooled, leash on-demand, and a bare wasmtime loop.
//! 2. Timeout overshoot of `spin` (p50/p99).
//! 3. Cooperative (`coop`) and forced (`spin`, `sleep`) cancel latency.
//! 4. Epoch and fuel overhead on the CPU-bound `cpu` plugin.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leash::job::Target;
use leash::sandbox::{
    Allocator, NoObserver, Progress, RunLimits, RunObserver, RunRequest, Sandbox, SandboxConfig, StopHandle,
};
use wasmtime::component::{Component, ComponentType, Lift, Linker, Lower, ResourceTable, TypedFunc};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

#[path = "support/mod.rs"]
mod support;
use support::{ms, percentile};

fn request(input: &[u8], limits: RunLimits) -> RunRequest {
    RunRequest::new(Target::Execute, input.to_vec(), limits)
}

// ---- a bare wasmtime embedding of the same world, as the baseline ----

#[derive(ComponentType, Lower)]
#[component(variant)]
enum BareTarget {
    #[component(name = "execute")]
    Execute,
    #[allow(dead_code, reason = "part of the WIT variant; the benchmark uses execute")]
    #[component(name = "apply")]
    Apply,
    #[allow(dead_code, reason = "part of the WIT variant; the benchmark uses execute")]
    #[component(name = "action")]
    Action(String),
}

#[derive(ComponentType, Lower)]
#[component(record)]
struct BareContext {
    #[component(name = "job-id")]
    job_id: String,
    target: BareTarget,
    attempt: u32,
    #[component(name = "deadline-unix-ms")]
    deadline_unix_ms: u64,
}

#[derive(ComponentType, Lift, Debug)]
#[component(variant)]
#[allow(dead_code, reason = "the messages are read through Debug when a call fails")]
enum BareError {
    #[component(name = "failed")]
    Failed(String),
    #[component(name = "invalid-input")]
    InvalidInput(String),
    #[component(name = "retryable")]
    Retryable(String),
}

struct BareState {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for BareState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

type RunFunc = TypedFunc<(BareContext, Vec<u8>), (Result<Vec<u8>, BareError>,)>;

/// wasmtime with nothing of leash: WASI with nothing granted, the plugin's
/// host imports stubbed as traps (the benchmarked guests never call them).
struct Bare {
    engine: Engine,
    pre: wasmtime::component::InstancePre<BareState>,
    epoch: bool,
    fuel: bool,
}

impl Bare {
    fn new(bytes: &[u8], pooling: bool, epoch: bool, fuel: bool) -> Self {
        let mut config = Config::new();
        config.epoch_interruption(epoch).consume_fuel(fuel);
        if pooling {
            let mut pool = PoolingAllocationConfig::new();
            pool.total_component_instances(64)
                .total_core_instances(512)
                .total_memories(128)
                .total_tables(256)
                .total_stacks(64)
                .max_memory_size(1 << 30);
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&config).unwrap();
        let component = Component::new(&engine, bytes).unwrap();
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        linker.define_unknown_imports_as_traps(&component).unwrap();
        let pre = linker.instantiate_pre(&component).unwrap();
        Bare { engine, pre, epoch, fuel }
    }

    async fn call(&self, input: &[u8]) -> Vec<u8> {
        let wasi = WasiCtxBuilder::new().build();
        let mut store = Store::new(&self.engine, BareState { wasi, table: ResourceTable::new() });
        if self.fuel {
            store.set_fuel(u64::MAX).unwrap();
        }
        if self.epoch {
            store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Yield(1)));
            store.set_epoch_deadline(1);
        }
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let run: RunFunc = instance.get_typed_func(&mut store, "run").unwrap();
        let ctx = BareContext { job_id: String::new(), target: BareTarget::Execute, attempt: 1, deadline_unix_ms: 0 };
        let (result,) = run.call_async(&mut store, (ctx, input.to_vec())).await.unwrap();
        result.unwrap()
    }
}

/// An epoch ticker for the bare engines, like the sandbox's own.
fn tick(engine: Engine) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(1));
            engine.increment_epoch();
        }
    });
}

/// Calls per second of `f` over `n` sequential calls.
async fn rate<F, Fut>(n: usize, mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let start = Instant::now();
    for _ in 0..n {
        f().await;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

struct FirstProgress(tokio::sync::mpsc::UnboundedSender<()>);

impl RunObserver for FirstProgress {
    fn on_progress(&self, _: &Progress) {
        let _ = self.0.send(());
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 1 } else { 5 };
    let echo = leash_tests::plugin_bytes("echo");
    let cpu = leash_tests::plugin_bytes("cpu");
    let pooled = Arc::new(Sandbox::new(SandboxConfig::default()).unwrap());
    let on_demand =
        Arc::new(Sandbox::new(SandboxConfig { allocator: Allocator::OnDemand, ..SandboxConfig::default() }).unwrap());
    println!("leash sandbox benchmark ({} mode)\n", if quick { "quick" } else { "full" });

    // 1. Trivial-call rate.
    let n = 2_000 * scale;
    let bare = Bare::new(&echo, true, false, false);
    let bare_full = Bare::new(&echo, true, true, true);
    tick(bare_full.engine.clone());
    let echo_pooled = pooled.load(&echo).unwrap();
    let echo_on_demand = on_demand.load(&echo).unwrap();
    let limits = RunLimits::default();
    let stop = StopHandle::new();
    let observer: Arc<dyn RunObserver> = Arc::new(NoObserver);
    let (mut bare_rate, mut bare_full_rate, mut pooled_rate, mut on_demand_rate) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    // Alternate the contenders so drift in machine load hits each alike.
    for _ in 0..3 {
        bare_rate = bare_rate.max(
            rate(n, || async {
                bare.call(b"x").await;
            })
            .await,
        );
        bare_full_rate = bare_full_rate.max(
            rate(n, || async {
                bare_full.call(b"x").await;
            })
            .await,
        );
        pooled_rate = pooled_rate.max(
            rate(n, || async {
                let o = pooled.run(&echo_pooled, request(b"x", limits.clone()), &stop, observer.clone()).await;
                assert!(o.result.is_ok());
            })
            .await,
        );
        on_demand_rate = on_demand_rate.max(
            rate(n, || async {
                let o = on_demand.run(&echo_on_demand, request(b"x", limits.clone()), &stop, observer.clone()).await;
                assert!(o.result.is_ok());
            })
            .await,
        );
    }
    println!("1. trivial call (fresh store + instantiate + call `echo`), best of 3 x {n} calls, one thread");
    println!("   bare wasmtime, pooling, no fuel/epoch  {bare_rate:>9.0} calls/s   (baseline)");
    println!(
        "   bare wasmtime, pooling, fuel + epoch   {bare_full_rate:>9.0} calls/s   {:.2}x baseline",
        bare_full_rate / bare_rate
    );
    println!(
        "   leash sandbox, pooling                 {pooled_rate:>9.0} calls/s   {:.2}x baseline (baseline/leash = {:.2})",
        pooled_rate / bare_rate,
        bare_rate / pooled_rate
    );
    println!(
        "   leash sandbox, on-demand               {on_demand_rate:>9.0} calls/s   {:.2}x pooled\n",
        on_demand_rate / pooled_rate
    );

    // 2. Timeout overshoot.
    let spin = pooled.load(&leash_tests::plugin_bytes("spin")).unwrap();
    let timeout = Duration::from_millis(20);
    let runs = if quick { 50 } else { 200 };
    let mut overshoot = Vec::with_capacity(runs);
    for _ in 0..runs {
        let o = pooled
            .run(&spin, request(b"", RunLimits { timeout, ..RunLimits::default() }), &stop, observer.clone())
            .await;
        assert_eq!(o.error_kind(), Some(leash::job::ErrorKind::Timeout));
        overshoot.push(o.usage.duration.saturating_sub(timeout));
    }
    overshoot.sort();
    println!("2. timeout overshoot, `spin` with a {timeout:?} timeout, {runs} runs");
    println!(
        "   p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms\n",
        ms(percentile(&overshoot, 0.5)),
        ms(percentile(&overshoot, 0.99)),
        ms(*overshoot.last().unwrap())
    );

    // 3. Cancel latency.
    let coop = pooled.load(&leash_tests::plugin_bytes("coop")).unwrap();
    let sleep = pooled.load(&leash_tests::plugin_bytes("sleep")).unwrap();
    let runs = if quick { 20 } else { 50 };
    let (mut cooperative, mut forced_spin, mut forced_sleep) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let stop = StopHandle::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let run = pooled.run(&coop, request(b"", RunLimits::default()), &stop, Arc::new(FirstProgress(tx)));
        let cancel = async {
            rx.recv().await;
            stop.request();
            Instant::now()
        };
        let (o, asked) = tokio::join!(run, cancel);
        assert_eq!(o.error_kind(), Some(leash::job::ErrorKind::Cancelled));
        cooperative.push(asked.elapsed());

        for (plugin, into) in [(&spin, &mut forced_spin), (&sleep, &mut forced_sleep)] {
            let stop = StopHandle::new();
            let run = pooled.run(plugin, request(b"", RunLimits::default()), &stop, observer.clone());
            let cancel = async {
                // Benchmark only: give the guest time to be deep in its loop or sleep.
                tokio::time::sleep(Duration::from_millis(5)).await;
                stop.force();
                Instant::now()
            };
            let (o, asked) = tokio::join!(run, cancel);
            assert_eq!(o.error_kind(), Some(leash::job::ErrorKind::Cancelled));
            into.push(asked.elapsed());
        }
    }
    println!("3. cancel latency (request to outcome), {runs} runs each");
    for (name, mut samples) in [
        ("cooperative, `coop`", cooperative),
        ("forced, `spin` (computing)", forced_spin),
        ("forced, `sleep` (in a WASI sleep)", forced_sleep),
    ] {
        samples.sort();
        println!(
            "   {name:<36} p50 {:.3} ms   p99 {:.3} ms",
            ms(percentile(&samples, 0.5)),
            ms(percentile(&samples, 0.99))
        );
    }
    println!();

    // 4. Epoch and fuel overhead on CPU-bound work.
    let input = br#"{"rounds": 400}"#;
    let contenders = [
        ("neither", Bare::new(&cpu, true, false, false)),
        ("epoch", Bare::new(&cpu, true, true, false)),
        ("fuel", Bare::new(&cpu, true, false, true)),
        ("epoch + fuel", Bare::new(&cpu, true, true, true)),
    ];
    for (_, bare) in &contenders[1..] {
        if bare.epoch {
            tick(bare.engine.clone());
        }
    }
    let cpu_plugin = pooled.load(&cpu).unwrap();
    let reps = 3 * scale;
    let mut best = [Duration::MAX; 5];
    for _ in 0..reps {
        for (i, (_, bare)) in contenders.iter().enumerate() {
            let start = Instant::now();
            bare.call(input).await;
            best[i] = best[i].min(start.elapsed());
        }
        let start = Instant::now();
        let o = pooled.run(&cpu_plugin, request(input, RunLimits::default()), &stop, observer.clone()).await;
        assert!(o.result.is_ok());
        best[4] = best[4].min(start.elapsed());
    }
    println!("4. CPU-bound `cpu` (400 rounds), best of {reps}, overhead vs neither");
    for (i, name) in [
        "bare, neither",
        "bare, epoch",
        "bare, fuel",
        "bare, epoch + fuel",
        "leash sandbox (epoch + fuel + yield each tick)",
    ]
    .iter()
    .enumerate()
    {
        println!(
            "   {name:<48} {:>8.2} ms   {:+.1}%",
            ms(best[i]),
            (best[i].as_secs_f64() / best[0].as_secs_f64() - 1.0) * 100.0
        );
    }
}
