//! What a run ends as: an [`Outcome`] with its usage, captured output and,
//! on failure, an error kind, a message and a guest backtrace; and the
//! classification of wasmtime's errors and traps into those kinds.

use std::time::Duration;

use serde::Serialize;
use wasmtime::component::ResourceTableError;
use wasmtime::{FrameInfo, Module, Trap, WasmBacktrace};

use crate::job::ErrorKind;
use crate::sandbox::capture::CapturedOutput;
use crate::sandbox::journal::{LogRecord, Progress, cut_text};
use crate::sandbox::names::{ModuleNames, Names};
use crate::sandbox::request::{RunLimits, hostcall_fuel};
use crate::sandbox::state::HostState;
use crate::sandbox::{HOSTCALL_SLACK_BYTES, MAX_ERROR_MESSAGE_BYTES, MAX_RESOURCE_HANDLES, Tier, bindings};

/// Frames kept in a trap's backtrace.
pub(super) const MAX_BACKTRACE_FRAMES: usize = 48;
/// Longest function name kept per backtrace frame, in bytes.
pub(super) const MAX_FRAME_NAME_BYTES: usize = 256;

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
    /// For a retryable failure: not to be run again sooner than this
    /// (an outbound request's rate slot), whatever the backoff says.
    #[serde(skip)]
    pub retry_after: Option<std::time::Duration>,
}

impl Failure {
    /// A failure of `kind` with `message`, not retryable.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure { kind, message: message.into(), backtrace: None, retryable: false, stopped: None, retry_after: None }
    }

    pub(super) fn cancelled(mode: StopMode) -> Self {
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
    /// HTTP requests the host sent for the guest.
    pub http_requests: u64,
    /// HTTP requests the host denied (not granted, over the request
    /// limit, or resolving to an address not granted).
    pub http_denied: u64,
    /// Which compiler made the code that ran.
    pub tier: Tier,
}

pub(super) fn serialize_duration_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
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
    /// The effects a plan's execute phase proposed (none in any other
    /// run, or when the phase failed).
    pub proposals: Vec<crate::job::Proposal>,
}

impl Outcome {
    /// The failure kind, or `None` for success.
    pub fn error_kind(&self) -> Option<ErrorKind> {
        self.result.as_ref().err().map(|f| f.kind)
    }
}

/// Why the host ended a call early. Returned from the epoch callback as the
/// trap's cause, and from the watcher racing a blocked call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum Interrupted {
    #[error("the job ran past its timeout")]
    Timeout,
    #[error("the job was stopped by force")]
    Forced,
    /// An outbound request's rate slot is past the deadline (the failure
    /// is the [`RateTrip`](crate::sandbox::http::RateTrip)'s).
    #[error("an outbound request's rate slot is past the job's deadline")]
    RateLimited,
}

pub(super) type CallResult = wasmtime::Result<Result<Vec<u8>, bindings::leash::plugin::types::JobError>>;

pub(super) enum Ended {
    Returned(CallResult),
    Interrupted(Interrupted),
}

pub(super) fn interrupted_failure(why: Interrupted, limits: &RunLimits) -> Failure {
    match why {
        Interrupted::Timeout => {
            Failure::new(ErrorKind::Timeout, format!("Timeout: the job ran past its timeout of {:?}", limits.timeout))
        }
        Interrupted::Forced => Failure::cancelled(StopMode::Forced),
        Interrupted::RateLimited => Failure {
            retryable: true,
            ..Failure::new(ErrorKind::RateLimited, "RateLimited: an outbound request's rate slot is past the deadline")
        },
    }
}

pub(super) fn classify(
    ended: Ended,
    state: &HostState,
    limits: &RunLimits,
    stop_requested: bool,
    stderr: &CapturedOutput,
    names: Option<&Names>,
) -> Result<Vec<u8>, Failure> {
    use bindings::leash::plugin::types::JobError;
    let returned = match ended {
        Ended::Interrupted(why) => return Err(interrupted_failure(why, limits)),
        Ended::Returned(returned) => returned,
    };
    // Messages are cut after secrets are cleaned out (`Sandbox::run`).
    let guest_error = |kind, label: &str, message: String| Failure::new(kind, format!("{label}: {message}"));
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
        Err(error) => Err(classify_error(&error, state, limits, stderr, names)),
    }
}

