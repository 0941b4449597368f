//! The sandbox: runs one job's plugin as a WebAssembly component under
//! enforced limits and reports what happened.
//!
//! One [`Sandbox`] per process owns the wasmtime engine (component model,
//! async, fuel, epoch interruption, pooling allocator where it fits), the
//! single epoch ticker thread, the linker and the on-disk compile cache.
//! [`Sandbox::load`] validates and compiles a component into a [`Plugin`]
//! (a cached `InstancePre`); [`Sandbox::run`] gives each job a fresh store
//! with its fuel budget, epoch deadline, memory limits, bounded stdout,
//! stderr and log capture, and WASI with nothing granted — no files, no
//! environment, no arguments, no sockets; clocks and random only.
//!
//! Every ending is an [`Outcome`] whose failures carry an [`ErrorKind`].
//! Nothing wasmtime-typed leaves this module, and the module knows nothing
//! of storage: the durable parts of leash call it and record the outcome.

mod bindings;
mod cache;
mod capture;
mod limiter;
mod shape;
mod state;
mod stop;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable, ResourceTableError};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap, UpdateDeadline, WasmBacktrace,
};
use wasmtime_wasi::WasiCtxBuilder;

use self::cache::CompileCache;
use self::capture::CapturedOutput;
use self::limiter::JobLimiter;
pub use self::shape::{ComponentLimits, DEFAULT_MAX_COMPONENT_BYTES};
use self::state::cut_text;
pub use self::state::{
    FIELDS_DROPPED_KEY, LogLevel, LogRecord, MAX_LOG_FIELDS, MAX_LOG_KEY_BYTES, MAX_LOG_MESSAGE_BYTES,
    MAX_LOG_VALUE_BYTES, NoObserver, Progress, RunObserver,
};
use self::state::{HostState, LogBook};
pub use self::stop::StopHandle;
use crate::job::{Digest, ErrorKind, Target};

/// How often the engine's epoch advances. Bounds timeout overshoot and how
/// often a computing guest yields to other tasks.
pub const DEFAULT_EPOCH_TICK: Duration = Duration::from_millis(1);
/// Default wall-clock limit of a job.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default linear-memory limit of a job.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 << 20;
/// Largest memory limit a job may ask for; pooling slots are sized to it.
pub const DEFAULT_MEMORY_CEILING_BYTES: u64 = 1 << 30;
/// Default output limit of a job.
pub const DEFAULT_OUTPUT_BYTES: u64 = 1 << 20;
/// Default cap on kept log records per job.
pub const DEFAULT_LOG_RECORDS: usize = 1000;
/// Default cap on kept log bytes per job.
pub const DEFAULT_LOG_BYTES: usize = 256 << 10;
/// Default cap on captured stdout and on captured stderr, each.
pub const DEFAULT_CAPTURE_BYTES: usize = 64 << 10;
/// Default time a guest has to stop after a cooperative stop request.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);
/// Default number of pooled instance slots.
pub const DEFAULT_POOL_SLOTS: u32 = 64;
/// Elements one table of a job may have.
pub const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Longest error message kept from a guest (its `failed` text, a trap's
/// panic line), in bytes; longer ones are cut and marked with `…`.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 8 << 10;
/// Resource handles (streams, pollables, …) one job may hold at once.
pub const MAX_RESOURCE_HANDLES: usize = 4096;
/// Most bytes one `wasi:random` call returns.
pub const MAX_RANDOM_BYTES: u64 = 1 << 20;
/// Data a guest may hand the host in one call beyond its output limit
/// (the argument of a `log` call, say); wasmtime copies it into host
/// memory before leash sees it, so this bounds that copy.
pub const HOSTCALL_SLACK_BYTES: usize = 1 << 20;
/// What one `write` to a captured stdout or stderr may carry (the permit
/// `check-write` gives).
pub const STREAM_WRITE_PERMIT: usize = 64 << 10;
/// Default number of components compiled at once; more wait their turn.
/// One: a compile at the caps costs ~5.5 s and ~450 MiB here (BENCHMARKS.md),
/// and Cranelift already spreads one compile over every core.
pub const DEFAULT_COMPILE_CONCURRENCY: usize = 1;
/// Instance slots whose memory is reset in one batch of system calls.
const DECOMMIT_BATCH: usize = 16;
/// Frames kept in a trap's backtrace.
const MAX_BACKTRACE_FRAMES: usize = 48;
/// Longest function name kept per backtrace frame, in bytes.
const MAX_FRAME_NAME_BYTES: usize = 256;

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
        }
    }
}

