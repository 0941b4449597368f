//! Hostile guests: each class of attack on the host, by the `hostile`
//! plugin or by a hand-written component, ends as the guest's fault with
//! a bounded message, and the host's own memory stays bounded.

use std::sync::Arc;
use std::time::Duration;

use leash::job::ErrorKind;
use leash::sandbox::{
    Compiler, ComponentLimits, MAX_ERROR_MESSAGE_BYTES, MAX_LOG_FIELDS, MAX_LOG_MESSAGE_BYTES, NoObserver, Outcome,
    RunLimits, Sandbox, SandboxConfig, SandboxError, StopHandle,
};

use crate::support::{self, assert_hello_still_runs, limits, request, run};

/// A message a person can read: one line, not a megabyte.
const MESSAGE_BOUND: usize = MAX_ERROR_MESSAGE_BYTES + 256;

async fn attack(sandbox: &Sandbox, attack: &str, n: u64, limits: RunLimits) -> Outcome {
    let input = serde_json::json!({ "attack": attack, "n": n }).to_string();
    run(sandbox, "hostile", input.as_bytes(), limits).await
}

/// The failure, checked to be of `kind`, with a bounded message containing
/// `needle`.
fn assert_failure(outcome: &Outcome, kind: ErrorKind, needle: &str) {
    let failure = outcome.result.as_ref().expect_err("the attack must fail");
    assert_eq!(failure.kind, kind, "{}", failure.message);
    assert!(failure.message.contains(needle), "{needle:?} not in {:?}", failure.message);
    assert!(failure.message.len() <= MESSAGE_BOUND, "message of {} bytes", failure.message.len());
    assert!(!failure.message.contains('\n'), "one line: {:?}", failure.message);
}

