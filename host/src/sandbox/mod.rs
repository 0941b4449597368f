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
//! environment, no arguments, no sockets; clocks and random only. Outbound
//! HTTP (`wasi:http/outgoing-handler`) is linked for every guest and
//! reaches only what the job's [`Grants`](crate::job::Grants) allow (see [`http`]), and
//! `wasi:config/store` shows the guest its granted configuration only.
//!
//! Every ending is an [`Outcome`] whose failures carry an [`ErrorKind`](crate::job::ErrorKind).
//! Nothing wasmtime-typed leaves this module, and the module knows nothing
//! of storage: the durable parts of leash call it and record the outcome.

mod bindings;
mod cache;
mod capture;
mod engine;
mod functions;
pub mod http;
mod journal;
mod limiter;
pub mod names;
mod outcome;
pub mod proposals;
mod redact;
mod request;
mod run;
mod setup;
mod shape;
mod state;
mod stop;
mod tiers;

use std::fmt;
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Linker;

use self::cache::CompileCache;
pub use self::cache::SharedCode;
use self::engine::EpochTicker;
pub use self::engine::{Allocator, Compiler, MAX_GUEST_ERROR_TEXT_BYTES, SandboxConfig, Tier};
pub use self::functions::FunctionCounts;
pub use self::journal::{
    FIELDS_DROPPED_KEY, LogLevel, LogRecord, MAX_LOG_FIELDS, MAX_LOG_KEY_BYTES, MAX_LOG_MESSAGE_BYTES,
    MAX_LOG_VALUE_BYTES, NoObserver, Progress, RunObserver,
};
use self::outcome::Interrupted;
pub use self::outcome::{Captured, Failure, Outcome, StopMode, Usage};
pub(crate) use self::redact::Redactor;
pub use self::request::{RunLimits, RunRequest};
pub use self::shape::{ComponentLimits, DEFAULT_MAX_COMPONENT_BYTES, declared_requests};
use self::state::HostState;
pub use self::stop::StopHandle;
pub use self::tiers::BASELINE_FIRST_BYTES;
use crate::job::Digest;

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
/// Default bound of the function cache ([`SandboxConfig::function_cache_bytes`]).
pub const DEFAULT_FUNCTION_CACHE_BYTES: u64 = 1 << 30;
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
/// Default number of components compiled at once for loads that wait;
/// more wait their turn. One: a compile at the caps costs ~5.5 s and
/// ~450 MiB here (BENCHMARKS.md), and Cranelift already spreads one
/// compile over every core. Under [`Compiler::Tiered`] one optimizing
/// compile behind the jobs may run beside it.
pub const DEFAULT_COMPILE_CONCURRENCY: usize = 1;

/// Default bytes of each pooled guest memory kept resident between
/// instances ([`SandboxConfig::keep_resident_bytes`]).
pub const DEFAULT_KEEP_RESIDENT_BYTES: u64 = 1 << 20;

/// Default niceness added to the threads that compile components: a
/// compile takes the CPU the guests and the store leave, not theirs.
pub const DEFAULT_COMPILE_NICE: i32 = 10;

/// Lower the calling thread's CPU priority by `nice` (0 to 19; 0 leaves
/// it). On Linux each thread has its own niceness. A failure leaves the
/// thread as it was.
pub(crate) fn lower_thread_priority(nice: i32) {
    let nice = nice.clamp(0, 19);
    if nice == 0 {
        return;
    }
    // SAFETY: plain syscalls on this thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, now.saturating_add(nice));
    }
}

/// Run `work` on a named thread of its own, behind the job that does not
/// wait for it; `false` (said in the log) when the thread cannot start.
fn behind(name: &str, digest: &Digest, work: impl FnOnce() + Send + 'static) -> bool {
    let started = std::thread::Builder::new().name(name.to_owned()).spawn(work);
    if let Err(e) = &started {
        tracing::warn!(error = %e, %digest, thread = name, "cannot start work behind the job");
    }
    started.is_ok()
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
    /// The component uses a WebAssembly proposal the engine does not
    /// enable ([`proposals::PROPOSALS`]).
    #[error(
        "invalid component: it uses {0}, which leash does not enable \
         (leash runs what the Rust, Python and JavaScript guest toolchains emit; see docs/plugin-contract.md)"
    )]
    UnsupportedProposal(String),
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

/// A validated, compiled plugin, ready to instantiate. Cheap to clone; the
/// clones share its code, so when the optimized code of a plugin that
/// started on the baseline tier arrives, every clone runs it from then on.
#[derive(Clone)]
pub struct Plugin {
    digest: Digest,
    code: std::sync::Arc<std::sync::RwLock<std::sync::Arc<Code>>>,
    loaded: Loaded,
    /// Its `leash:names` section, read at load: names its backtraces'
    /// frames when its modules carry none of their own.
    names: Option<std::sync::Arc<names::Names>>,
}

/// The code a plugin's next instance is made from.
struct Code {
    tier: Tier,
    pre: bindings::PluginPre<HostState>,
}

impl Plugin {
    fn new(admitted: Admitted, pre: bindings::PluginPre<HostState>, loaded: Loaded) -> Plugin {
        let code = std::sync::Arc::new(std::sync::RwLock::new(std::sync::Arc::new(Code { tier: loaded.tier, pre })));
        Plugin { digest: admitted.digest, code, loaded, names: admitted.names }
    }