/// Limits of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunLimits {
    /// Wall-clock limit, including instantiation.
    pub timeout: Duration,
    /// Fuel budget; `None` means unlimited (fuel is still counted).
    pub fuel: Option<u64>,
    /// Linear memory, summed over the component's memories.
    pub memory_bytes: u64,
    /// Largest output accepted.
    pub output_bytes: u64,
    /// Log records kept.
    pub log_records: usize,
    /// Log bytes kept.
    pub log_bytes: usize,
    /// Captured stdout and stderr, each.
    pub capture_bytes: usize,
    /// Time between a cooperative stop request and a forced stop.
    pub cancel_grace: Duration,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            timeout: DEFAULT_TIMEOUT,
            fuel: None,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            output_bytes: DEFAULT_OUTPUT_BYTES,
            log_records: DEFAULT_LOG_RECORDS,
            log_bytes: DEFAULT_LOG_BYTES,
            capture_bytes: DEFAULT_CAPTURE_BYTES,
            cancel_grace: DEFAULT_CANCEL_GRACE,
        }
    }
}

/// One run of a plugin.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The job id shown to the guest (empty for one-shot runs).
    pub job_id: String,
    /// Phase or action.
    pub target: Target,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Input bytes.
    pub input: Vec<u8>,
    /// Limits.
    pub limits: RunLimits,
}

/// How a cancelled guest ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopMode {
    /// The guest returned after seeing the stop request.
    Cooperative,
    /// The host stopped it (grace expired, or the stop was forced).
    Forced,
}

/// Why a run did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Machine-readable reason.
    pub kind: ErrorKind,
    /// `"Type: message"` for people.
    pub message: String,
    /// The guest's wasm backtrace, for traps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backtrace: Option<String>,
    /// The guest said running again may succeed.
    pub retryable: bool,
    /// For cancellations: whether the guest stopped itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<StopMode>,
}

impl Failure {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure { kind, message: message.into(), backtrace: None, retryable: false, stopped: None }
    }

    fn cancelled(mode: StopMode) -> Self {
        let message = match mode {
            StopMode::Cooperative => "Cancelled: the plugin stopped when asked",
            StopMode::Forced => "Cancelled: the plugin was stopped by force",
        };
        Failure { stopped: Some(mode), ..Failure::new(ErrorKind::Cancelled, message) }
    }
}

/// Resources a run used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Fuel consumed (roughly, wasm instructions executed). When the host
    /// interrupts a guest (timeout, forced stop) this counts fuel up to the
    /// guest's last call: compiled code does not write its fuel counter back
    /// before an epoch interruption.
    pub fuel_used: u64,
    /// Highest total linear memory, in bytes.
    pub peak_memory_bytes: u64,
    /// Wall time from store creation to the end.
    #[serde(serialize_with = "serialize_duration_ms", rename = "duration_ms")]
    pub duration: Duration,
}

fn serialize_duration_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// Bounded stdout or stderr of a guest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first bytes written.
    pub bytes: Vec<u8>,
    /// Bytes written past the cap.
    pub dropped: u64,
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Output bytes, or why there are none.
    pub result: Result<Vec<u8>, Failure>,
    /// Fuel, memory and time used.
    pub usage: Usage,
    /// Kept log records.
    pub logs: Vec<LogRecord>,
    /// Log records dropped past the caps.
    pub logs_dropped: u64,
    /// The guest's last progress report.
    pub last_progress: Option<Progress>,
    /// Guest stdout.
    pub stdout: Captured,
    /// Guest stderr.
    pub stderr: Captured,
}

