//! Tiered compiling ([`Compiler::Tiered`](super::Compiler::Tiered)): a large component's first jobs run on code from
//! wasmtime's baseline compiler (Winch, one pass, several times quicker to
//! compile), while Cranelift compiles it behind them; its optimized code
//! then takes over for every later job of the plugin.
//!
//! The baseline engine differs from the optimizing one in its compiler
//! only: the same proposals, fuel, epoch interruption and instance pool
//! (one of its own, of the same slots: it reserves address space again,
//! not memory), so every limit of a job holds the same on either tier, and
//! a component the pool could not hold is refused at load on either. Its
//! code is cached on disk under its own engine hash, so a process that ends
//! before the optimized code is ready (a `leash run`) starts the next one
//! from it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, InstanceAllocationStrategy, Strategy};

use crate::job::Digest;
use crate::sandbox::cache::CompileCache;
use crate::sandbox::engine::{Allocator, Share, Tier, link, linker_for, pooling, shared_config};
use crate::sandbox::state::HostState;
use crate::sandbox::{Loaded, Plugin, Sandbox, SandboxConfig, SandboxError, behind, one_line};

/// Default of [`SandboxConfig::baseline_first_bytes`]: under
/// [`Compiler::Tiered`](super::Compiler::Tiered), components this size or
/// larger start on the baseline tier. A Rust guest (~0.1-2 MB) compiles with Cranelift in under
/// a few hundred milliseconds; a Python (~19 MB) or JavaScript (~13 MB) one
/// takes seconds.
pub const BASELINE_FIRST_BYTES: usize = 1 << 20;

/// The baseline compiler's engine and what it keeps.
pub(super) struct Baseline {
    pub(super) engine: Engine,
    linker: Linker<HostState>,
    cache: Option<CompileCache>,
    /// Plugins on baseline code whose optimized code is being made: a load
    /// of the same digest meanwhile (a job after `plugins add`) shares it
    /// rather than compiling again.
    pending: Mutex<HashMap<Digest, Plugin>>,
    /// How many plugins are waiting for their optimized code.
    waiting: tokio::sync::watch::Sender<usize>,
    /// How many baseline compiles are still being written to the cache.
    writing: tokio::sync::watch::Sender<usize>,
    /// One optimizing compile behind the jobs at a time.
    optimizing: Arc<tokio::sync::Mutex<()>>,
}

