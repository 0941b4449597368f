//! Tiered compiling: a large plugin's first jobs run on the baseline
//! compiler's code while the optimizing compiler works behind them, and
//! its code takes over; both tiers' code is cached.

use std::sync::Arc;
use std::time::Duration;

use leash::job::ErrorKind;
use leash::sandbox::{
    Allocator, Compiler, NoObserver, Outcome, Plugin, RunLimits, Sandbox, SandboxConfig, StopHandle, Tier,
};

use crate::support::{self, GENEROUS, limits, output_json, request};

/// A tiered sandbox caching in `cache` that starts every component (the
/// small test plugins too) on the baseline tier.
fn tiered(cache: &std::path::Path) -> Arc<Sandbox> {
    let config = SandboxConfig {
        compiler: Compiler::Tiered,
        allocator: Allocator::Pooling { slots: 4 },
        baseline_first_bytes: 0,
        cache_dir: Some(cache.to_owned()),
        ..support::sandbox_config()
    };
    Arc::new(Sandbox::new(config).unwrap())
}

async fn greet(sandbox: &Sandbox, plugin: &Plugin) -> Outcome {
    let outcome =
        sandbox.run(plugin, request(br#"{"name":"Ada"}"#, limits()), &StopHandle::new(), Arc::new(NoObserver)).await;
    assert_eq!(output_json(&outcome)["greeting"], "Hello, Ada!");
    outcome
}

#[tokio::test]
async fn a_plugins_first_jobs_run_baseline_code_and_later_ones_the_optimized_code() {
    let cache = tempfile::tempdir().unwrap();
    let sandbox = tiered(cache.path());
    let bytes = Arc::new(leash_tests::plugin_bytes("hello"));
    let hold = sandbox.hold_optimizing().await.expect("tiered");

    let plugin = sandbox.compile(bytes.clone()).await.unwrap();
    assert_eq!((plugin.loaded().tier, plugin.loaded().from_cache), (Tier::Baseline, false));
    assert_eq!(greet(&sandbox, &plugin).await.usage.tier, Tier::Baseline);
    // A second load meanwhile (the first job after `plugins add`) shares
    // the baseline code rather than compiling again.
    let again = sandbox.compile(bytes.clone()).await.unwrap();
    assert_eq!(again.loaded(), plugin.loaded());

    drop(hold);
    sandbox.optimized().await;
    assert_eq!((plugin.tier(), again.tier()), (Tier::Optimized, Tier::Optimized));
    assert_eq!(greet(&sandbox, &plugin).await.usage.tier, Tier::Optimized);

    // Another process on the same cache starts from the optimized code.
    let next = tiered(cache.path()).compile(bytes).await.unwrap();
    assert_eq!((next.loaded().tier, next.loaded().from_cache), (Tier::Optimized, true));
}

#[tokio::test]
async fn a_process_that_ends_before_its_optimized_code_leaves_its_baseline_code_cached() {
    let cache = tempfile::tempdir().unwrap();
    let bytes = Arc::new(leash_tests::plugin_bytes("hello"));
    let sandbox = tiered(cache.path());
    let hold = sandbox.hold_optimizing().await.expect("tiered");
    let plugin = sandbox.compile(bytes.clone()).await.unwrap();
    greet(&sandbox, &plugin).await;
    // What `leash run` does before it exits; then the process is gone
    // before its optimizing compile got its turn.
    sandbox.cached().await;
    drop((plugin, sandbox));
    drop(hold);

    let sandbox = tiered(cache.path());
    let plugin = sandbox.compile(bytes.clone()).await.unwrap();
    assert_eq!((plugin.loaded().tier, plugin.loaded().from_cache), (Tier::Baseline, true));
    assert_eq!(greet(&sandbox, &plugin).await.usage.tier, Tier::Baseline);
    // And this one finishes the optimizing compile the first never did.
    sandbox.optimized().await;
    assert_eq!(greet(&sandbox, &plugin).await.usage.tier, Tier::Optimized);
}

#[tokio::test]
async fn small_components_and_single_compilers_do_not_tier() {
    let cache = tempfile::tempdir().unwrap();
    let bytes = Arc::new(leash_tests::plugin_bytes("hello"));
    let config = |compiler, baseline_first_bytes| SandboxConfig {
        compiler,
        baseline_first_bytes,
        cache_dir: Some(cache.path().to_owned()),
        ..support::sandbox_config()
    };
    let small = Arc::new(Sandbox::new(config(Compiler::Tiered, bytes.len() + 1)).unwrap());
    assert_eq!(small.compile(bytes.clone()).await.unwrap().loaded().tier, Tier::Optimized);
    let cranelift = Arc::new(Sandbox::new(config(Compiler::Cranelift, 0)).unwrap());
    assert!(cranelift.hold_optimizing().await.is_none());
    assert_eq!(cranelift.compile(bytes.clone()).await.unwrap().loaded().tier, Tier::Optimized);
    let winch = Arc::new(Sandbox::new(config(Compiler::Winch, 0)).unwrap());
    let plugin = winch.compile(bytes).await.unwrap();
    assert_eq!(plugin.loaded().tier, Tier::Baseline);
    winch.optimized().await;
    assert_eq!(greet(&winch, &plugin).await.usage.tier, Tier::Baseline, "Winch alone never replaces its code");
}

/// The baseline tier's engine of a tiered sandbox (its own epoch ticks,
/// fuel and pool) keeps a job's limits.
#[tokio::test]
async fn jobs_on_baseline_code_keep_their_limits() {
    let cache = tempfile::tempdir().unwrap();
    let sandbox = tiered(cache.path());
    let _hold = sandbox.hold_optimizing().await.expect("tiered");
    let run = async |name: &str, limits: RunLimits| {
        let plugin = sandbox.compile(Arc::new(leash_tests::plugin_bytes(name))).await.unwrap();
        let outcome = sandbox.run(&plugin, request(b"", limits), &StopHandle::new(), Arc::new(NoObserver)).await;
        assert_eq!(outcome.usage.tier, Tier::Baseline, "{name}");
        outcome
    };
    let kind = |outcome: &Outcome| outcome.result.as_ref().unwrap_err().kind;
    let timeout = Duration::from_millis(200);
    let outcome = run("spin", RunLimits { timeout, ..limits() }).await;
    assert_eq!(kind(&outcome), ErrorKind::Timeout);
    assert!(outcome.usage.duration < GENEROUS, "{:?}", outcome.usage.duration);
    let fuel = 50_000_000;
    let outcome = run("spin", RunLimits { fuel: Some(fuel), ..limits() }).await;
    assert_eq!((kind(&outcome), outcome.usage.fuel_used), (ErrorKind::OutOfFuel, fuel));
    let memory = 32 << 20;
    let outcome = run("alloc-bomb", RunLimits { memory_bytes: memory, ..limits() }).await;
    assert_eq!(kind(&outcome), ErrorKind::MemoryLimit);
    assert!(outcome.usage.peak_memory_bytes <= memory);
}