impl Outcome {
    /// The failure kind, or `None` for success.
    pub fn error_kind(&self) -> Option<ErrorKind> {
        self.result.as_ref().err().map(|f| f.kind)
    }
}

/// Why a component could not be loaded, or the sandbox built.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The bytes are not WebAssembly at all.
    #[error("not a WebAssembly file: {0}")]
    NotWasm(String),
    /// A core module where a component was expected.
    #[error(
        "this is a core WebAssembly module, not a component: build the plugin for wasm32-wasip2 \
         (or wrap the module with `wasm-tools component new`)"
    )]
    CoreModule,
    /// wasmtime rejected the component.
    #[error("invalid component: {0}")]
    InvalidComponent(String),
    /// The component's imports or exports do not match `leash:plugin`.
    #[error("component does not implement leash:plugin@0.1.x: {0}")]
    WorldMismatch(String),
    /// The component is over a size or count cap: refused before compiling.
    #[error("component over a compile limit: {0}")]
    CompileLimit(String),
    /// The engine could not be configured.
    #[error("cannot set up the WebAssembly engine: {0}")]
    Engine(String),
}

impl SandboxError {
    /// The machine-readable kind the faces report: `compile_limit` for a
    /// component over a cap, `invalid_plugin` for any other refusal,
    /// `sandbox` when the engine itself could not be set up.
    pub fn kind(&self) -> &'static str {
        match self {
            SandboxError::CompileLimit(_) => "compile_limit",
            SandboxError::Engine(_) => "sandbox",
            _ => "invalid_plugin",
        }
    }
}

/// One line from a wasmtime error chain: each cause's first line, joined.
fn one_line(err: &wasmtime::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let line = cause.to_string().lines().next().unwrap_or_default().trim().to_owned();
        if !line.is_empty() && !parts.iter().any(|p| p.contains(&line)) {
            parts.push(line);
        }
    }
    parts.join(": ")
}

/// A validated, compiled plugin, ready to instantiate. Cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    digest: Digest,
    pre: bindings::PluginPre<HostState>,
}

impl Plugin {
    /// The sha256 of the component bytes.
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin").field("digest", &self.digest).finish_non_exhaustive()
    }
}

/// Advances the engine's epoch from one OS thread. A tokio task would not
/// tick while a guest spins on the same worker thread.
struct EpochTicker {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine, tick: Duration) -> std::io::Result<Self> {
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

/// Why the host ended a call early. Returned from the epoch callback as the
/// trap's cause, and from the watcher racing a blocked call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum Interrupted {
    #[error("the job ran past its timeout")]
    Timeout,
    #[error("the job was stopped by force")]
    Forced,
}