impl Baseline {
    pub(super) fn new(config: &SandboxConfig) -> Result<Baseline, SandboxError> {
        let engine_err = |e: wasmtime::Error| SandboxError::Engine(format!("baseline compiler: {}", one_line(&e)));
        let mut wasm = shared_config(config);
        wasm.strategy(Strategy::Winch);
        let mut engine = None;
        if let Allocator::Pooling { slots } = config.allocator {
            let mut pooled = wasm.clone();
            pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(slots, config)?));
            engine = Engine::new(&pooled)
                .inspect_err(|e| {
                    tracing::warn!(
                        error = %one_line(e),
                        "cannot reserve a second instance pool for the baseline tier; its instances are allocated \
                         on demand, so a component whose nested instantiations pass the caps is refused at its \
                         first job rather than when it is loaded"
                    )
                })
                .ok();
        }
        let engine = match engine {
            Some(engine) => engine,
            None => Engine::new(&wasm).map_err(engine_err)?,
        };
        let linker = linker_for(&engine).map_err(engine_err)?;
        let cache = config.cache_dir.as_deref().map(|dir| CompileCache::new(dir, &engine));
        Ok(Baseline {
            engine,
            linker,
            cache,
            pending: Mutex::default(),
            waiting: tokio::sync::watch::Sender::new(0),
            writing: tokio::sync::watch::Sender::new(0),
            optimizing: Arc::default(),
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, Plugin>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Sandbox {
    /// Load a component for [`Sandbox::compile`]: on the baseline tier
    /// first when that applies ([`Compiler::Tiered`]), else with this
    /// sandbox's own compiler.
    pub(super) fn load_tiered(self: &Arc<Self>, bytes: Arc<Vec<u8>>) -> Result<Plugin, SandboxError> {
        let admitted = self.admit(&bytes)?;
        let digest = admitted.digest;
        let started = Instant::now();
        let Some(baseline) = self.baseline.as_ref().filter(|_| bytes.len() >= self.config.baseline_first_bytes) else {
            return self.load_optimized(&bytes, admitted, started);
        };
        if let Some(plugin) = baseline.pending().get(&digest) {
            return Ok(plugin.clone());
        }
        if let Some((component, kept)) = self.kept_code(&digest) {
            return self.optimized_plugin(admitted, &component, Some(kept), None, started);
        }
        let cached = baseline.cache.as_ref().and_then(|c| c.get(&baseline.engine, &digest));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => match self.compile_on(&baseline.engine, &bytes) {
                Ok(component) => component,
                // Over a cap, or not a component at all: Cranelift would
                // say the same.
                Err(refused @ (SandboxError::CompileLimit(_) | SandboxError::UnsupportedProposal(_))) => {
                    return Err(refused);
                }
                // Anything else may be Winch's own gap (a SIMD instruction
                // it lacks): Cranelift decides.
                Err(e) => {
                    tracing::debug!(error = %e, %digest, "the baseline compiler refused a component; compiling it optimized");
                    return self.load_optimized(&bytes, admitted, started);
                }
            },
        };
        let pre = link(&baseline.linker, &component)?;
        let loaded =
            Loaded { duration: started.elapsed(), from_cache, fetched: false, functions: None, tier: Tier::Baseline };
        let plugin = Plugin::new(admitted, pre, loaded);
        {
            let mut pending = baseline.pending();
            // Another load of the digest got here first (with more than
            // one compile at once): its plugin, and its optimizing compile.
            if let Some(first) = pending.get(&digest) {
                return Ok(first.clone());
            }
            pending.insert(digest, plugin.clone());
        }
        baseline.waiting.send_modify(|n| *n += 1);
        let write = (!from_cache && baseline.cache.is_some()).then_some(component);
        if write.is_some() {
            baseline.writing.send_modify(|n| *n += 1);
        }
        let optimize = {
            let sandbox = Arc::downgrade(self);
            let plugin = plugin.clone();
            move || optimize_behind(sandbox, plugin, bytes, write)
        };
        if !behind("leash-optimize", &digest, optimize) {
            // The plugin stays on baseline code.
            self.settle(&digest);
            baseline.writing.send_modify(|n| *n = n.saturating_sub(1));
        }
        Ok(plugin)
    }

    /// Resolves once no plugin is waiting for its optimized code (the
    /// compiles behind the jobs are done, or were never needed).
    pub async fn optimized(&self) {
        if let Some(baseline) = &self.baseline {
            let mut waiting = baseline.waiting.subscribe();
            let _ = waiting.wait_for(|n| *n == 0).await;
        }
    }

    /// Resolves once the compile cache holds the baseline code compiled so
    /// far (written behind the first job, so it does not wait for the
    /// write): a process about to exit waits for this, so its next run
    /// finds the code.
    pub async fn cached(&self) {
        if let Some(baseline) = &self.baseline {
            let mut writing = baseline.writing.subscribe();
            let _ = writing.wait_for(|n| *n == 0).await;
        }
    }

    /// Holds back the compiles behind the jobs until the guard is dropped,
    /// so a test can see the baseline tier whatever the machine's speed.
    /// `None` unless tiered.
    #[doc(hidden)]
    pub async fn hold_optimizing(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        Some(self.baseline.as_ref()?.optimizing.clone().lock_owned().await)
    }

    /// `digest` no longer waits for optimized code.
    fn settle(&self, digest: &Digest) {
        if let Some(baseline) = &self.baseline
            && baseline.pending().remove(digest).is_some()
        {
            baseline.waiting.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

/// Behind the plugin's first jobs: write its baseline code to the compile
/// cache (when it was compiled now), compile it with Cranelift (one such
/// compile at a time, on the compile threads at their priority, through the
/// function cache, into the compile cache and the store's shared code),
/// and hand its jobs the optimized code. Nothing is done once the sandbox is gone.
fn optimize_behind(sandbox: Weak<Sandbox>, plugin: Plugin, bytes: Arc<Vec<u8>>, write: Option<Component>) {
    let digest = plugin.digest();
    if let (Some(component), Some(sandbox)) = (write, sandbox.upgrade())
        && let Some(baseline) = &sandbox.baseline
    {
        if let Some(cache) = &baseline.cache {
            cache.put(&digest, &component);
        }
        baseline.writing.send_modify(|n| *n = n.saturating_sub(1));
    }
    let Some(turn) = sandbox.upgrade().and_then(|s| s.baseline.as_ref().map(|b| b.optimizing.clone())) else { return };
    let _turn = turn.blocking_lock();
    let Some(sandbox) = sandbox.upgrade() else { return };
    let started = Instant::now();
    match sandbox.compile_optimized(&bytes, &digest, Share::Now).and_then(|c| link(&sandbox.linker, &c)) {
        Ok(pre) => {
            plugin.replace_code(Tier::Optimized, pre);
            tracing::info!(%digest, ms = started.elapsed().as_millis() as u64, "optimized code ready; later jobs run it");
        }
        Err(e) => {
            tracing::warn!(error = %e, %digest, "the optimizing compile failed; the plugin stays on baseline code");
        }
    }
    sandbox.settle(&digest);
}