#[tokio::test]
async fn empty_log_fields_are_charged_and_capped_until_the_timeout() {
    let sandbox = support::sandbox();
    let timeout = Duration::from_millis(1500);
    let outcome = attack(&sandbox, "log-empty-fields", 2_000, RunLimits { timeout, ..limits() }).await;
    assert_failure(&outcome, ErrorKind::Timeout, "timeout");
    // Each record keeps its first fields; all kept records fit the byte cap.
    assert!(!outcome.logs.is_empty());
    assert!(outcome.logs.iter().all(|r| r.fields.len() == MAX_LOG_FIELDS));
    assert!(outcome.logs_dropped > 0);
    let field_cost = std::mem::size_of::<(String, String)>();
    let kept: usize = outcome.logs.iter().map(|r| r.fields.capacity() * field_cost).sum();
    assert!(kept <= RunLimits::default().log_bytes, "kept {kept} bytes of fields");
    assert!(outcome.usage.duration < timeout + Duration::from_secs(1), "overran: {:?}", outcome.usage.duration);
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn one_log_call_too_large_to_copy_ends_the_job() {
    let sandbox = support::sandbox();
    let outcome = attack(&sandbox, "log-empty-fields", 200_000, limits()).await;
    assert_failure(&outcome, ErrorKind::OutputLimit, "in one call");
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn abi_abuse_in_host_calls_is_the_guests_fault() {
    let sandbox = support::sandbox();
    for (name, needle) in [
        ("log-bad-utf8", "not valid UTF-8"),
        ("log-bad-level", "invalid variant, enum or option value"),
        ("log-out-of-bounds", "outside its memory"),
        ("log-misaligned", "misaligned pointer"),
    ] {
        let outcome = attack(&sandbox, name, 0, limits()).await;
        assert_failure(&outcome, ErrorKind::Trap, needle);
        let message = &outcome.result.as_ref().unwrap_err().message;
        assert!(!message.contains("backtrace"), "{name}: no backtrace header: {message:?}");
    }
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn wasi_misuse_is_the_guests_fault() {
    let sandbox = support::sandbox();
    for (name, n, kind, needle) in [
        ("exit", 0, ErrorKind::Trap, "called exit("),
        ("poll-empty", 0, ErrorKind::Trap, "empty list of pollables"),
        ("random-huge", 64 << 20, ErrorKind::Trap, "more random bytes"),
        ("stream-overwrite", 1 << 20, ErrorKind::Trap, "more than a stream permits"),
        ("handles", 0, ErrorKind::ResourceLimit, "resource handles"),
    ] {
        let outcome = attack(&sandbox, name, n, limits()).await;
        assert_failure(&outcome, kind, needle);
    }
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn a_handled_refusal_does_not_hide_a_later_panic() {
    let sandbox = support::sandbox();
    let outcome = attack(&sandbox, "oom-then-panic", 1 << 30, limits()).await;
    assert_failure(&outcome, ErrorKind::Trap, "an unrelated bug (the reservation was refused: true)");
    assert!(outcome.result.unwrap_err().message.contains("earlier, a memory growth to"));
}

#[tokio::test]
async fn a_huge_error_message_is_cut_and_marked() {
    let sandbox = support::sandbox();
    let outcome = attack(&sandbox, "huge-error", 1 << 20, limits()).await;
    assert_failure(&outcome, ErrorKind::GuestError, "Failed: EEEE");
    assert!(outcome.result.unwrap_err().message.ends_with('…'));
    // Past what wasmtime may copy out at all, the copy is refused.
    let outcome = attack(&sandbox, "huge-error", 8 << 20, RunLimits { memory_bytes: 256 << 20, ..limits() }).await;
    assert_failure(&outcome, ErrorKind::OutputLimit, "in one call");
}

#[tokio::test]
async fn a_huge_progress_note_is_cut() {
    let sandbox = support::sandbox();
    let outcome = attack(&sandbox, "huge-progress-note", 1 << 20, limits()).await;
    let note = &outcome.last_progress.expect("a progress report").note;
    assert!(note.len() <= MAX_LOG_MESSAGE_BYTES && note.ends_with('…'), "{} bytes", note.len());
}

// ---- hand-written components: what no guest toolchain would emit ----

/// The types of `run`, exported by name as the component model requires of
/// types an exported function uses.
const TYPES: &str = r#"(type $target0 (variant (case "execute") (case "apply") (case "action" string)))
  (export $target "target" (type $target0))
  (type $ctx0 (record (field "job-id" string) (field "target" $target) (field "attempt" u32)
                      (field "deadline-unix-ms" u64)))
  (export $ctx "job-context" (type $ctx0))
  (type $err0 (variant (case "failed" string) (case "invalid-input" string) (case "retryable" string)))
  (export $err "job-error" (type $err0))"#;

/// A component exporting `run` from the given core module body, which must
/// define `memory`, `cabi_realloc` and `run`; `prelude` is component-level
/// text placed first (imports, other modules and instances).
fn component(prelude: &str, core: &str) -> Vec<u8> {
    let text = format!(
        r#"(component
  {prelude}
  (core module $m {core})
  (core instance $i (instantiate $m))
  {TYPES}
  (type $run (func (param "ctx" $ctx) (param "input" (list u8)) (result (result (list u8) (error $err)))))
  (func $run (type $run) (canon lift (core func $i "run") (memory (core memory $i "memory")) (realloc (core func $i "cabi_realloc"))))
  (export "run" (func $run))
)"#
    );
    wat::parse_str(text).expect("valid component text")
}

/// A core module whose `run` returns `area` after writing `disc` there.
fn returning(disc: u8, area: u32, realloc: u32) -> String {
    format!(
        r#"(memory (export "memory") 1)
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const {realloc})
  (func (export "run") (param i32 i32 i32 i32 i32 i32 i64 i32 i32) (result i32)
    i32.const 16 i32.const {disc} i32.store8
    i32.const 20 i32.const 0 i32.store
    i32.const 24 i32.const 0 i32.store
    i32.const {area})"#
    )
}

async fn run_component(sandbox: &Sandbox, bytes: &[u8], input: &[u8]) -> Outcome {
    let plugin = sandbox.load(bytes).unwrap_or_else(|e| panic!("loads: {e}"));
    sandbox.run(&plugin, request(input, limits()), &StopHandle::new(), Arc::new(NoObserver)).await
}

#[tokio::test]
async fn a_well_formed_hand_written_component_runs() {
    let sandbox = support::sandbox();
    let outcome = run_component(&sandbox, &component("", &returning(0, 16, 1024)), b"in").await;
    assert_eq!(outcome.result.unwrap(), b"");
}

#[tokio::test]
async fn abi_abuse_in_the_result_is_the_guests_fault() {
    let sandbox = support::sandbox();
    for (what, core, needle) in [
        ("bad discriminant", returning(7, 16, 1024), "invalid variant, enum or option value"),
        ("misaligned result", returning(0, 17, 1024), "misaligned pointer"),
        ("result out of bounds", returning(0, 0xffff_fff0, 1024), "outside its memory"),
        ("bogus allocator", returning(0, 16, 0xffff_fff0), "allocator (cabi_realloc)"),
    ] {
        let outcome = run_component(&sandbox, &component("", &core), b"some input").await;
        let failure = outcome.result.as_ref().expect_err(what);
        assert_eq!(failure.kind, ErrorKind::Trap, "{what}: {}", failure.message);
        assert!(failure.message.contains(needle), "{what}: {:?}", failure.message);
    }
}

/// `n` core instances of an empty module, plus `memories` memories (one
/// module each: multi-memory is off), around a working `run`.
fn instances(n: usize, memories: usize) -> Vec<u8> {
    let instances: String = (0..n).map(|_| "(core instance (instantiate $e))").collect();
    let extra: String = (0..memories)
        .map(|i| format!("(core module $mem{i} (memory 1)) (core instance (instantiate $mem{i}))"))
        .collect();
    let prelude = format!("(core module $e) {instances} {extra}");
    component(&prelude, &returning(0, 16, 1024))
}

#[tokio::test]
async fn components_with_several_instances_and_memories_run() {
    // Eleven core instances and four memories in four modules: what real
    // toolchains emit.
    let sandbox = Sandbox::new(SandboxConfig {
        allocator: leash::sandbox::Allocator::Pooling { slots: 1 },
        ..SandboxConfig::default()
    })
    .unwrap();
    let outcome = run_component(&sandbox, &instances(7, 3), b"").await;
    assert_eq!(outcome.result.unwrap(), b"");
}

#[tokio::test]
async fn a_run_finds_nothing_an_earlier_run_in_its_slot_left() {
    // One slot, so every run reuses it; with pages kept resident (reset in
    // place) and with every page given back. Between runs of `hostile` the
    // slot also holds another module (`echo`), whose image replaces it.
    for keep_resident_bytes in [leash::sandbox::DEFAULT_KEEP_RESIDENT_BYTES, 0] {
        let sandbox = Sandbox::new(SandboxConfig {
            allocator: leash::sandbox::Allocator::Pooling { slots: 1 },
            keep_resident_bytes,
            ..support::sandbox_config()
        })
        .unwrap();
        for round in 0..4 {
            let outcome = attack(&sandbox, "residue", 0, limits()).await;
            let seen = String::from_utf8(outcome.result.expect("residue succeeds")).unwrap();
            assert_eq!(
                seen, r#"{"data":"pristine","grown_nonzero":0}"#,
                "run {round}, keeping {keep_resident_bytes} bytes resident"
            );
            if round == 2 {
                assert_eq!(run(&sandbox, "echo", b"between", limits()).await.result.unwrap(), b"between");
            }
        }
    }
}

#[test]
fn an_instance_bomb_is_refused_at_load_with_the_count() {
    let sandbox = support::sandbox();
    let err = sandbox.load(&instances(900, 0)).unwrap_err();
    assert!(matches!(err, SandboxError::CompileLimit(_)), "{err}");
    assert!(err.to_string().contains("901 core instances; leash accepts at most 200"), "{err}");
    let err = sandbox.load(&instances(0, 9)).unwrap_err();
    assert!(err.to_string().contains("memories; leash accepts at most 8"), "{err}");
}

#[tokio::test]
async fn instances_created_by_nested_instantiation_past_the_cap_are_refused() {
    // One nested component of 150 core instances, instantiated twice: the
    // file declares 151 core instances (under the cap of 200), running it
    // creates 301.
    let nested: String = (0..150).map(|_| "(core instance (instantiate $e))").collect();
    let prelude =
        format!("(component $c (core module $e) {nested}) (instance (instantiate $c)) (instance (instantiate $c))");
    let bytes = component(&prelude, &returning(0, 16, 1024));
    // The pooling allocator sizes instantiation when compiling: refused at load.
    let err = support::sandbox().load(&bytes).unwrap_err();
    assert!(matches!(err, SandboxError::CompileLimit(_)), "{err}");
    assert!(err.to_string().contains("301 core module instances"), "{err}");
    // Starting on the baseline tier does not let it in either.
    let tiered = SandboxConfig { compiler: Compiler::Tiered, baseline_first_bytes: 0, ..support::sandbox_config() };
    let err = Arc::new(Sandbox::new(tiered).unwrap()).compile(Arc::new(bytes.clone())).await.unwrap_err();
    assert!(matches!(err, SandboxError::CompileLimit(_)), "{err}");
    // Without the pool, the store's limiter stops it while it instantiates.
    let sandbox =
        Sandbox::new(SandboxConfig { allocator: leash::sandbox::Allocator::OnDemand, ..SandboxConfig::default() })
            .unwrap();
    let outcome = run_component(&sandbox, &bytes, b"").await;
    assert_failure(&outcome, ErrorKind::ResourceLimit, "instance count too high");
}

#[test]
fn a_compile_bomb_is_refused_before_compiling() {
    let limits = ComponentLimits::default();
    let funcs = "(func)".repeat(limits.max_functions as usize + 1);
    let bomb = wat::parse_str(format!("(component (core module {funcs}))")).unwrap();
    let sandbox = support::sandbox();
    let started = std::time::Instant::now();
    let err = sandbox.load(&bomb).unwrap_err();
    assert!(matches!(err, SandboxError::CompileLimit(_)), "{err}");
    assert!(err.to_string().contains(&format!("{} functions", limits.max_functions + 1)), "{err}");
    // Counting is a walk over the bytes, not a compile.
    assert!(started.elapsed() < Duration::from_secs(5));

    let small = Sandbox::new(SandboxConfig {
        components: ComponentLimits { max_bytes: 1000, ..limits },
        ..SandboxConfig::default()
    })
    .unwrap();
    let err = small.load(&leash_tests::plugin_bytes("hello")).unwrap_err();
    assert!(err.to_string().contains("leash accepts at most 1000"), "{err}");
}

// ---- WebAssembly proposals: only what the guest toolchains emit ----

/// A working `run` whose module also holds `body`: GC-typed code that
/// wasmtime 48.0.8 aborted the process on (GHSA-rc4p-x33f-vpr2) when its
/// proposal was left at wasmtime's default.
fn gc_typed(body: &str) -> Vec<u8> {
    let types = "(type $super (sub (func))) (type $sub (sub $super (func))) \
                 (type $s (sub (struct))) (type $t (sub $s (struct (field i32))))";
    component("", &format!("{types} {} {body}", returning(0, 16, 1024)))
}

#[tokio::test]
async fn gc_typed_components_are_refused_at_load_naming_the_proposal() {
    let sandbox = support::sandbox();
    for (what, body) in [
        (
            "call_indirect through a non-final supertype",
            "(table 1 funcref) (elem (i32.const 0) func $f) (func $f (type $sub)) \
             (func (export \"go\") (call_indirect (type $super) (i32.const 0)))",
        ),
        ("ref.test", "(func (param anyref) (result i32) (ref.test (ref $t) (local.get 0)))"),
        ("ref.cast", "(func (param anyref) (result anyref) (ref.cast (ref null $s) (local.get 0)))"),
        (
            "br_on_cast",
            "(func (param anyref) (result anyref) (block (result (ref $t)) \
             (br_on_cast 0 anyref (ref $t) (local.get 0)) (return)))",
        ),
    ] {
        let err = sandbox.load(&gc_typed(body)).expect_err(what);
        assert_eq!(err.kind(), "invalid_plugin", "{what}: {err}");
        assert!(matches!(err, SandboxError::UnsupportedProposal(_)), "{what}: {err}");
        assert!(err.to_string().contains("WebAssembly proposal"), "{what}: {err}");
        assert!(err.to_string().contains("gc"), "{what} names the proposal: {err}");
    }
    assert_hello_still_runs(&sandbox).await;
}

#[tokio::test]
async fn each_off_proposal_is_refused_and_each_on_one_loads() {
    let sandbox = support::sandbox();
    let plain = returning(0, 16, 1024);
    for (proposal, body) in [
        ("tail_call", "(func $r (return_call $r))"),
        ("exceptions", "(tag $e) (func (throw $e))"),
        ("multi_memory", "(memory $second 1) (func (drop (i32.load $second (i32.const 0))))"),
        ("memory64", "(memory $wide i64 1) (func (drop (i32.load $wide (i64.const 0))))"),
        ("threads", "(func (drop (i32.atomic.load (i32.const 0))))"),
        ("function_references", "(type $f (func)) (func (param (ref $f)) (call_ref $f (local.get 0)))"),
        ("relaxed_simd", "(func (drop (i32x4.relaxed_trunc_f32x4_s (v128.const i64x2 0 0))))"),
        ("wide_arithmetic", "(func i64.const 0 i64.const 0 i64.const 0 i64.const 0 i64.add128 drop drop)"),
    ] {
        let bytes = component("", &format!("{plain} {body}"));
        let err = sandbox.load(&bytes).expect_err(proposal);
        assert!(matches!(err, SandboxError::UnsupportedProposal(_)), "{proposal}: {err}");
        assert!(err.to_string().contains(proposal), "{proposal} named: {err}");
    }
    for (proposal, body) in [
        ("bulk_memory", "(func (memory.fill (i32.const 0) (i32.const 0) (i32.const 0)))"),
        ("reference_types", "(table 1 funcref) (func (drop (table.size 0)))"),
        ("multi_value", "(func (result i32 i32) (i32.const 1) (i32.const 2))"),
        ("sign_extension", "(func (drop (i32.extend8_s (i32.const 1))))"),
        ("saturating_float_to_int", "(func (drop (i32.trunc_sat_f32_s (f32.const 1))))"),
        ("simd", "(func (drop (i32x4.add (v128.const i64x2 0 0) (v128.const i64x2 0 0))))"),
        ("extended_const", "(global i32 (i32.add (i32.const 1) (i32.const 2)))"),
    ] {
        let bytes = component("", &format!("{plain} {body}"));
        let outcome = run_component(&sandbox, &bytes, b"").await;
        assert_eq!(outcome.result.unwrap(), b"", "{proposal} loads and runs");
    }
}

// ---- the contract's version rule ----

fn importing_host(version: &str) -> Vec<u8> {
    let import =
        format!(r#"(import "leash:plugin/host@{version}" (instance (export "cancelled" (func (result bool)))))"#);
    component(&import, &returning(0, 16, 1024))
}

#[tokio::test]
async fn guests_of_a_semver_compatible_contract_version_load() {
    let sandbox = support::sandbox();
    for version in ["0.1.0", "0.1.9"] {
        let outcome = run_component(&sandbox, &importing_host(version), b"").await;
        assert_eq!(outcome.result.unwrap(), b"", "{version}");
    }
}

#[test]
fn guests_of_an_incompatible_contract_version_are_refused() {
    let sandbox = support::sandbox();
    for version in ["0.2.0", "1.0.0", "0.0.9"] {
        let err = sandbox.load(&importing_host(version)).unwrap_err();
        assert!(matches!(err, SandboxError::WorldMismatch(_)), "{version}: {err}");
        assert!(err.to_string().contains(&format!("leash:plugin/host@{version}")), "{version}: {err}");
    }
}

// ---- the host's own memory, measured on a real `leash run` ----

/// `leash run` of hostile `attack`, with its peak RSS.
fn leash_run_rss(attack: &str, n: u64, extra: &[&str]) -> (std::process::Output, u64) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    std::fs::write(&input, serde_json::json!({ "attack": attack, "n": n }).to_string()).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_leash"));
    command
        .env("LEASH_CACHE_DIR", support::cache_dir())
        .args(["run", "--json", "--input"])
        .arg(&input)
        .arg(leash_tests::plugin_path("hostile"))
        .args(extra);
    support::output_with_peak_rss(&mut command)
}

/// What `leash run` itself may use beyond its guest's memory: a hello run
/// peaks near 40 MiB here (debug build).
const HOST_SHARE_BYTES: u64 = 96 << 20;

#[test]
fn the_host_stays_small_whatever_the_guest_logs() {
    // Compiling is not what is measured: fill the compile cache first.
    let (warm, _) = leash_run_rss("huge-progress-note", 1, &[]);
    assert_eq!(warm.status.code(), Some(1), "{}", String::from_utf8_lossy(&warm.stderr));
    // A guest limited to 64 MiB logging 20,000 empty fields per call as fast
    // as it can for 3 s (before the fix: 3 GiB and a 52 s overrun).
    let (output, rss) = leash_run_rss("log-empty-fields", 20_000, &["--timeout", "3s", "--memory", "64MiB"]);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["error_kind"], "timeout", "{report}");
    assert!(report["duration_ms"].as_f64().unwrap() < 4000.0, "overran its timeout: {report}");
    let bound = (64 << 20) + HOST_SHARE_BYTES;
    eprintln!("peak RSS {rss} bytes (bound {bound})");
    assert!(rss < bound, "peak RSS {rss} bytes, over {bound}");
}

// ---- guest text meets the operator's terminal ----

/// No escape sequence, bell or carriage return reaches the terminal, and no
/// line the guest wrote starts where leash's own lines do.
fn assert_terminal_safe(what: &str, text: &[u8]) {
    let text = String::from_utf8_lossy(text);
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
        "{what}: raw control characters: {text:?}"
    );
    assert!(!text.lines().any(|l| l.starts_with("leash: succeeded in 1.0 ms")), "{what}: a forged line: {text}");
}

