//! The engine: wasmtime configured once per process (fuel, epochs, the
//! pooling allocator), the epoch ticker, and loading a component into a
//! [`Plugin`] through the compile cache.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, Linker, Resource};
use wasmtime::{Config, Engine, PoolingAllocationConfig};

use crate::job::Digest;
use crate::sandbox::cache::{self, SharedCode};
use crate::sandbox::functions::FunctionCounts;
use crate::sandbox::http::SecretStore;
use crate::sandbox::journal::cut_text;
use crate::sandbox::names::Names;
use crate::sandbox::shape::ComponentLimits;
use crate::sandbox::state::HostState;
use crate::sandbox::{
    Admitted, BASELINE_FIRST_BYTES, DEFAULT_COMPILE_CONCURRENCY, DEFAULT_COMPILE_NICE, DEFAULT_EPOCH_TICK,
    DEFAULT_FUNCTION_CACHE_BYTES, DEFAULT_KEEP_RESIDENT_BYTES, DEFAULT_MEMORY_CEILING_BYTES, DEFAULT_POOL_SLOTS,
    Loaded, MAX_TABLE_ELEMENTS, Plugin, Sandbox, SandboxError, behind, bindings, lower_thread_priority, one_line,
    proposals, shape,
};

/// What a component missing the `run` export is told: how each guest
/// language exports it.
const EXPORT_HINT: &str = "a plugin exports `run`: in Rust with `leash_sdk::export!(YourPlugin);`, in Python with \
     a `WitWorld` class (`class WitWorld(leash.Plugin)`), in JavaScript with `export const run = leash.plugin(handler)`";