/// Why a call that did not return ended. Everything that happens while
/// the guest runs is the guest's doing — a trap, a limit, a misuse of an
/// interface — except the few failures that are leash's own (a full
/// instance pool), which alone are `host_error`.
pub(super) fn classify_error(
    error: &wasmtime::Error,
    state: &HostState,
    limits: &RunLimits,
    stderr: &CapturedOutput,
    names: Option<&Names>,
) -> Failure {
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
    let frames = error.downcast_ref::<WasmBacktrace>();
    let backtrace = frames.map(|f| format_backtrace(f, names));
    let failure = |kind, message: String| Failure { backtrace: backtrace.clone(), ..Failure::new(kind, message) };
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
            let said = stderr.lossy_text_from(since);
            let panic = panic_message(&said);
            match (refused, panic) {
                // A Rust guest whose allocation fails aborts with `unreachable`
                // and no panic: that is the refused growth, not a bug. So is
                // an interpreter's out-of-memory error that nothing caught
                // (Python's `MemoryError`) after the refusal.
                (Some(r), panic)
                    if trap == Trap::UnreachableCodeReached && (panic.is_none() || reports_out_of_memory(&said)) =>
                {
                    failure(
                        ErrorKind::MemoryLimit,
                        format!(
                            "MemoryLimit: the job asked for {} bytes of memory, over its limit of {}",
                            r.wanted_bytes, limits.memory_bytes
                        ),
                    )
                }
                (refused, panic) => {
                    let mut message = format!("Trap: {trap}");
                    let stub =
                        frames.filter(|f| !f.frames().is_empty()).and_then(|f| frame_names(f.frames(), 0, names).1);
                    let stub = stub.filter(|_| panic.is_none());
                    if let Some(why) = stub.filter(|_| trap == Trap::UnreachableCodeReached).and_then(stubbed_import) {
                        message.push_str(&format!(" ({why})"));
                    }
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
pub(super) fn limit_hit(detail: &str, limits: &RunLimits) -> Option<(ErrorKind, String)> {
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
pub(super) fn misuse(detail: &str) -> String {
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

/// What a trap in a stub says, when the innermost frame is a WIT import's
/// own name: componentize-js (`-d http`, `-d random`, ...) replaces the
/// imports of a capability left out at build time with functions that
/// trap, so the guest crashes where it first uses that capability.
pub(super) fn stubbed_import(frame: &str) -> Option<String> {
    let resource = frame.strip_prefix('[').and_then(|rest| rest.split_once(']')).map(|(_, name)| name);
    let name = resource.unwrap_or(frame);
    let name = name.split('.').next().unwrap_or(name);
    let http = [
        "fields",
        "outgoing-request",
        "outgoing-body",
        "incoming-response",
        "incoming-body",
        "future-incoming-response",
        "future-trailers",
        "request-options",
        "handle",
    ];
    let capability = if http.contains(&name) {
        "outbound HTTP (wasi:http); componentize-js's `-d http` leaves it out: build with `-d fetch-event` only"
    } else if name.starts_with("get-random") || name.starts_with("get-insecure-random") || name == "insecure-seed" {
        "randomness (wasi:random); componentize-js's `-d random` leaves it out"
    } else if ["now", "resolution", "subscribe-instant", "subscribe-duration"].contains(&name) {
        "clocks (wasi:clocks); componentize-js's `-d clocks` leaves them out"
    } else if ["get-stdin", "get-stdout", "get-stderr"].contains(&name) {
        "standard streams (wasi:cli); componentize-js's `-d stdio` leaves them out"
    } else if resource.is_some() {
        "a capability left out when it was built"
    } else {
        return None;
    };
    Some(format!(
        "the guest called `{frame}`, an import its build replaced with a trap: it was built without {capability}"
    ))
}

/// The root cause's first line: the wasmtime message without the
/// backtrace header that `Display` puts first.
pub(super) fn root_line(error: &wasmtime::Error) -> String {
    let root = error.root_cause().to_string();
    let line = root.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    cut_text(line.to_owned(), MAX_ERROR_MESSAGE_BYTES)
}

/// Whether a guest's stderr reports that it ran out of memory: an
/// uncaught Python `MemoryError` (componentize-py prints the exception's
/// type before it aborts), or SpiderMonkey's `out of memory` as leash's
/// JavaScript helper prints it.
fn reports_out_of_memory(stderr: &str) -> bool {
    stderr.lines().any(|line| {
        let line = line.trim();
        line == "MemoryError"
            || line.starts_with("MemoryError:")
            || line.ends_with("type name: MemoryError")
            || line == "uncaught out of memory"
    })
}

/// Why a guest says it crashed: the panic line a Rust guest prints to
/// stderr before it aborts, a Python guest's uncaught exception, or the
/// `uncaught …` line leash's JavaScript helper prints.
pub(super) fn panic_message(stderr: &str) -> Option<String> {
    if let Some(exception) = python_exception(stderr) {
        return Some(exception);
    }
    // What leash's JavaScript helper prints of an error nothing caught.
    if let Some(line) = stderr.lines().rev().find(|l| l.starts_with("uncaught ")) {
        return Some(format!("JavaScript {}", line.trim_end()));
    }
    let mut lines = stderr.lines().skip_while(|l| !l.contains("panicked at"));
    let header = lines.next()?.trim();
    let detail = lines.next().map(str::trim).unwrap_or_default();
    Some(if detail.is_empty() { header.to_owned() } else { format!("{header} {detail}") })
}

/// The last line of the last Python traceback on stderr (`ValueError:
/// boom`): what a componentize-py guest's uncaught exception was. Its
/// runtime then panics with a message that names no exception.
fn python_exception(stderr: &str) -> Option<String> {
    let (_, after) = stderr.rsplit_once("Traceback (most recent call last):")?;
    let line = after.lines().skip(1).find(|l| !l.is_empty() && !l.starts_with(char::is_whitespace))?;
    Some(format!("Python {}", line.trim()))
}

/// The `leash:names` entry of frame `i`'s module: found by where the frame
/// is in the file, or, for a frame with no offset (a stack overflow's, in
/// its function's prologue), by another frame of the same module.
fn module_names<'a>(frames: &'a [FrameInfo], i: usize, names: Option<&'a Names>) -> Option<&'a ModuleNames> {
    let frame = frames.get(i)?;
    let offset = frame.module_offset().or_else(|| {
        frames.iter().filter(|f| Module::same(f.module(), frame.module())).find_map(FrameInfo::module_offset)
    })?;
    names?.module_at(offset)
}

/// Frame `i`'s module and function names: its module's own (`name`
/// section), else the component's `leash:names` section's.
fn frame_names<'a>(frames: &'a [FrameInfo], i: usize, names: Option<&'a Names>) -> (Option<&'a str>, Option<&'a str>) {
    let frame = &frames[i];
    let kept = || module_names(frames, i, names);
    let module = frame.module().name().or_else(|| kept()?.name());
    let function = frame.func_name().or_else(|| kept()?.function(frame.func_index()));
    (module, function)
}

/// The guest's frames, innermost first, demangled; deep stacks are cut to
/// the first [`MAX_BACKTRACE_FRAMES`]. Names come from the modules' own
/// name sections, else from the component's `leash:names` section.
pub(super) fn format_backtrace(backtrace: &WasmBacktrace, names: Option<&Names>) -> String {
    let frames = backtrace.frames();
    let mut lines: Vec<String> = frames
        .iter()
        .take(MAX_BACKTRACE_FRAMES)
        .enumerate()
        .map(|(i, frame)| {
            let (module, function) = frame_names(frames, i, names);
            let module = module.unwrap_or("<module>");
            match function {
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