/// The process's WebAssembly sandbox. Create one and share it.
pub struct Sandbox {
    engine: Engine,
    linker: Linker<HostState>,
    cache: Option<CompileCache>,
    config: SandboxConfig,
    /// Bounds how many compiles run at once, so a burst of new plugins (or
    /// a compile bomb) holds a bounded number of blocking threads.
    compiling: tokio::sync::Semaphore,
    _ticker: EpochTicker,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox").field("config", &self.config).finish_non_exhaustive()
    }
}

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
        let component = match self.cache.as_ref().and_then(|c| c.get(&self.engine, &digest)) {
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
        Ok(Plugin { digest, pre })
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

    /// Run `plugin` once in a fresh store. Never fails: every ending,
    /// including host-side trouble, is an [`Outcome`].
    pub async fn run(
        &self,
        plugin: &Plugin,
        request: RunRequest,
        stop: &StopHandle,
        observer: Arc<dyn RunObserver>,
    ) -> Outcome {
        let started = Instant::now();
        let limits = &request.limits;
        let deadline = started + limits.timeout;
        let stdout = CapturedOutput::new(limits.capture_bytes);
        let stderr = CapturedOutput::new(limits.capture_bytes);
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let memory_limit =
            usize::try_from(limits.memory_bytes.min(self.config.memory_ceiling_bytes)).unwrap_or(usize::MAX);
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCE_HANDLES);
        let state = HostState {
            wasi,
            table,
            limiter: JobLimiter::new(memory_limit, MAX_TABLE_ELEMENTS, &self.config.components, stderr.clone()),
            logs: LogBook::new(limits.log_records, limits.log_bytes),
            last_progress: None,
            stop: stop.clone(),
            observer,
            started,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        // Bounds what wasmtime copies out of the guest for one call (a log
        // record, the output) before leash can look at it.
        store.set_hostcall_fuel(hostcall_fuel(limits));
        let fuel_budget = limits.fuel.unwrap_or(u64::MAX);
        if self.config.fuel {
            // Fuel is on for this engine, so setting it cannot fail.
            let _ = store.set_fuel(fuel_budget);
        }
        let forced = stop.clone();
        let interrupt = Arc::new(AtomicBool::new(false));
        let interrupt_requested = interrupt.clone();
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                return Err(Interrupted::Timeout.into());
            }
            if forced.is_forced() || interrupt_requested.load(Ordering::Relaxed) {
                return Err(Interrupted::Forced.into());
            }
            // Yield every tick so a computing guest never holds its thread.
            Ok(UpdateDeadline::Yield(1))
        });
        store.set_epoch_deadline(1);

        let ctx = bindings::leash::plugin::types::JobContext {
            job_id: request.job_id.clone(),
            target: match &request.target {
                Target::Execute => bindings::leash::plugin::types::Target::Execute,
                Target::Apply => bindings::leash::plugin::types::Target::Apply,
                Target::Action(name) => bindings::leash::plugin::types::Target::Action(name.clone()),
            },
            attempt: request.attempt,
            deadline_unix_ms: unix_ms(SystemTime::now() + limits.timeout),
        };

        let ended = {
            let call = async {
                let instance = plugin.pre.instantiate_async(&mut store).await?;
                instance.call_run(&mut store, &ctx, &request.input).await
            };
            tokio::pin!(call);
            tokio::select! {
                biased;
                result = &mut call => Ended::Returned(result),
                why = watch_stop(deadline, stop, limits.cancel_grace) => {
                    // Let the epoch callback trap a computing guest first, so it
                    // ends the way every other trap does. A guest blocked in a
                    // host call or a WASI sleep never reaches the callback: drop
                    // its call after a few ticks.
                    interrupt.store(true, Ordering::Relaxed);
                    tokio::select! {
                        biased;
                        result = &mut call => Ended::Returned(result),
                        _ = tokio::time::sleep(self.config.epoch_tick * 3) => Ended::Interrupted(why),
                    }
                }
            }
        };

        let fuel_used = if self.config.fuel { fuel_budget - store.get_fuel().unwrap_or(0) } else { 0 };
        let state = store.into_data();
        let result = classify(ended, &state, limits, stop.is_requested(), &stderr);
        let (stdout_bytes, stdout_dropped) = stdout.take();
        let (stderr_bytes, stderr_dropped) = stderr.take();
        Outcome {
            result,
            usage: Usage {
                fuel_used,
                peak_memory_bytes: state.limiter.peak_memory_bytes as u64,
                duration: started.elapsed(),
            },
            logs: state.logs.records,
            logs_dropped: state.logs.dropped,
            last_progress: state.last_progress,
            stdout: Captured { bytes: stdout_bytes, dropped: stdout_dropped },
            stderr: Captured { bytes: stderr_bytes, dropped: stderr_dropped },
        }
    }
}

type CallResult = wasmtime::Result<Result<Vec<u8>, bindings::leash::plugin::types::JobError>>;

enum Ended {
    Returned(CallResult),
    Interrupted(Interrupted),
}