impl Sandbox {
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
        let admitted = self.admit(bytes)?;
        self.load_optimized(bytes, admitted, Instant::now())
    }

    /// Check the header and size of `bytes`, take their digest and read
    /// their `leash:names` section.
    pub(super) fn admit(&self, bytes: &[u8]) -> Result<Admitted, SandboxError> {
        check_header(bytes)?;
        let limits = &self.config.components;
        if bytes.len() > limits.max_bytes {
            return Err(SandboxError::CompileLimit(format!(
                "the component is {} bytes; leash accepts at most {}",
                bytes.len(),
                limits.max_bytes
            )));
        }
        let names = Names::read(bytes).map_err(SandboxError::InvalidComponent)?.map(Arc::new);
        Ok(Admitted { digest: Digest::of(bytes), names })
    }

    /// The plugin's code from this sandbox's own compiler (Cranelift unless
    /// [`Compiler::Winch`]): kept from before, or compiled now and kept.
    pub(super) fn load_optimized(
        &self,
        bytes: &[u8],
        admitted: Admitted,
        started: Instant,
    ) -> Result<Plugin, SandboxError> {
        let digest = admitted.digest;
        let (component, kept, functions) = match self.kept_code(&digest) {
            Some((component, kept)) => (component, Some(kept), None),
            None => {
                let before = self.compiled_functions();
                let component = self.compile_optimized(bytes, &digest, Share::Behind)?;
                (component, None, self.compiled_functions().zip(before).map(|(after, before)| after.since(before)))
            }
        };
        self.optimized_plugin(admitted, &component, kept, functions, started)
    }

    /// A plugin on this sandbox's own code, kept from before (`kept`) or
    /// compiled now.
    pub(super) fn optimized_plugin(
        &self,
        admitted: Admitted,
        component: &Component,
        kept: Option<Kept>,
        functions: Option<FunctionCounts>,
        started: Instant,
    ) -> Result<Plugin, SandboxError> {
        let loaded = Loaded {
            duration: started.elapsed(),
            from_cache: kept == Some(Kept::Cache),
            fetched: kept == Some(Kept::Store),
            functions,
            tier: self.own_tier(),
        };
        Ok(Plugin::new(admitted, link(&self.linker, component)?, loaded))
    }

    /// This sandbox's own code for `digest`, compiled before: from the
    /// compile cache, else from the store's shared code (then written to
    /// the cache). `None`: it must be compiled. Code that fails its
    /// checksum or is another engine's is a miss.
    pub(super) fn kept_code(&self, digest: &Digest) -> Option<(Component, Kept)> {
        if let Some(component) = self.cache.as_ref().and_then(|c| c.get(&self.engine, digest)) {
            return Some((component, Kept::Cache));
        }
        let sealed = self.config.shared_code.as_ref()?.get(*digest, &self.engine_key)?;
        let Some(component) = cache::open(&self.engine, &sealed) else {
            tracing::warn!(%digest, "compiled code from the store is damaged or not this engine's; compiling it here");
            return None;
        };
        // Into the compile cache behind the job, which does not wait for it.
        if let Some(cache) = self.cache.clone() {
            let key = *digest;
            behind("leash-cache-write", digest, move || cache.write(&key, &sealed));
        }
        Some((component, Kept::Store))
    }

    /// Share the code of `digest` in the compile cache with other processes
    /// (its compile shared it before the store held the plugin, say).
    /// Blocking; nothing without a cache or shared code.
    pub fn share(&self, digest: Digest) {
        if let (Some(cache), Some(shared)) = (&self.cache, &self.config.shared_code)
            && let Some(sealed) = cache.read(&digest)
        {
            shared.put(digest, &self.engine_key, sealed);
        }
    }

    /// Keep code compiled now: in the compile cache, and in the store's
    /// shared code: there on a thread of its own when a job waits for this
    /// compile (`Share::Behind`), so it does not wait for the write.
    fn keep(&self, digest: &Digest, component: &Component, share: Share) {
        if self.cache.is_none() && self.config.shared_code.is_none() {
            return;
        }
        let Some(sealed) = cache::seal(component) else { return };
        if let Some(cache) = &self.cache {
            cache.write(digest, &sealed);
        }
        let Some(shared) = self.config.shared_code.clone() else { return };
        let (digest, key) = (*digest, self.engine_key.clone());
        let put = move || shared.put(digest, &key, sealed);
        match share {
            Share::Now => put(),
            Share::Behind => {
                behind("leash-share-code", &digest, put);
            }
        }
    }

    /// What this sandbox's own compiler makes: optimized code, unless it
    /// is Winch alone.
    fn own_tier(&self) -> Tier {
        match self.config.compiler {
            Compiler::Winch => Tier::Baseline,
            _ => Tier::Optimized,
        }
    }

    /// Compile with this sandbox's own compiler and write the compile
    /// cache. The whole miss (parse, compile, write) runs on the compile
    /// threads, at their priority.
    pub(super) fn compile_optimized(
        &self,
        bytes: &[u8],
        digest: &Digest,
        share: Share,
    ) -> Result<Component, SandboxError> {
        let compile = || {
            let component = self.compile_on(&self.engine, bytes)?;
            self.keep(digest, &component, share);
            Ok(component)
        };
        match self.compile_pool() {
            Some(pool) => pool.install(compile),
            None => compile(),
        }
    }

    /// The incremental cache's function lookups since this sandbox was
    /// made: found compiled, and compiled. `None` without the cache.
    pub fn compiled_functions(&self) -> Option<FunctionCounts> {
        self.functions.as_ref().map(|f| f.counts())
    }

    /// Check a component's shape and compile it on `engine`.
    pub(super) fn compile_on(&self, engine: &Engine, bytes: &[u8]) -> Result<Component, SandboxError> {
        let shape = shape::Shape::of(bytes).map_err(SandboxError::InvalidComponent)?;
        shape.check(&self.config.components).map_err(SandboxError::CompileLimit)?;
        let compiled = Component::new(engine, bytes);
        if let Some(functions) = &self.functions {
            functions.flush();
        }
        compiled.map_err(|e| {
            let why = one_line(&e);
            // The pooling allocator counts what instantiation would
            // create (nested instantiations included) at compile time.
            if why.contains("exceeds the configured maximum") {
                SandboxError::CompileLimit(why)
            } else if let Some(names) = proposals::unsupported_by(bytes) {
                let plural = if names.len() > 1 { "s" } else { "" };
                SandboxError::UnsupportedProposal(format!("the WebAssembly proposal{plural} {}", names.join(", ")))
            } else {
                SandboxError::InvalidComponent(why)
            }
        })
    }

    /// The compile threads, started on first use.
    fn compile_pool(&self) -> Option<&rayon_core::ThreadPool> {
        self.compile_pool
            .get_or_init(|| {
                let nice = self.config.compile_nice;
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                rayon_core::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("leash-compile-{i}"))
                    .start_handler(move |_| lower_thread_priority(nice))
                    .build()
                    .inspect_err(|e| tracing::warn!(error = %e, "cannot start the compile threads"))
                    .ok()
            })
            .as_ref()
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
        tokio::task::spawn_blocking(move || sandbox.load_tiered(bytes))
            .await
            .map_err(|e| SandboxError::Engine(format!("compiling the component failed: {e}")))?
    }
}

/// `component` linked to everything a plugin may import, checked against
/// the `leash:plugin` world.
pub(super) fn link(
    linker: &Linker<HostState>,
    component: &Component,
) -> Result<bindings::PluginPre<HostState>, SandboxError> {
    let pre = linker.instantiate_pre(component).map_err(|e| SandboxError::WorldMismatch(one_line(&e)))?;
    bindings::PluginPre::new(pre).map_err(|e| SandboxError::WorldMismatch(format!("{}; {EXPORT_HINT}", one_line(&e))))
}