/// Like [`assert_terminal_safe`], and the guest's text is there, escaped.
fn assert_escaped_shown(what: &str, text: &[u8]) {
    assert_terminal_safe(what, text);
    let text = String::from_utf8_lossy(text);
    assert!(text.contains("\\u{1b}]0;pwned"), "{what}: the guest's text is shown, escaped: {text}");
}

fn leash_cmd(dir: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_leash"));
    command.env("LEASH_CACHE_DIR", support::cache_dir()).env_remove("LEASH_SERVER").current_dir(dir);
    command
}

#[test]
fn guest_text_is_escaped_wherever_it_meets_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    std::fs::write(&input, r#"{"attack":"terminal"}"#).unwrap();
    let hostile = leash_tests::plugin_path("hostile");

    let run = leash_cmd(dir.path()).arg("run").arg(&hostile).arg("--input").arg(&input).output().unwrap();
    assert_eq!(run.status.code(), Some(1));
    assert_escaped_shown("leash run", &run.stderr);

    let db = dir.path().join("jobs.db");
    let local = |args: &[&str]| leash_cmd(dir.path()).args(args).arg("--db").arg(&db).output().unwrap();
    let submitted = leash_cmd(dir.path())
        .args(["submit", "--work", "--wait", "60s", "--input"])
        .arg(&input)
        .arg(&hostile)
        .arg("--db")
        .arg(&db)
        .output()
        .unwrap();
    assert_eq!(submitted.status.code(), Some(1), "{}", String::from_utf8_lossy(&submitted.stderr));
    assert_escaped_shown("submit --wait", &submitted.stderr);
    let list = local(&["jobs", "list"]);
    let id =
        String::from_utf8_lossy(&list.stdout).lines().nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    assert_terminal_safe("jobs list", &list.stdout);
    for args in [["jobs", "show", &id], ["jobs", "logs", &id]] {
        let output = local(&args);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        assert_escaped_shown(&args.join(" "), &output.stdout);
    }
}