/// Resolves when the host must end a call that is not computing (blocked in
/// a host call or a WASI sleep), where the epoch callback cannot reach it.
async fn watch_stop(deadline: Instant, stop: &StopHandle, grace: Duration) -> Interrupted {
    let grace_expired = async {
        stop.requested().await;
        tokio::select! {
            _ = tokio::time::sleep(grace) => {}
            _ = stop.forced() => {}
        }
    };
    tokio::select! {
        _ = tokio::time::sleep_until(deadline.into()) => Interrupted::Timeout,
        _ = grace_expired => Interrupted::Forced,
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn interrupted_failure(why: Interrupted, limits: &RunLimits) -> Failure {
    match why {
        Interrupted::Timeout => {
            Failure::new(ErrorKind::Timeout, format!("Timeout: the job ran past its timeout of {:?}", limits.timeout))
        }
        Interrupted::Forced => Failure::cancelled(StopMode::Forced),
    }
}

fn classify(
    ended: Ended,
    state: &HostState,
    limits: &RunLimits,
    stop_requested: bool,
    stderr: &CapturedOutput,
) -> Result<Vec<u8>, Failure> {
    use bindings::leash::plugin::types::JobError;
    let returned = match ended {
        Ended::Interrupted(why) => return Err(interrupted_failure(why, limits)),
        Ended::Returned(returned) => returned,
    };
    let guest_error = |kind, label: &str, message: String| {
        Failure::new(kind, format!("{label}: {}", cut_text(message, MAX_ERROR_MESSAGE_BYTES)))
    };
    match returned {
        // A guest that stops short when asked returns an error: that is a
        // cooperative stop. One that returns its output has finished its
        // work, stop or no stop, and the output is kept (below).
        Ok(Err(_)) if stop_requested => Err(Failure::cancelled(StopMode::Cooperative)),
        Ok(Ok(output)) if output.len() as u64 > limits.output_bytes => Err(Failure::new(
            ErrorKind::OutputLimit,
            format!("OutputLimit: the job returned {} bytes, over its limit of {}", output.len(), limits.output_bytes),
        )),
        Ok(Ok(output)) => Ok(output),
        Ok(Err(JobError::Failed(message))) => Err(guest_error(ErrorKind::GuestError, "Failed", message)),
        Ok(Err(JobError::Retryable(message))) => {
            Err(Failure { retryable: true, ..guest_error(ErrorKind::GuestError, "Retryable", message) })
        }
        Ok(Err(JobError::InvalidInput(message))) => Err(guest_error(ErrorKind::InvalidInput, "InvalidInput", message)),
        Err(error) => Err(classify_error(&error, state, limits, stderr)),
    }
}

/// Data the guest may hand over in one call: its output (with room for
/// the result's framing) or, for host calls, [`HOSTCALL_SLACK_BYTES`].
fn hostcall_fuel(limits: &RunLimits) -> usize {
    usize::try_from(limits.output_bytes).unwrap_or(usize::MAX).saturating_add(HOSTCALL_SLACK_BYTES)
}

/// Why a call that did not return ended. Everything that happens while
/// the guest runs is the guest's doing — a trap, a limit, a misuse of an
/// interface — except the few failures that are leash's own (a full
/// instance pool), which alone are `host_error`.
fn classify_error(error: &wasmtime::Error, state: &HostState, limits: &RunLimits, stderr: &CapturedOutput) -> Failure {
    if let Some(why) = error.chain().find_map(|cause| cause.downcast_ref::<Interrupted>()) {
        return interrupted_failure(*why, limits);
    }
    let trap = error.downcast_ref::<Trap>().copied();
    if trap == Some(Trap::OutOfFuel) {
        return Failure::new(
            ErrorKind::OutOfFuel,
            format!("OutOfFuel: the job used its whole fuel budget of {}", limits.fuel.unwrap_or(u64::MAX)),
        );
    }
    let backtrace = error.downcast_ref::<WasmBacktrace>().map(format_backtrace);
    let failure = |kind, message: String| Failure {
        backtrace: backtrace.clone(),
        ..Failure::new(kind, cut_text(message, MAX_ERROR_MESSAGE_BYTES))
    };
    if let Some(exit) = error.chain().find_map(|cause| cause.downcast_ref::<wasmtime_wasi::I32Exit>()) {
        return failure(
            ErrorKind::Trap,
            format!("Trap: the guest called exit({}) instead of returning a result", exit.0),
        );
    }
    if error.chain().any(|c| matches!(c.downcast_ref::<ResourceTableError>(), Some(ResourceTableError::Full))) {
        return failure(
            ErrorKind::ResourceLimit,
            format!("ResourceLimit: the guest held more than {MAX_RESOURCE_HANDLES} resource handles at once"),
        );
    }
    let detail = root_line(error);
    if let Some((kind, message)) = limit_hit(&detail, limits) {
        return failure(kind, message);
    }
    match trap {
        Some(trap) => {
            let refused = state.limiter.refused_memory;
            // Only a panic printed after the last refusal explains this trap.
            let since = refused.map_or(0, |r| r.stderr_offset);
            let panic = panic_message(&stderr.lossy_text_from(since));
            match (refused, panic) {
                // A Rust guest whose allocation fails aborts with `unreachable`
                // and no panic: that is the refused growth, not a bug.
                (Some(r), None) if trap == Trap::UnreachableCodeReached => failure(
                    ErrorKind::MemoryLimit,
                    format!(
                        "MemoryLimit: the job asked for {} bytes of memory, over its limit of {}",
                        r.wanted_bytes, limits.memory_bytes
                    ),
                ),
                (refused, panic) => {
                    let mut message = format!("Trap: {trap}");
                    if let Some(panic) = panic {
                        message.push_str(&format!(" ({panic})"));
                    }
                    if let Some(r) = refused {
                        message.push_str(&format!(
                            "; earlier, a memory growth to {} bytes was refused (limit {})",
                            r.wanted_bytes, limits.memory_bytes
                        ));
                    }
                    failure(ErrorKind::Trap, message)
                }
            }
        }
        None if detail.contains("maximum concurrent limit") => {
            failure(ErrorKind::HostError, format!("HostError: the instance pool is full: {detail}"))
        }
        None => failure(ErrorKind::Trap, format!("Trap: {}", misuse(&detail))),
    }
}

/// A limit named in wasmtime's wording of a refused instantiation or copy.
fn limit_hit(detail: &str, limits: &RunLimits) -> Option<(ErrorKind, String)> {
    if detail.contains("fuel allocated for hostcalls has been exhausted") {
        return Some((
            ErrorKind::OutputLimit,
            format!(
                "OutputLimit: the guest handed the host more than {} bytes in one call (its output limit is {} \
                 bytes, and one call may carry {HOSTCALL_SLACK_BYTES} bytes more)",
                hostcall_fuel(limits),
                limits.output_bytes
            ),
        ));
    }
    if detail.contains("exceeds memory limits") || detail.contains("memory has a minimum byte size") {
        return Some((ErrorKind::MemoryLimit, format!("MemoryLimit: {detail} (limit {} bytes)", limits.memory_bytes)));
    }
    let resource = [
        "exceeds table limits",
        "minimum element size",
        "core module instances",
        "memories, which exceeds",
        "tables, which exceeds",
        "resource limit exceeded",
        "exceeds the configured maximum",
    ];
    resource
        .iter()
        .any(|needle| detail.contains(needle))
        .then(|| (ErrorKind::ResourceLimit, format!("ResourceLimit: {detail}")))
}

/// A guest's misuse of an interface, said plainly, with wasmtime's words
/// after it.
fn misuse(detail: &str) -> String {
    let lower = detail.to_ascii_lowercase();
    let what = [
        ("utf-8", "the guest passed a string that is not valid UTF-8"),
        ("discriminant", "the guest passed an invalid variant, enum or option value"),
        ("realloc", "the guest's allocator (cabi_realloc) returned an unusable pointer"),
        ("unaligned", "the guest passed a misaligned pointer"),
        ("not aligned", "the guest passed a misaligned pointer"),
        ("out of bounds", "the guest passed a pointer or length outside its memory"),
        ("beyond end of memory", "the guest passed a pointer or length outside its memory"),
        ("empty poll list", "the guest polled an empty list of pollables"),
        ("requested len", "the guest asked for more random bytes than one call gives"),
        ("blocking-write-and-flush", "the guest wrote more than a stream permits at once"),
        ("check-write", "the guest wrote more than a stream permits at once"),
        ("unknown handle", "the guest used a resource handle it does not own"),
        ("resource", "the guest misused a resource handle"),
    ];
    match what.iter().find(|(needle, _)| lower.contains(needle)) {
        Some((_, plain)) => format!("{plain} ({detail})"),
        None => format!("the guest broke the component contract ({detail})"),
    }
}

/// The root cause's first line: the wasmtime message without the
/// backtrace header that `Display` puts first.
fn root_line(error: &wasmtime::Error) -> String {
    let root = error.root_cause().to_string();
    let line = root.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    cut_text(line.to_owned(), MAX_ERROR_MESSAGE_BYTES)
}

/// The panic line a Rust guest prints to stderr before it aborts.
fn panic_message(stderr: &str) -> Option<String> {
    let mut lines = stderr.lines().skip_while(|l| !l.contains("panicked at"));
    let header = lines.next()?.trim();
    let detail = lines.next().map(str::trim).unwrap_or_default();
    Some(if detail.is_empty() { header.to_owned() } else { format!("{header} {detail}") })
}

/// The guest's frames, innermost first, demangled; deep stacks are cut to
/// the first [`MAX_BACKTRACE_FRAMES`].
fn format_backtrace(backtrace: &WasmBacktrace) -> String {
    let frames = backtrace.frames();
    let mut lines: Vec<String> = frames
        .iter()
        .take(MAX_BACKTRACE_FRAMES)
        .enumerate()
        .map(|(i, frame)| {
            let module = frame.module().name().unwrap_or("<module>");
            match frame.func_name() {
                Some(name) => {
                    let name = cut_text(format!("{:#}", rustc_demangle::demangle(name)), MAX_FRAME_NAME_BYTES);
                    format!("{i:>3}: {}!{name}", cut_text(module.to_owned(), MAX_FRAME_NAME_BYTES))
                }
                None => {
                    format!(
                        "{i:>3}: {}!<func {}>",
                        cut_text(module.to_owned(), MAX_FRAME_NAME_BYTES),
                        frame.func_index()
                    )
                }
            }
        })
        .collect();
    if frames.len() > MAX_BACKTRACE_FRAMES {
        lines.push(format!("     ... {} more frames", frames.len() - MAX_BACKTRACE_FRAMES));
    }
    lines.join("\n")
}

/// Refuse bytes that are not a binary component before wasmtime sees them,
/// with a message that says what they are instead.
fn check_header(bytes: &[u8]) -> Result<(), SandboxError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked_before_compiling() {
        assert!(matches!(check_header(b""), Err(SandboxError::NotWasm(m)) if m.contains("empty")));
        assert!(matches!(check_header(b"#!/bin/sh\necho hi\n"), Err(SandboxError::NotWasm(_))));
        assert!(matches!(check_header(b"\0asm\x01\0\0\0"), Err(SandboxError::CoreModule)));
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn panic_message_is_found_in_stderr() {
        let stderr = "\nthread '<unnamed>' panicked at src/lib.rs:9:9:\nboom\nnote: run with RUST_BACKTRACE\n";
        assert_eq!(panic_message(stderr).unwrap(), "thread '<unnamed>' panicked at src/lib.rs:9:9: boom");
        assert_eq!(panic_message("nothing here"), None);
    }
}
