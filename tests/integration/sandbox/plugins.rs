//! Every plugin in `plugins/` against the sandbox: each behaves as its
//! contract says, and the sandbox still runs `hello` afterwards.

use std::sync::Arc;
use std::time::Duration;

use leash::job::{ErrorKind, Target};
use leash::sandbox::{
    Allocator, Compiler, NoObserver, RunLimits, Sandbox, SandboxConfig, SandboxError, StopHandle, StopMode,
};

use crate::support::{self, GENEROUS, ProgressTap, assert_hello_still_runs, limits, load, output_json, request, run};

fn failure_kind(outcome: &leash::sandbox::Outcome) -> ErrorKind {
    match &outcome.result {
        Ok(output) => panic!("expected a failure, got {} output bytes", output.len()),
        Err(failure) => failure.kind,
    }
}

#[tokio::test]
async fn hello_greets_logs_and_reports_progress() {
    let sandbox = support::sandbox();
    let outcome = run(&sandbox, "hello", br#"{"name":"Ada"}"#, limits()).await;
    let output = output_json(&outcome);
    assert_eq!(output["greeting"], "Hello, Ada!");
    assert_eq!(output["target"], "execute");
    assert_eq!(output["attempt"], 1);
    assert_eq!(outcome.logs.len(), 1);
    assert_eq!(outcome.logs[0].message, "greeting Ada");
    assert_eq!(outcome.last_progress.as_ref().map(|p| (p.done, p.total)), Some((1, 1)));
    assert!(outcome.usage.fuel_used > 0);
    assert!(outcome.usage.peak_memory_bytes > 0);
}

#[tokio::test]
async fn hello_sees_the_requested_action() {
    let sandbox = support::sandbox();
    let plugin = load(&sandbox, "hello");
    let mut req = request(b"", limits());
    req.target = Target::action("wave").unwrap();
    req.attempt = 3;
    let outcome = sandbox.run(&plugin, req, &StopHandle::new(), Arc::new(NoObserver)).await;
    let output = output_json(&outcome);
    assert_eq!(output["target"], "action:wave");
    assert_eq!(output["attempt"], 3);
}

#[tokio::test]
async fn hello_rejects_bad_input_as_invalid_input() {
    let sandbox = support::sandbox();
    let outcome = run(&sandbox, "hello", br#"{"name": 5}"#, limits()).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::InvalidInput);
    assert!(outcome.result.unwrap_err().message.starts_with("InvalidInput: "));
}

#[tokio::test]
async fn echo_returns_binary_input_unchanged() {
    let sandbox = support::sandbox();
    let input: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let outcome = run(&sandbox, "echo", &input, limits()).await;
    assert_eq!(outcome.result.unwrap(), input);
}

#[tokio::test]
async fn spin_is_stopped_by_its_timeout() {
    let sandbox = support::sandbox();
    let timeout = Duration::from_millis(200);
    let outcome = run(&sandbox, "spin", b"", RunLimits { timeout, ..limits() }).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::Timeout);
    assert!(outcome.usage.duration >= timeout, "stopped before its timeout: {:?}", outcome.usage.duration);
    assert!(outcome.usage.duration < GENEROUS);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn spin_is_stopped_by_fuel_when_fuel_is_the_tighter_limit() {
    let sandbox = support::sandbox();
    let fuel = 50_000_000;
    let outcome = run(&sandbox, "spin", b"", RunLimits { fuel: Some(fuel), ..limits() }).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::OutOfFuel);
    assert_eq!(outcome.usage.fuel_used, fuel);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn coop_stops_cooperatively_before_the_grace_ends() {
    let sandbox = support::sandbox();
    let plugin = load(&sandbox, "coop");
    let stop = StopHandle::new();
    let (tap, mut progress) = ProgressTap::new();
    // A grace far longer than the test: only a cooperative stop ends it.
    let req = request(b"", RunLimits { cancel_grace: Duration::from_secs(3600), ..limits() });
    let run = sandbox.run(&plugin, req, &stop, tap);
    let cancel = async {
        progress.recv().await.expect("coop reports progress");
        stop.request();
    };
    let (outcome, ()) = tokio::join!(run, cancel);
    let failure = outcome.result.as_ref().unwrap_err();
    assert_eq!(failure.kind, ErrorKind::Cancelled);
    assert_eq!(failure.stopped, Some(StopMode::Cooperative));
    assert!(outcome.logs.iter().any(|l| l.message.starts_with("stopping cleanly")));
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn coop_finishes_when_nobody_cancels() {
    let sandbox = support::sandbox();
    let outcome = run(&sandbox, "coop", br#"{"steps": 3}"#, limits()).await;
    assert_eq!(output_json(&outcome)["steps_done"], 3);
}

#[tokio::test]
async fn spin_ignoring_a_cancel_is_stopped_by_force_after_the_grace() {
    let sandbox = support::sandbox();
    let plugin = load(&sandbox, "spin");
    let stop = StopHandle::new();
    stop.request();
    let grace = Duration::from_millis(100);
    let req = request(b"", RunLimits { cancel_grace: grace, ..limits() });
    let outcome = sandbox.run(&plugin, req, &stop, Arc::new(NoObserver)).await;
    let failure = outcome.result.as_ref().unwrap_err();
    assert_eq!(failure.kind, ErrorKind::Cancelled);
    assert_eq!(failure.stopped, Some(StopMode::Forced));
    assert!(outcome.usage.duration >= grace);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn sleep_is_interrupted_by_its_timeout() {
    let sandbox = support::sandbox();
    let outcome = run(&sandbox, "sleep", b"", RunLimits { timeout: Duration::from_millis(200), ..limits() }).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::Timeout);
    assert!(outcome.usage.duration < GENEROUS);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn sleep_is_stopped_at_once_by_a_forced_stop() {
    let sandbox = support::sandbox();
    let plugin = load(&sandbox, "sleep");
    let stop = StopHandle::new();
    stop.force();
    // Neither the grace nor the timeout can end this run; only the force can.
    let req = request(b"", RunLimits { cancel_grace: Duration::from_secs(3600), ..limits() });
    let outcome = sandbox.run(&plugin, req, &stop, Arc::new(NoObserver)).await;
    let failure = outcome.result.as_ref().unwrap_err();
    assert_eq!(failure.kind, ErrorKind::Cancelled);
    assert_eq!(failure.stopped, Some(StopMode::Forced));
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn sleep_that_wakes_in_time_succeeds() {
    let sandbox = support::sandbox();
    let outcome = run(&sandbox, "sleep", br#"{"ms": 1}"#, limits()).await;
    assert_eq!(output_json(&outcome)["slept_ms"], 1);
}

#[tokio::test]
async fn alloc_bomb_ends_at_its_memory_limit() {
    let sandbox = support::sandbox();
    let memory = 32 << 20;
    let outcome = run(&sandbox, "alloc-bomb", b"", RunLimits { memory_bytes: memory, ..limits() }).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::MemoryLimit);
    assert!(outcome.usage.peak_memory_bytes <= memory);
    assert!(outcome.usage.peak_memory_bytes > memory / 2, "it did grow: {}", outcome.usage.peak_memory_bytes);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn stack_overflow_ends_as_a_trap_with_a_backtrace() {
    let sandbox = support::sandbox();
    let outcome = run(&sandbox, "stack-overflow", b"", limits()).await;
    let failure = outcome.result.as_ref().unwrap_err();
    assert_eq!(failure.kind, ErrorKind::Trap);
    assert!(failure.message.contains("call stack exhausted"), "{}", failure.message);
    let backtrace = failure.backtrace.as_deref().expect("a backtrace");
    assert!(backtrace.contains("stack_overflow::descend"), "{backtrace}");
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn panic_ends_as_a_trap_with_its_message_and_a_backtrace() {
    let sandbox = support::sandbox();
    let outcome = run(&sandbox, "panic", b"", limits()).await;
    let failure = outcome.result.as_ref().unwrap_err();
    assert_eq!(failure.kind, ErrorKind::Trap);
    assert!(failure.message.contains("the panic plugin always panics"), "{}", failure.message);
    assert!(failure.backtrace.as_deref().is_some_and(|b| b.contains("panic")));
    assert!(String::from_utf8_lossy(&outcome.stderr.bytes).contains("panicked at"));
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn big_output_ends_at_the_output_limit() {
    let sandbox = support::sandbox();
    let outcome = run(&sandbox, "big-output", b"", RunLimits { output_bytes: 1 << 20, ..limits() }).await;
    let failure = outcome.result.as_ref().unwrap_err();
    assert_eq!(failure.kind, ErrorKind::OutputLimit);
    // 8 MiB is past what wasmtime may copy out of the guest at all, so the
    // copy itself is refused, before the output exists in the host.
    assert!(failure.message.contains("output limit is 1048576 bytes"), "{}", failure.message);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn output_at_the_limit_is_accepted() {
    let sandbox = support::sandbox();
    let outcome =
        run(&sandbox, "big-output", br#"{"bytes": 4096}"#, RunLimits { output_bytes: 4096, ..limits() }).await;
    assert_eq!(outcome.result.unwrap().len(), 4096);
}

#[tokio::test]
async fn log_spam_is_capped_and_still_finishes() {
    let sandbox = support::sandbox();
    let lines = 20_000;
    let outcome = run(
        &sandbox,
        "log-spam",
        format!(r#"{{"lines": {lines}}}"#).as_bytes(),
        RunLimits { log_records: 100, ..limits() },
    )
    .await;
    assert_eq!(output_json(&outcome)["lines"], lines);
    assert_eq!(outcome.logs.len(), 100);
    assert_eq!(outcome.logs_dropped, lines - 100);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn fs_escape_sees_no_host_files() {
    let sandbox = support::sandbox();
    let report = output_json(&run(&sandbox, "fs-escape", b"", limits()).await);
    for attempt in ["read_etc_passwd", "list_root", "list_cwd"] {
        assert_eq!(report[attempt]["ok"], false, "{attempt}: {}", report[attempt]);
    }
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn env_read_sees_no_environment_or_arguments() {
    // The test process has PATH and HOME (cargo sets more); none may show.
    assert!(std::env::var_os("PATH").is_some());
    let sandbox = support::sandbox();
    let report = output_json(&run(&sandbox, "env-read", b"", limits()).await);
    assert_eq!(report["vars"], serde_json::json!([]));
    assert_eq!(report["args"], serde_json::json!([]));
    assert_eq!(report["home"], serde_json::Value::Null);
    assert_eq!(report["path"], serde_json::Value::Null);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn net_escape_reaches_nothing() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let sandbox = support::sandbox();
    let input = format!(r#"{{"addr": "{addr}"}}"#);
    let report = output_json(&run(&sandbox, "net-escape", input.as_bytes(), limits()).await);
    for attempt in ["tcp_connect", "udp_send", "dns_lookup"] {
        assert_eq!(report[attempt]["ok"], false, "{attempt}: {}", report[attempt]);
    }
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the guest reached the host's listener: {accepted:?}"
    );
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn a_spinning_guest_does_not_hold_up_others_on_one_thread() {
    // The default test runtime has one thread: if the spinner never yielded,
    // no hello could finish until it was stopped.
    let sandbox = Arc::new(support::sandbox());
    let spin = load(&sandbox, "spin");
    let stop = StopHandle::new();
    let spinner = tokio::spawn({
        let (sandbox, stop) = (sandbox.clone(), stop.clone());
        async move { sandbox.run(&spin, request(b"", limits()), &stop, Arc::new(NoObserver)).await }
    });
    let hello = load(&sandbox, "hello");
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (sandbox, hello) = (sandbox.clone(), hello.clone());
        runs.spawn(async move {
            let req = request(format!(r#"{{"name":"n{i}"}}"#).as_bytes(), limits());
            (i, sandbox.run(&hello, req, &StopHandle::new(), Arc::new(NoObserver)).await)
        });
    }
    while let Some(done) = runs.join_next().await {
        let (i, outcome) = done.unwrap();
        assert_eq!(output_json(&outcome)["greeting"], format!("Hello, n{i}!"));
    }
    assert!(!spinner.is_finished(), "the spinner was still running while every hello finished");
    stop.force();
    let spun = spinner.await.unwrap();
    assert_eq!(spun.result.unwrap_err().stopped, Some(StopMode::Forced));
}

#[tokio::test]
async fn on_demand_allocation_runs_plugins_too() {
    let sandbox = Sandbox::new(SandboxConfig { allocator: Allocator::OnDemand, ..SandboxConfig::default() }).unwrap();
    assert_hello_still_runs(&sandbox).await;
    let outcome = run(&sandbox, "alloc-bomb", b"", RunLimits { memory_bytes: 16 << 20, ..limits() }).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::MemoryLimit);
}

#[test]
fn a_core_module_is_refused_with_a_hint() {
    let sandbox = support::sandbox();
    let module = wat::parse_str("(module)").unwrap();
    let err = sandbox.load(&module).unwrap_err();
    assert!(matches!(err, SandboxError::CoreModule));
    assert!(err.to_string().contains("wasm32-wasip2"));
}

#[test]
fn random_bytes_are_not_wasm() {
    let sandbox = support::sandbox();
    let err = sandbox.load(b"MZ\x90\x00 definitely not wasm").unwrap_err();
    assert!(matches!(err, SandboxError::NotWasm(_)), "{err}");
}

#[test]
fn a_truncated_component_is_invalid() {
    let sandbox = support::sandbox();
    let bytes = leash_tests::plugin_bytes("hello");
    let err = sandbox.load(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(matches!(err, SandboxError::InvalidComponent(_)), "{err}");
    assert!(!err.to_string().contains('\n'), "one line: {err}");
}

#[test]
fn a_component_without_the_run_export_names_what_is_missing() {
    let sandbox = support::sandbox();
    let component = wat::parse_str("(component)").unwrap();
    let err = sandbox.load(&component).unwrap_err();
    assert!(matches!(err, SandboxError::WorldMismatch(_)), "{err}");
    assert!(err.to_string().contains("run"), "{err}");
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    for hint in ["leash_sdk::export!", "class WitWorld(leash.Plugin)", "export const run = leash.plugin"] {
        assert!(err.to_string().contains(hint), "names how each language exports run: {err}");
    }
}

#[test]
fn a_component_importing_something_unknown_names_the_import() {
    let sandbox = support::sandbox();
    let component =
        wat::parse_str(r#"(component (import "acme:secrets/vault" (instance (export "get" (func)))))"#).unwrap();
    let err = sandbox.load(&component).unwrap_err();
    assert!(matches!(err, SandboxError::WorldMismatch(_)), "{err}");
    assert!(err.to_string().contains("acme:secrets/vault"), "{err}");
}

#[test]
fn a_corrupt_cache_entry_is_a_miss_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = || SandboxConfig { cache_dir: Some(dir.path().to_owned()), ..SandboxConfig::default() };
    let bytes = leash_tests::plugin_bytes("echo");
    let digest = Sandbox::new(config()).unwrap().load(&bytes).unwrap().digest();

    let entries: Vec<_> =
        walk(dir.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "cwasm")).collect();
    assert_eq!(entries.len(), 1, "one cache entry written: {entries:?}");
    assert!(entries[0].to_string_lossy().contains(&digest.hex()));

    for damage in [Damage::Truncate, Damage::FlipByte, Damage::Empty] {
        damage.apply(&entries[0]);
        let sandbox = Sandbox::new(config()).unwrap();
        let plugin = sandbox.load(&bytes).expect("a damaged entry is recompiled");
        assert_eq!(plugin.digest(), digest);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let outcome =
            runtime.block_on(sandbox.run(&plugin, request(b"ok", limits()), &StopHandle::new(), Arc::new(NoObserver)));
        assert_eq!(outcome.result.unwrap(), b"ok");
    }
}

/// The function cache: a rebuilt plugin (a new digest, the same code)
/// compiles almost none of its functions again and runs; damage to the cache's
/// file or to any value in it makes misses, never an error or a wrong
/// run; with the cache off a compile reports no reuse.
#[test]
fn a_rebuilt_plugin_reuses_its_compiled_functions_and_a_damaged_function_cache_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let config = || SandboxConfig { cache_dir: Some(dir.path().to_owned()), ..SandboxConfig::default() };
    let bytes = leash_tests::plugin_bytes("echo");
    let runs = |sandbox: &Sandbox, plugin: &leash::sandbox::Plugin| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let outcome =
            runtime.block_on(sandbox.run(plugin, request(b"ok", limits()), &StopHandle::new(), Arc::new(NoObserver)));
        assert_eq!(outcome.result.unwrap(), b"ok");
    };
    let first = Sandbox::new(config()).unwrap().load(&bytes).unwrap().loaded().functions.unwrap();
    assert!(first.compiled > 0, "{first:?}");

    let sandbox = Sandbox::new(config()).unwrap();
    let rebuilt = sandbox.load(&with_custom_section(&bytes, 1)).unwrap();
    let functions = rebuilt.loaded().functions.unwrap();
    assert!(!rebuilt.loaded().from_cache);
    // Most, not all: a few functions' Cranelift input differs from one
    // compile to the next (measured: 2 to 5 of echo's 42 here alone, 12 in
    // one run beside the whole suite under load; 2-6% of a Python
    // guest's), and each such function is compiled again. Without the
    // cache a compile reuses only its own duplicates: under half (below).
    let total = first.compiled + first.reused;
    assert_eq!(functions.compiled + functions.reused, total, "{functions:?}");
    assert!(functions.reused * 2 > total, "more than half reused: {functions:?} of {total}");
    runs(&sandbox, &rebuilt);

    let file = walk(dir.path()).into_iter().find(|p| p.ends_with("functions.db")).expect("the function cache's file");
    // Every value altered on disk: each is a miss (its checksum fails).
    let db = rusqlite::Connection::open(&file).unwrap();
    db.execute("UPDATE functions SET value = value || x'00'", []).unwrap();
    drop(db);
    let sandbox = Sandbox::new(config()).unwrap();
    let altered = sandbox.load(&with_custom_section(&bytes, 2)).unwrap();
    let functions = altered.loaded().functions.unwrap();
    // What it reuses are its own duplicate functions, made in this compile.
    assert!(functions.reused * 2 < total, "no altered value is used: {functions:?} of {total}");
    runs(&sandbox, &altered);

    // The whole file overwritten: started again, and the compile works.
    for damage in [Damage::FlipByte, Damage::Truncate, Damage::Empty] {
        damage.apply(&file);
        let sandbox = Sandbox::new(config()).unwrap();
        let plugin = sandbox.load(&with_custom_section(&bytes, 3 + damage as u8)).unwrap();
        runs(&sandbox, &plugin);
    }

    let off = SandboxConfig { function_cache_bytes: 0, ..config() };
    let plugin = Sandbox::new(off).unwrap().load(&with_custom_section(&bytes, 9)).unwrap();
    assert_eq!(plugin.loaded().functions, None);
}

/// The baseline compiler (Winch) keeps every limit Cranelift's code
/// keeps: a timeout and a forced stop (epochs), fuel to the unit, the
/// memory limit, a stack overflow as a trap; and runs hello after each.
/// In one cache folder, Cranelift does not take Winch's artifact, and
/// Winch finds its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baseline_compiler_keeps_every_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        |compiler| SandboxConfig { compiler, cache_dir: Some(dir.path().to_owned()), ..support::sandbox_config() };
    let sandbox = Sandbox::new(config(Compiler::Winch)).unwrap();
    let hello_bytes = leash_tests::plugin_bytes("hello");
    assert!(!sandbox.load(&hello_bytes).unwrap().loaded().from_cache);
    let cranelift = Sandbox::new(config(Compiler::Cranelift)).unwrap().load(&hello_bytes).unwrap();
    assert!(!cranelift.loaded().from_cache, "Winch's artifact is not Cranelift's");
    assert!(Sandbox::new(config(Compiler::Winch)).unwrap().load(&hello_bytes).unwrap().loaded().from_cache);

    let hello = run(&sandbox, "hello", br#"{"name":"Ada"}"#, limits()).await;
    assert_eq!(output_json(&hello)["greeting"], "Hello, Ada!");
    assert_eq!(hello.logs[0].message, "greeting Ada");

    let timeout = Duration::from_millis(200);
    let outcome = run(&sandbox, "spin", b"", RunLimits { timeout, ..limits() }).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::Timeout);
    assert!(outcome.usage.duration >= timeout && outcome.usage.duration < GENEROUS, "{:?}", outcome.usage.duration);

    let fuel = 50_000_000;
    let outcome = run(&sandbox, "spin", b"", RunLimits { fuel: Some(fuel), ..limits() }).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::OutOfFuel);
    assert_eq!(outcome.usage.fuel_used, fuel);

    let stop = StopHandle::new();
    stop.request();
    let req = request(b"", RunLimits { cancel_grace: Duration::from_millis(100), ..limits() });
    let outcome = sandbox.run(&load(&sandbox, "spin"), req, &stop, Arc::new(NoObserver)).await;
    assert_eq!(outcome.result.as_ref().unwrap_err().stopped, Some(StopMode::Forced));

    let memory = 32 << 20;
    let outcome = run(&sandbox, "alloc-bomb", b"", RunLimits { memory_bytes: memory, ..limits() }).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::MemoryLimit);
    assert!(outcome.usage.peak_memory_bytes <= memory);

    let outcome = run(&sandbox, "stack-overflow", b"", limits()).await;
    assert_eq!(failure_kind(&outcome), ErrorKind::Trap);
    assert_hello_still_runs(&sandbox).await;
}

/// The same component with a custom section appended: a new digest.
fn with_custom_section(bytes: &[u8], salt: u8) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out.extend_from_slice(&[0, 6, 4, b's', b'a', b'l', b't', salt]);
    out
}

#[derive(Clone, Copy)]
enum Damage {
    Truncate,
    FlipByte,
    Empty,
}

impl Damage {
    fn apply(&self, path: &std::path::Path) {
        let mut bytes = std::fs::read(path).unwrap();
        match self {
            Damage::Truncate => bytes.truncate(bytes.len() / 2),
            Damage::FlipByte => {
                let i = bytes.len() / 3;
                bytes[i] ^= 0xff;
            }
            Damage::Empty => bytes.clear(),
        }
        std::fs::write(path, bytes).unwrap();
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[tokio::test]
async fn fail_reports_each_expected_error_through_the_result() {
    let sandbox = support::sandbox();
    let cases = [
        ("failed", ErrorKind::GuestError, false),
        ("retryable", ErrorKind::GuestError, true),
        ("invalid-input", ErrorKind::InvalidInput, false),
    ];
    for (kind, expected, retryable) in cases {
        let input = format!(r#"{{"kind": "{kind}", "message": "m-{kind}"}}"#);
        let outcome = run(&sandbox, "fail", input.as_bytes(), limits()).await;
        let failure = outcome.result.unwrap_err();
        assert_eq!((failure.kind, failure.retryable), (expected, retryable), "{kind}");
        assert!(failure.message.ends_with(&format!("m-{kind}")), "{}", failure.message);
        assert!(failure.backtrace.is_none(), "an expected error is not a trap");
    }
}

#[tokio::test]
async fn cpu_gives_the_same_checksum_every_time() {
    let sandbox = support::sandbox();
    let first = output_json(&run(&sandbox, "cpu", br#"{"rounds": 3}"#, limits()).await);
    let second = output_json(&run(&sandbox, "cpu", br#"{"rounds": 3}"#, limits()).await);
    assert_eq!(first["rounds"], 3);
    assert_eq!(first["checksum"], second["checksum"]);
    let other = output_json(&run(&sandbox, "cpu", br#"{"rounds": 4}"#, limits()).await);
    assert_ne!(first["checksum"], other["checksum"]);
}

#[tokio::test]
async fn a_guest_that_finishes_after_a_stop_request_keeps_its_output() {
    let sandbox = support::sandbox();
    let plugin = load(&sandbox, "sleep");
    let stop = StopHandle::new();
    // Asked to stop before it even starts; it never looks, and returns.
    stop.request();
    let outcome = sandbox.run(&plugin, request(br#"{"ms": 20}"#, limits()), &stop, Arc::new(NoObserver)).await;
    assert_eq!(output_json(&outcome)["slept_ms"], 20, "finished work is not thrown away");
}

/// `leash-sdk` builds against `plugin-http`, yet a component imports only
/// what its code calls: `hello` never sends a request and imports no
/// wasi:http; `fetch`, which does, imports the outgoing handler.
#[test]
fn a_rust_plugin_imports_wasi_http_only_when_it_sends_requests() {
    let imports_http = |name: &str| {
        let bytes = leash_tests::plugin_bytes(name);
        bytes.windows(26).any(|w| w == b"wasi:http/outgoing-handler")
    };
    assert!(!imports_http("hello"), "hello imports wasi:http");
    assert!(imports_http("fetch"), "fetch does not import wasi:http: the check reads nothing");
}