#[test]
fn run_json_says_what_it_refused_and_what_it_cut() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm\x01\0\0\0").unwrap();
    let refused = leash_cmd(dir.path()).args(["run", "--json"]).arg(&bad).output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_slice(&refused.stdout).expect("one JSON object");
    assert_eq!(report["status"], "refused");
    assert_eq!(report["error_kind"], "invalid_plugin");

    let input = dir.path().join("in.json");
    std::fs::write(&input, r#"{"attack":"stdout-flood","n":100000}"#).unwrap();
    let hostile = leash_tests::plugin_path("hostile");
    let output = leash_cmd(dir.path()).args(["run", "--json", "--input"]).arg(&input).arg(&hostile).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["status"], "succeeded", "{report}");
    let kept = report["stdout"].as_str().unwrap().len() as u64;
    assert_eq!(kept, RunLimits::default().capture_bytes as u64);
    assert_eq!(report["stdout_dropped"], 100_000 - kept, "{report}");
    assert_eq!(report["stderr_dropped"], 0);
}

#[test]
fn no_cache_wins_over_a_cache_dir_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let output = leash_cmd(dir.path())
        .env("LEASH_CACHE_DIR", dir.path().join("cache"))
        .args(["run", "--no-cache"])
        .arg(leash_tests::plugin_path("hello"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!dir.path().join("cache").exists(), "nothing was written to the cache");
}