/// The engine settings every compiler tier shares: the proposals, fuel and
/// epoch interruption. A job's limits hold the same on either tier.
pub(super) fn shared_config(config: &SandboxConfig) -> Config {
    let mut wasm = Config::new();
    proposals::configure(&mut wasm);
    wasm.consume_fuel(config.fuel);
    wasm.epoch_interruption(true);
    wasm
}

/// The pooling allocator for `slots` concurrent jobs at `config`'s caps.
pub(super) fn pooling(slots: u32, config: &SandboxConfig) -> Result<PoolingAllocationConfig, SandboxError> {
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
    if config.keep_resident_bytes > 0 {
        let keep = usize::try_from(config.keep_resident_bytes).unwrap_or(usize::MAX);
        pool.linear_memory_keep_resident(keep).table_keep_resident(keep).pagemap_scan(wasmtime::Enabled::Auto);
    }
    Ok(pool)
}

/// Everything a guest may import, linked for `engine`.
pub(super) fn linker_for(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    wasmtime_wasi_config::add_to_linker(&mut linker, |s: &mut HostState| {
        wasmtime_wasi_config::WasiConfig::from(&s.config)
    })?;
    bindings::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
    shadow_error_debug_string(&mut linker)?;
    Ok(linker)
}

/// Longest text a guest gets from `wasi:io/error.to-debug-string`.
pub const MAX_GUEST_ERROR_TEXT_BYTES: usize = 1024;

/// Replace wasmtime-wasi's `wasi:io/error.to-debug-string`, which hands
/// the guest the host error's `Debug` form: with `RUST_BACKTRACE` set,
/// tens of kilobytes of the host's own backtrace. The guest gets each
/// cause's first line instead, bounded.
fn shadow_error_debug_string(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let defined = linker.instance("wasi:io/error@0.2.12")?.func_wrap(
        "[method]error.to-debug-string",
        |store: wasmtime::StoreContextMut<'_, HostState>, (err,): (Resource<wasmtime::Error>,)| {
            let text = one_line(store.data().table.get(&err)?);
            Ok((cut_text(text, MAX_GUEST_ERROR_TEXT_BYTES),))
        },
    );
    linker.allow_shadowing(false);
    defined
}

/// Why a pool of `slots` could not be set up: it reserves address space
/// (not memory) for every guest memory any slot may hold, and the process
/// has too little of it.
pub(super) fn pool_too_large(slots: u32, config: &SandboxConfig, e: &wasmtime::Error) -> String {
    let memories = u64::from(slots) * u64::from(config.components.max_memories);
    // wasmtime reserves at least 4 GiB per memory on 64-bit hosts (so bounds
    // checks fold into guard pages), plus 32 MiB of guard after it.
    let per_memory = config.memory_ceiling_bytes.max(4 << 30) + (32 << 20);
    let per_slot = per_memory * u64::from(config.components.max_memories);
    let tib = |bytes: u64| bytes as f64 / (1u64 << 40) as f64;
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    format!(
        "{slots} job slots are more than this process can reserve address space for: the pooling allocator \
         reserves about {:.1} GiB of address space per slot ({} guest memories of up to {:.1} GiB each, with \
         guard pages), {:.0} TiB for {memories} memories, and an x86-64 process has about 128 TiB; \
         no memory was committed. Use fewer slots (--max-workers): about {} at these sizes. ({})",
        gib(per_slot),
        config.components.max_memories,
        gib(config.memory_ceiling_bytes),
        tib(per_slot * u64::from(slots)),
        // One mapping must fit in the largest hole of a 47-bit address
        // space, which the program's own image splits at about 85 TiB
        // (measured: 86.6 TiB reserved, 88.2 TiB refused).
        USABLE_ADDRESS_SPACE / per_slot,
        one_line(e)
    )
}

/// Address space a pool can expect to reserve in one mapping on x86-64
/// (of 128 TiB).
const USABLE_ADDRESS_SPACE: u64 = 80 << 40;

/// Instance slots whose memory is reset in one batch of system calls.
pub(super) const DECOMMIT_BATCH: usize = 16;

/// Which of wasmtime's compilers turns components into machine code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compiler {
    /// Both, in tiers: a large component
    /// ([`SandboxConfig::baseline_first_bytes`] or more, such as a Python or JavaScript guest) that has no optimized
    /// code in the compile cache is compiled with Winch first, and its
    /// first jobs run on that code, while Cranelift compiles it behind them
    /// and its code takes over for the jobs that start after. Smaller
    /// components, and a component Winch refuses, go to Cranelift
    /// directly.
    #[default]
    Tiered,
    /// The optimizing compiler alone: slower to compile, faster code.
    Cranelift,
    /// The baseline compiler alone: one pass, 3.6-6x quicker to compile
    /// here (a Python guest in 1.8 s against 6.6 s); its code is not
    /// optimized. Fuel, epochs and memory limits hold alike. By wasmtime's
    /// documentation, a guest using a SIMD instruction Winch lacks fails
    /// to compile.
    Winch,
}

