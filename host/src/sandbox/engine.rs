//! The engine: wasmtime configured once per process (fuel, epochs, the
//! pooling allocator), the epoch ticker, and loading a component into a
//! [`Plugin`] through the compile cache.

use super::*;

impl Sandbox {
    /// Build the engine, linker, ticker and cache.
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        let engine_err = |e: wasmtime::Error| SandboxError::Engine(one_line(&e));
        let mut wasm = Config::new();
        wasm.wasm_component_model(true);
        wasm.consume_fuel(config.fuel);
        wasm.epoch_interruption(true);
        if let Allocator::Pooling { slots } = config.allocator {
            let ceiling = usize::try_from(config.memory_ceiling_bytes)
                .map_err(|_| SandboxError::Engine("memory ceiling does not fit this platform".into()))?;
            let c = &config.components;
            let mut pool = PoolingAllocationConfig::new();
            // Every slot can hold the largest component the caps allow, so a
            // component that loads always fits, and the totals are only ever
            // reached by more concurrent runs than slots.
            pool.total_component_instances(slots)
                .total_core_instances(slots.saturating_mul(c.max_core_instances))
                .total_memories(slots.saturating_mul(c.max_memories))
                .total_tables(slots.saturating_mul(c.max_tables))
                .total_stacks(slots)
                .max_core_instances_per_component(c.max_core_instances)
                .max_memories_per_component(c.max_memories)
                .max_tables_per_component(c.max_tables)
                .max_memories_per_module(c.max_memories)
                .max_tables_per_module(c.max_tables)
                .table_elements(MAX_TABLE_ELEMENTS)
                .max_memory_size(ceiling)
                // Each decommit is an madvise, and with more than one thread
                // each madvise is a TLB shootdown on every core: batch them.
                .decommit_batch_size(DECOMMIT_BATCH.min(slots as usize).max(1));
            wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&wasm).map_err(engine_err)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_err)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(engine_err)?;
        wasmtime_wasi_config::add_to_linker(&mut linker, |s: &mut HostState| {
            wasmtime_wasi_config::WasiConfig::from(&s.config)
        })
        .map_err(engine_err)?;
        bindings::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s).map_err(engine_err)?;
        let cache = config.cache_dir.as_deref().map(|dir| CompileCache::new(dir, &engine));
        let ticker = EpochTicker::start(engine.clone(), config.epoch_tick)
            .map_err(|e| SandboxError::Engine(format!("cannot start the epoch ticker thread: {e}")))?;
        let compiling = tokio::sync::Semaphore::new(config.compile_concurrency.max(1));
        Ok(Sandbox { engine, linker, cache, config, compiling, _ticker: ticker })
    }

    /// The settings this sandbox was built with.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Validate and compile a component. CPU-heavy on a cache miss (tens
    /// of milliseconds to seconds): call it off the async runtime, or use
    /// [`Sandbox::compile`].
    ///
    /// Bytes over [`ComponentLimits`] are refused before compiling, with
    /// [`SandboxError::CompileLimit`].
    pub fn load(&self, bytes: &[u8]) -> Result<Plugin, SandboxError> {
        check_header(bytes)?;
        let limits = &self.config.components;
        if bytes.len() > limits.max_bytes {
            return Err(SandboxError::CompileLimit(format!(
                "the component is {} bytes; leash accepts at most {}",
                bytes.len(),
                limits.max_bytes
            )));
        }
        let digest = Digest::of(bytes);
        let started = Instant::now();
        let cached = self.cache.as_ref().and_then(|c| c.get(&self.engine, &digest));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => {
                let shape = shape::Shape::of(bytes).map_err(SandboxError::InvalidComponent)?;
                shape.check(limits).map_err(SandboxError::CompileLimit)?;
                let component = Component::new(&self.engine, bytes).map_err(|e| {
                    let why = one_line(&e);
                    // The pooling allocator counts what instantiation would
                    // create (nested instantiations included) at compile time.
                    if why.contains("exceeds the configured maximum") {
                        SandboxError::CompileLimit(why)
                    } else {
                        SandboxError::InvalidComponent(why)
                    }
                })?;
                if let Some(cache) = &self.cache {
                    cache.put(&digest, &component);
                }
                component
            }
        };
        let pre = self.linker.instantiate_pre(&component).map_err(|e| SandboxError::WorldMismatch(one_line(&e)))?;
        let pre = bindings::PluginPre::new(pre).map_err(|e| SandboxError::WorldMismatch(one_line(&e)))?;
        Ok(Plugin { digest, pre, loaded: Loaded { duration: started.elapsed(), from_cache } })
    }

    /// [`Sandbox::load`] on a blocking thread, at most
    /// [`SandboxConfig::compile_concurrency`] at once: the async runtime
    /// (and with it the HTTP server and lease renewals) never waits on a
    /// compiler.
    /// The bytes are shared, not copied: a caller that stores them after
    /// (the runtime) takes them back with `Arc::try_unwrap`.
    pub async fn compile(self: &Arc<Self>, bytes: Arc<Vec<u8>>) -> Result<Plugin, SandboxError> {
        let _permit =
            self.compiling.acquire().await.map_err(|_| SandboxError::Engine("the sandbox is closed".into()))?;
        let sandbox = self.clone();
        tokio::task::spawn_blocking(move || sandbox.load(&bytes))
            .await
            .map_err(|e| SandboxError::Engine(format!("compiling the component failed: {e}")))?
    }
}

