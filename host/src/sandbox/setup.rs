//! Building the sandbox: its engines (the optimizing one and, when tiered,
//! the baseline one), linker, caches and epoch ticker.

use std::sync::Arc;

use wasmtime::{Engine, InstanceAllocationStrategy};

use crate::sandbox::cache::{self, CompileCache};
use crate::sandbox::engine::{
    Allocator, Compiler, EpochTicker, SandboxConfig, linker_for, pool_too_large, pooling, shared_config,
};
use crate::sandbox::functions::FunctionCache;
use crate::sandbox::tiers::Baseline;
use crate::sandbox::{Sandbox, SandboxError, one_line};

impl Sandbox {
    /// Build the engine, linker, ticker and cache.
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        let engine_err = |e: wasmtime::Error| SandboxError::Engine(one_line(&e));
        let mut wasm = shared_config(&config);
        if config.compiler == Compiler::Winch {
            wasm.strategy(wasmtime::Strategy::Winch);
        }
        // Cranelift's cache: Winch keeps none.
        let functions = match (&config.cache_dir, config.function_cache_bytes) {
            (Some(_), bytes) if bytes > 0 && config.compiler != Compiler::Winch => {
                let functions = Arc::new(FunctionCache::new(bytes));
                wasm.enable_incremental_compilation(functions.clone()).map_err(engine_err)?;
                Some(functions)
            }
            _ => None,
        };
        if let Allocator::Pooling { slots } = config.allocator {
            wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(slots, &config)?));
        }
        let engine = Engine::new(&wasm).map_err(|e| match config.allocator {
            Allocator::Pooling { slots } if one_line(&e).contains("memory pool mapping") => {
                SandboxError::Engine(pool_too_large(slots, &config, &e))
            }
            _ => engine_err(e),
        })?;
        let linker = linker_for(&engine).map_err(engine_err)?;
        let cache = config.cache_dir.as_deref().map(|dir| CompileCache::new(dir, &engine));
        let engine_key = cache::engine_key(&engine);
        if let (Some(cache), Some(functions)) = (&cache, &functions) {
            functions.place(cache.dir());
        }
        let baseline = match config.compiler {
            Compiler::Tiered => Some(Baseline::new(&config)?),
            _ => None,
        };
        let mut engines = vec![engine.clone()];
        engines.extend(baseline.as_ref().map(|b| b.engine.clone()));
        let ticker = EpochTicker::start(engines, config.epoch_tick)
            .map_err(|e| SandboxError::Engine(format!("cannot start the epoch ticker thread: {e}")))?;
        let compiling = tokio::sync::Semaphore::new(config.compile_concurrency.max(1));
        Ok(Sandbox {
            engine,
            engine_key,
            linker,
            cache,
            functions,
            baseline,
            config,
            compiling,
            compile_pool: Default::default(),
            _ticker: ticker,
        })
    }
}