impl std::str::FromStr for Compiler {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tiered" => Ok(Compiler::Tiered),
            "cranelift" => Ok(Compiler::Cranelift),
            "winch" => Ok(Compiler::Winch),
            other => Err(format!("unknown compiler `{other}`: use tiered, cranelift or winch")),
        }
    }
}

/// When compiled code is written to the store's shared code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Share {
    /// Before the compile returns (it runs behind the jobs already).
    Now,
    /// On a thread of its own: a job waits for the compile.
    Behind,
}

/// Where a load found code compiled before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
    /// This process's compile cache.
    Cache,
    /// The store: another process compiled it.
    Store,
}

/// Which compiler made the code a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Winch's: quick to make, slower to run.
    Baseline,
    /// Cranelift's.
    Optimized,
}

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
    /// Where compiled components are cached; `None` disables the cache
    /// (and the function cache with it).
    pub cache_dir: Option<PathBuf>,
    /// Where compiled code is shared with other processes (a runtime sets
    /// its store's); `None`: nowhere.
    pub shared_code: Option<Arc<dyn SharedCode>>,
    /// The compiler: [`Compiler::Tiered`] unless told.
    pub compiler: Compiler,
    /// Under [`Compiler::Tiered`], components of this many bytes or more
    /// start on the baseline tier ([`BASELINE_FIRST_BYTES`] unless told).
    pub baseline_first_bytes: usize,
    /// Bytes of compiled functions kept in the cache folder for Cranelift's
    /// incremental compilation (least recently used evicted first): a
    /// component sharing code with one compiled before compiles only what
    /// differs. 0 turns it off.
    pub function_cache_bytes: u64,
    /// Epoch tick period.
    pub epoch_tick: Duration,
    /// The largest memory limit any job may have.
    pub memory_ceiling_bytes: u64,
    /// Count fuel (needed for fuel limits and `fuel_used`).
    pub fuel: bool,
    /// What a component may contain; checked before compiling, and the
    /// pooling allocator's per-component sizes.
    pub components: ComponentLimits,
    /// Components compiled at once for loads that wait (at least 1); under
    /// [`Compiler::Tiered`] one optimizing compile may run beside them.
    pub compile_concurrency: usize,
    /// Niceness added to the compile threads (0 to 19; 0: the process's
    /// own priority). With CPU to spare a compile runs at full speed; on
    /// cores the guests keep busy it gets a small share.
    pub compile_nice: i32,
    /// The operator's secrets, put into guests' requests where their
    /// grants allow ([`super::http`]).
    pub secrets: Arc<SecretStore>,
    /// Bytes of each pooled guest memory (and table) kept resident between
    /// instances: the pages an instance touched are reset in place (the
    /// module's initial contents copied back, the rest zeroed) instead of
    /// being handed back to the kernel, so the next instance in the slot
    /// writes them without a copy-on-write fault and its TLB shootdown on
    /// every core. Only pages that were touched are reset (Linux 6.7+
    /// finds them with `PAGEMAP_SCAN`; older kernels reset the whole
    /// range, so keep it small there). Costs up to this much resident
    /// memory per slot; 0 gives every page back.
    pub keep_resident_bytes: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            allocator: Allocator::Pooling { slots: DEFAULT_POOL_SLOTS },
            cache_dir: None,
            compiler: Compiler::Tiered,
            shared_code: None,
            baseline_first_bytes: BASELINE_FIRST_BYTES,
            function_cache_bytes: DEFAULT_FUNCTION_CACHE_BYTES,
            epoch_tick: DEFAULT_EPOCH_TICK,
            memory_ceiling_bytes: DEFAULT_MEMORY_CEILING_BYTES,
            fuel: true,
            components: ComponentLimits::default(),
            compile_concurrency: DEFAULT_COMPILE_CONCURRENCY,
            compile_nice: DEFAULT_COMPILE_NICE,
            secrets: Arc::default(),
            keep_resident_bytes: DEFAULT_KEEP_RESIDENT_BYTES,
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
    /// Tick every engine in `engines` (the optimizing one and, when
    /// tiered, the baseline one).
    pub(super) fn start(engines: Vec<Engine>, tick: Duration) -> std::io::Result<Self> {
        let done = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name("leash-epoch".into()).spawn({
            let done = done.clone();
            move || {
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    for engine in &engines {
                        engine.increment_epoch();
                    }
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