/// Every attack of the `hostile` plugin through a real `leash run`: the
/// kind it must end with, and the process's peak RSS under the same bound.
#[test]
fn every_attack_ends_as_its_kind_with_the_host_small() {
    let (warm, _) = leash_run_rss("huge-progress-note", 1, &[]);
    assert_eq!(warm.status.code(), Some(1), "{}", String::from_utf8_lossy(&warm.stderr));
    let attacks: [(&str, u64, &str); 13] = [
        ("log-empty-fields", 200_000, "output_limit"),
        ("log-bad-utf8", 0, "trap"),
        ("log-bad-level", 0, "trap"),
        ("log-out-of-bounds", 0, "trap"),
        ("log-misaligned", 0, "trap"),
        ("exit", 0, "trap"),
        ("poll-empty", 0, "trap"),
        ("random-huge", 64 << 20, "trap"),
        ("stream-overwrite", 1 << 20, "trap"),
        ("handles", 0, "resource_limit"),
        ("oom-then-panic", 1 << 30, "trap"),
        ("huge-error", 8 << 20, "output_limit"),
        ("huge-progress-note", 8 << 20, "output_limit"),
    ];
    for (attack, n, kind) in attacks {
        let (output, rss) = leash_run_rss(attack, n, &["--timeout", "10s", "--memory", "64MiB"]);
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
        assert_eq!(report["error_kind"], kind, "{attack}: {report}");
        assert!(report["message"].as_str().unwrap().len() <= MESSAGE_BOUND, "{attack}: a bounded message");
        let bound = (64 << 20) + HOST_SHARE_BYTES;
        assert!(rss < bound, "{attack}: peak RSS {rss} bytes, over {bound}");
    }
}