    /// The sha256 of the component bytes.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// How this plugin was made ready: compiled, or read from the cache.
    pub fn loaded(&self) -> Loaded {
        self.loaded
    }

    /// Which compiler made the code its next job runs.
    pub fn tier(&self) -> Tier {
        self.code().tier
    }

    /// What a run instantiates: one reference taken under the lock.
    fn code(&self) -> std::sync::Arc<Code> {
        self.code.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// From now on, instances are made from `pre`.
    fn replace_code(&self, tier: Tier, pre: bindings::PluginPre<HostState>) {
        *self.code.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(Code { tier, pre });
    }
}

/// A component's bytes, checked and read before compiling: its digest
/// and the names it carries for backtraces.
#[derive(Clone)]
pub(super) struct Admitted {
    pub(super) digest: Digest,
    pub(super) names: Option<std::sync::Arc<names::Names>>,
}

/// How [`Sandbox::load`] made a plugin ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// Validating, compiling (or reading the compile cache) and linking.
    pub duration: Duration,
    /// Whether the compiled code came from the on-disk compile cache.
    pub from_cache: bool,
    /// Whether it came from the store: another process compiled it.
    pub fetched: bool,
    /// When compiled with the function cache on: its functions found
    /// compiled and compiled now. With more than one compile at once
    /// ([`SandboxConfig::compile_concurrency`]) the others' are counted too.
    pub functions: Option<FunctionCounts>,
    /// Which compiler made the code its first jobs run.
    pub tier: Tier,
}

impl Loaded {
    /// What the load did, for a line about it: `"compiled"`, `"compiled
    /// with the baseline compiler"`, `"loaded from the compile cache"`.
    pub fn how(&self) -> &'static str {
        if self.fetched {
            return "fetched compiled from the store";
        }
        match (self.from_cache, self.tier) {
            (true, Tier::Optimized) => "loaded from the compile cache",
            (true, Tier::Baseline) => "loaded baseline code from the compile cache",
            (false, Tier::Optimized) => "compiled",
            (false, Tier::Baseline) => "compiled with the baseline compiler",
        }
    }

    /// What the function cache saved, for a line about the compile: `" (9300
    /// of 9400 functions reused)"`, or nothing when it saved nothing.
    pub fn reuse_note(&self) -> String {
        match self.functions {
            Some(f) if f.reused > 0 => format!(" ({} of {} functions reused)", f.reused, f.reused + f.compiled),
            _ => String::new(),
        }
    }
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin").field("digest", &self.digest).field("loaded", &self.loaded).finish_non_exhaustive()
    }
}

/// The process's WebAssembly sandbox. Create one and share it.
pub struct Sandbox {
    engine: Engine,
    /// [`cache::engine_key`] of `engine`.
    engine_key: String,
    linker: Linker<HostState>,
    cache: Option<CompileCache>,
    /// Cranelift's incremental cache, beside the compile cache.
    functions: Option<std::sync::Arc<functions::FunctionCache>>,
    /// Under [`Compiler::Tiered`], the baseline compiler's engine.
    baseline: Option<tiers::Baseline>,
    config: SandboxConfig,
    /// Bounds how many compiles run at once, so a burst of new plugins (or
    /// a compile bomb) holds a bounded number of blocking threads.
    compiling: tokio::sync::Semaphore,
    /// The threads compiles run on (Cranelift compiles a component's
    /// functions in parallel), at [`SandboxConfig::compile_nice`]; started
    /// at the first compile. `None` inside: they could not be started, and
    /// compiles use the global pool.
    compile_pool: std::sync::OnceLock<Option<rayon_core::ThreadPool>>,
    _ticker: EpochTicker,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox").field("config", &self.config).finish_non_exhaustive()
    }
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

#[cfg(test)]
mod tests {
    use super::engine::check_header;
    use super::outcome::{panic_message, stubbed_import};
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

    #[test]
    fn a_python_exception_is_found_in_stderr() {
        let stderr = "Traceback (most recent call last):\n  File \"app.py\", line 9, in handle\n    raise ValueError(\"boom\")\n\
                      ValueError: boom\n\nthread '<unnamed>' (1) panicked at runtime/src/lib.rs:1293:29:\n\
                      Python function threw an unexpected exception\n";
        assert_eq!(panic_message(stderr).unwrap(), "Python ValueError: boom");
    }

    #[test]
    fn a_trap_in_a_stubbed_import_names_the_capability_left_out() {
        let http = stubbed_import("[constructor]fields").unwrap();
        assert!(http.contains("`[constructor]fields`") && http.contains("outbound HTTP"), "{http}");
        assert!(stubbed_import("handle").unwrap().contains("outbound HTTP"));
        assert!(stubbed_import("[method]future-incoming-response.get").unwrap().contains("outbound HTTP"));
        assert!(stubbed_import("get-random-bytes").unwrap().contains("wasi:random"));
        assert!(stubbed_import("[method]thing.go").unwrap().contains("a capability left out"));
        // A guest function of its own is no stub.
        assert_eq!(stubbed_import("my_crate::work"), None);
    }
}