/// Instance slots whose memory is reset in one batch of system calls.
pub(super) const DECOMMIT_BATCH: usize = 16;

/// How instances get their memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// Pre-reserved slots, reused between jobs: fastest instantiation. At
    /// most `slots` jobs run at once.
    Pooling {
        /// Concurrent component instances the pool holds.
        slots: u32,
    },
    /// Fresh mappings for every instance.
    OnDemand,
}

/// Process-wide sandbox settings.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Instance allocation strategy.
    pub allocator: Allocator,
    /// Where compiled components are cached; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// Epoch tick period.
    pub epoch_tick: Duration,
    /// The largest memory limit any job may have.
    pub memory_ceiling_bytes: u64,
    /// Count fuel (needed for fuel limits and `fuel_used`).
    pub fuel: bool,
    /// What a component may contain; checked before compiling, and the
    /// pooling allocator's per-component sizes.
    pub components: ComponentLimits,
    /// Components compiled at once (at least 1).
    pub compile_concurrency: usize,
    /// The operator's secrets, put into guests' requests where their
    /// grants allow ([`super::http`]).
    pub secrets: Arc<SecretStore>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            allocator: Allocator::Pooling { slots: DEFAULT_POOL_SLOTS },
            cache_dir: None,
            epoch_tick: DEFAULT_EPOCH_TICK,
            memory_ceiling_bytes: DEFAULT_MEMORY_CEILING_BYTES,
            fuel: true,
            components: ComponentLimits::default(),
            compile_concurrency: DEFAULT_COMPILE_CONCURRENCY,
            secrets: Arc::default(),
        }
    }
}

/// Advances the engine's epoch from one OS thread. A tokio task would not
/// tick while a guest spins on the same worker thread.
pub(super) struct EpochTicker {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub(super) fn start(engine: Engine, tick: Duration) -> std::io::Result<Self> {
        let done = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name("leash-epoch".into()).spawn({
            let done = done.clone();
            move || {
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            }
        })?;
        Ok(EpochTicker { done, thread: Some(thread) })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Refuse bytes that are not a binary component before wasmtime sees them,
/// with a message that says what they are instead.
pub(super) fn check_header(bytes: &[u8]) -> Result<(), SandboxError> {
    const MAGIC: &[u8; 4] = b"\0asm";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        let what = if bytes.is_empty() {
            "the file is empty".to_owned()
        } else {
            "it does not start with the \\0asm magic bytes".to_owned()
        };
        return Err(SandboxError::NotWasm(what));
    }
    match [bytes[6], bytes[7]] {
        [0, 0] => Err(SandboxError::CoreModule),
        [1, 0] => Ok(()),
        layer => Err(SandboxError::NotWasm(format!("unknown WebAssembly layer {layer:?}"))),
    }
}
