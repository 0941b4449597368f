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
mod state;
mod stop;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap, UpdateDeadline, WasmBacktrace,
};
use wasmtime_wasi::WasiCtxBuilder;

use self::cache::CompileCache;
use self::capture::CapturedOutput;
use self::limiter::JobLimiter;
use self::state::{HostState, LogBook};
pub use self::state::{LogLevel, LogRecord, MAX_LOG_MESSAGE_BYTES, NoObserver, Progress, RunObserver};
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
/// Table elements a job may grow a table to.
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Instance slots whose memory is reset in one batch of system calls.
const DECOMMIT_BATCH: usize = 16;
/// Frames kept in a trap's backtrace.
const MAX_BACKTRACE_FRAMES: usize = 48;
/// Core instances, memories and tables a job's component may create.
const MAX_INSTANCES_PER_JOB: usize = 32;

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
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            allocator: Allocator::Pooling { slots: DEFAULT_POOL_SLOTS },
            cache_dir: None,
            epoch_tick: DEFAULT_EPOCH_TICK,
            memory_ceiling_bytes: DEFAULT_MEMORY_CEILING_BYTES,
            fuel: true,
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
    #[error("component does not implement leash:plugin@0.1.0: {0}")]
    WorldMismatch(String),
    /// The engine could not be configured.
    #[error("cannot set up the WebAssembly engine: {0}")]
    Engine(String),
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
            let mut pool = PoolingAllocationConfig::new();
            pool.total_component_instances(slots)
                .total_core_instances(slots.saturating_mul(8))
                .total_memories(slots.saturating_mul(2))
                .total_tables(slots.saturating_mul(4))
                .total_stacks(slots)
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
        Ok(Sandbox { engine, linker, cache, config, _ticker: ticker })
    }

    /// The settings this sandbox was built with.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Validate and compile a component. CPU-heavy on a cache miss (tens
    /// to hundreds of milliseconds): call it off the async runtime.
    pub fn load(&self, bytes: &[u8]) -> Result<Plugin, SandboxError> {
        check_header(bytes)?;
        let digest = Digest::of(bytes);
        let component = match self.cache.as_ref().and_then(|c| c.get(&self.engine, &digest)) {
            Some(component) => component,
            None => {
                let component =
                    Component::new(&self.engine, bytes).map_err(|e| SandboxError::InvalidComponent(one_line(&e)))?;
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
            .build();
        let memory_limit =
            usize::try_from(limits.memory_bytes.min(self.config.memory_ceiling_bytes)).unwrap_or(usize::MAX);
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            limiter: JobLimiter::new(memory_limit, MAX_TABLE_ELEMENTS, MAX_INSTANCES_PER_JOB),
            logs: LogBook::new(limits.log_records, limits.log_bytes),
            last_progress: None,
            stop: stop.clone(),
            observer,
            started,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
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
    match returned {
        Ok(_) if stop_requested => Err(Failure::cancelled(StopMode::Cooperative)),
        Ok(Ok(output)) if output.len() as u64 > limits.output_bytes => Err(Failure::new(
            ErrorKind::OutputLimit,
            format!("OutputLimit: the job returned {} bytes, over its limit of {}", output.len(), limits.output_bytes),
        )),
        Ok(Ok(output)) => Ok(output),
        Ok(Err(JobError::Failed(message))) => Err(Failure::new(ErrorKind::GuestError, format!("Failed: {message}"))),
        Ok(Err(JobError::Retryable(message))) => {
            Err(Failure { retryable: true, ..Failure::new(ErrorKind::GuestError, format!("Retryable: {message}")) })
        }
        Ok(Err(JobError::InvalidInput(message))) => {
            Err(Failure::new(ErrorKind::InvalidInput, format!("InvalidInput: {message}")))
        }
        Err(error) => Err(classify_error(&error, state, limits, stderr)),
    }
}

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
    if let Some(wanted) = state.limiter.refused_memory_bytes {
        return Failure::new(
            ErrorKind::MemoryLimit,
            format!(
                "MemoryLimit: the job asked for {wanted} bytes of memory, over its limit of {}",
                limits.memory_bytes
            ),
        );
    }
    let backtrace = error.downcast_ref::<WasmBacktrace>().map(format_backtrace);
    match trap {
        Some(trap) => {
            let mut message = format!("Trap: {trap}");
            if let Some(panic) = panic_message(&stderr.lossy_text()) {
                message.push_str(&format!(" ({panic})"));
            }
            Failure { backtrace, ..Failure::new(ErrorKind::Trap, message) }
        }
        None => Failure { backtrace, ..Failure::new(ErrorKind::HostError, format!("HostError: {}", one_line(error))) },
    }
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
                Some(name) => format!("{i:>3}: {module}!{:#}", rustc_demangle::demangle(name)),
                None => format!("{i:>3}: {module}!<func {}>", frame.func_index()),
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
