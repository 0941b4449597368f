//! Python and JavaScript guests (`plugins/python`, `plugins/js`), built
//! from source with the pinned componentize-py and componentize-js (see
//! `leash_tests::polyglot`): through `leash run`, as durable jobs, and
//! against every limit a Rust guest meets. Where a tool is missing each
//! test says it was skipped; CI installs both and makes them mandatory.

use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use leash::job::{ErrorKind, JobStatus, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::{NoObserver, Outcome, Plugin, RunLimits, Sandbox, SandboxConfig, StopHandle, StopMode};
use leash_tests::polyglot::{self, Lang};

use crate::support::{GENEROUS, ProgressTap, cache_dir, limits, output_json, request, sandbox_config};

/// One sandbox for these tests: its one compile at a time, with the shared
/// compile cache, means concurrent tests compile each guest once.
fn shared_sandbox() -> Arc<Sandbox> {
    static SANDBOX: OnceLock<Arc<Sandbox>> = OnceLock::new();
    SANDBOX.get_or_init(|| Arc::new(Sandbox::new(sandbox_config()).expect("sandbox"))).clone()
}

/// The built example, loaded; `None` when the test is skipped.
async fn load(lang: Lang, name: &'static str) -> Option<Plugin> {
    let bytes = tokio::task::spawn_blocking(move || polyglot::guest_bytes(lang, name)).await.unwrap()?;
    let sandbox = shared_sandbox();
    Some(sandbox.compile(Arc::new(bytes)).await.unwrap_or_else(|e| panic!("loading {lang:?} {name}: {e}")))
}

async fn run(plugin: &Plugin, input: &str, limits: RunLimits) -> Outcome {
    shared_sandbox().run(plugin, request(input.as_bytes(), limits), &StopHandle::new(), Arc::new(NoObserver)).await
}

fn kind(outcome: &Outcome) -> Option<ErrorKind> {
    outcome.result.as_ref().err().map(|f| f.kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_greets_logs_and_reports_progress_in_every_language() {
    for lang in Lang::ALL {
        let Some(plugin) = load(lang, "hello").await else { return };
        let (tap, mut progress) = ProgressTap::new();
        let outcome =
            shared_sandbox().run(&plugin, request(br#"{"name":"Ada"}"#, limits()), &StopHandle::new(), tap).await;
        let output = output_json(&outcome);
        assert_eq!(output["greeting"], "Hello, Ada!", "{lang:?}");
        assert_eq!((output["target"].as_str(), output["attempt"].as_u64()), (Some("execute"), Some(1)), "{lang:?}");
        let log = outcome.logs.iter().find(|r| r.message == "greeting Ada").unwrap_or_else(|| panic!("{lang:?}"));
        assert_eq!(log.fields, [("language".to_owned(), lang.name().to_owned())]);
        let reported = progress.recv().await.unwrap();
        assert_eq!((reported.done, reported.total, reported.note.as_str()), (1, 1, "greeted"), "{lang:?}");

        let blank = run(&plugin, r#"{"name":" "}"#, limits()).await;
        assert_eq!(kind(&blank), Some(ErrorKind::InvalidInput), "{lang:?}");
        let not_json = run(&plugin, "{", limits()).await;
        let failure = not_json.result.unwrap_err();
        assert_eq!(failure.kind, ErrorKind::InvalidInput, "{lang:?}");
        assert!(failure.message.contains("not valid JSON"), "{lang:?}: {}", failure.message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_returns_every_byte_unchanged_in_every_language() {
    let input: Vec<u8> = (0..=255u8).chain([0, 0xff, b'\n']).collect();
    for lang in Lang::ALL {
        let Some(plugin) = load(lang, "echo").await else { return };
        let outcome =
            shared_sandbox().run(&plugin, request(&input, limits()), &StopHandle::new(), Arc::new(NoObserver)).await;
        assert_eq!(outcome.result.as_deref().ok(), Some(input.as_slice()), "{lang:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_that_never_ends_is_stopped_by_its_timeout_in_every_language() {
    for lang in Lang::ALL {
        let Some(plugin) = load(lang, "loop").await else { return };
        let outcome = run(&plugin, "{}", RunLimits { timeout: Duration::from_millis(1500), ..limits() }).await;
        assert_eq!(kind(&outcome), Some(ErrorKind::Timeout), "{lang:?}: {:?}", outcome.result);
        assert!(outcome.usage.duration < Duration::from_secs(10), "{lang:?}: {:?}", outcome.usage.duration);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_that_never_ends_runs_out_of_fuel_in_every_language() {
    for lang in Lang::ALL {
        let Some(plugin) = load(lang, "loop").await else { return };
        let outcome = run(&plugin, "{}", RunLimits { fuel: Some(200_000_000), ..limits() }).await;
        assert_eq!(kind(&outcome), Some(ErrorKind::OutOfFuel), "{lang:?}: {:?}", outcome.result);
        assert_eq!(outcome.usage.fuel_used, 200_000_000, "{lang:?}");
        // The same loop with an end finishes within a budget.
        let bounded = run(&plugin, r#"{"iterations": 1000}"#, RunLimits { fuel: Some(200_000_000), ..limits() }).await;
        assert_eq!(output_json(&bounded)["iterations"], 1000, "{lang:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_loop_is_stopped_by_its_memory_limit_in_every_language() {
    for lang in Lang::ALL {
        let Some(plugin) = load(lang, "loop").await else { return };
        let memory_bytes = 48 << 20;
        let outcome = run(&plugin, r#"{"grow_kib": 1024}"#, RunLimits { memory_bytes, ..limits() }).await;
        assert_eq!(kind(&outcome), Some(ErrorKind::MemoryLimit), "{lang:?}: {:?}", outcome.result);
        assert!(outcome.usage.peak_memory_bytes <= memory_bytes, "{lang:?}: {}", outcome.usage.peak_memory_bytes);
        // Below the limit the same growth succeeds.
        let some = run(&plugin, r#"{"grow_kib": 1024, "iterations": 4}"#, RunLimits { memory_bytes, ..limits() }).await;
        assert_eq!(output_json(&some)["iterations"], 4, "{lang:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unexpected_exception_is_a_trap_whose_report_names_it_in_every_language() {
    for lang in Lang::ALL {
        let Some(plugin) = load(lang, "loop").await else { return };
        let outcome = run(&plugin, r#"{"crash": true}"#, limits()).await;
        let failure = outcome.result.as_ref().unwrap_err();
        assert_eq!(failure.kind, ErrorKind::Trap, "{lang:?}: {failure:?}");
        // The runtime's own abort names no exception: the report does.
        let named = match lang {
            Lang::Python => "Python ValueError: a crash the input asked for",
            Lang::Js => "JavaScript uncaught TypeError: a crash the input asked for",
        };
        assert!(failure.message.contains(named), "{lang:?}: {failure:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooperative_loop_stops_when_cancelled_in_every_language() {
    for lang in Lang::ALL {
        let Some(plugin) = load(lang, "loop").await else { return };
        let (tap, mut progress) = ProgressTap::new();
        let stop = StopHandle::new();
        // A grace longer than the test's bound: only the guest's own
        // return can end this run in time.
        let limits = RunLimits { cancel_grace: GENEROUS * 2, ..limits() };
        let sandbox = shared_sandbox();
        let running = tokio::spawn({
            let (plugin, stop) = (plugin.clone(), stop.clone());
            async move { sandbox.run(&plugin, request(br#"{"cooperative": true}"#, limits), &stop, tap).await }
        });
        let first = progress.recv().await.unwrap();
        assert_eq!((first.done, first.note.as_str()), (1000, "looping"), "{lang:?}");
        stop.request();
        let outcome = tokio::time::timeout(GENEROUS, running).await.expect("the guest returned").unwrap();
        let failure = outcome.result.as_ref().unwrap_err();
        assert_eq!((failure.kind, failure.stopped), (ErrorKind::Cancelled, Some(StopMode::Cooperative)), "{lang:?}");
        assert!(outcome.logs.iter().any(|r| r.message.starts_with("stopping cleanly")), "{lang:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_runs_as_a_durable_job_in_every_language_and_its_first_job_says_it_waited() {
    for lang in Lang::ALL {
        let Some(bytes) = tokio::task::spawn_blocking(move || polyglot::guest_bytes(lang, "hello")).await.unwrap()
        else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::builder(dir.path().join("jobs.db"))
            .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
            .poll_interval(Duration::from_millis(50))
            .build()
            .await
            .unwrap();
        let digest = runtime.plugin_add(bytes).await.unwrap();
        let submit = || Submit::new(PluginSource::Digest(digest), Target::Execute, br#"{"name":"Ada"}"#.to_vec());
        let first = runtime.submit(submit()).await.unwrap();
        let done = runtime.wait(first, GENEROUS).await.unwrap();
        assert_eq!(done.status, JobStatus::Succeeded, "{lang:?}: {:?}", done.error_message);
        let output: serde_json::Value = serde_json::from_slice(done.output.as_deref().unwrap()).unwrap();
        assert_eq!(output["greeting"], "Hello, Ada!", "{lang:?}");
        let progress = done.progress.expect("the job's last progress is kept");
        assert_eq!((progress.done, progress.total, progress.note.as_str()), (1, 1, "greeted"), "{lang:?}");
        let logs = runtime.logs(first).await.unwrap();
        assert!(logs.records.iter().any(|r| r.message == "greeting Ada"), "{lang:?}: {:?}", logs.records);
        let wait = &logs.records[0];
        assert!(wait.message.starts_with("leash: this job waited"), "{lang:?}: {wait:?}");
        assert!(wait.fields.iter().any(|(k, v)| k == "leash.compile_ms" && v.parse::<u64>().is_ok()), "{wait:?}");

        // The plugin is ready now: the next job neither waits nor says so.
        let second = runtime.submit(submit()).await.unwrap();
        assert_eq!(runtime.wait(second, GENEROUS).await.unwrap().status, JobStatus::Succeeded);
        let logs = runtime.logs(second).await.unwrap();
        assert!(!logs.records.iter().any(|r| r.message.starts_with("leash:")), "{lang:?}: {:?}", logs.records);
        runtime.shutdown().await;
    }
}

/// `leash run --json` with its cache in `cache`, on `{"name":"Ada"}`.
fn leash_run_json(wasm: &std::path::Path, cache: &std::path::Path) -> serde_json::Value {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_leash"))
        .args(["run", "--json", "--input", "-", "--cache-dir"])
        .arg(cache)
        .arg(wasm)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(br#"{"name":"Ada"}"#).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `plugins add` of an interpreter-sized guest says it is compiling and
/// how long it took, rather than block silently; a small one says
/// nothing of it.
#[test]
fn plugins_add_of_a_big_guest_says_it_is_compiling() {
    let Some(python) = polyglot::guest(Lang::Python, "hello") else { return };
    let dir = tempfile::tempdir().unwrap();
    let add = |wasm: &std::path::Path, name: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_leash"))
            .args(["plugins", "add", "--name", name, "--db"])
            .arg(dir.path().join("local.db"))
            .arg(wasm)
            .env("LEASH_CACHE_DIR", dir.path().join("cache"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let said = add(&python, "pyhello");
    assert!(said.contains("leash: compiling pyhello (") && said.contains(" MB) to machine code"), "{said}");
    assert!(said.contains("leash: compiled and stored in "), "{said}");
    let small = add(&leash_tests::plugin_path("hello"), "hello");
    assert!(!small.contains("compiling"), "{small}");
}

#[test]
fn leash_run_shows_compilation_apart_from_the_run() {
    // Cold, then from the cache: with a cache of its own, Rust's hello.
    let cache = tempfile::tempdir().unwrap();
    let hello = leash_tests::plugin_path("hello");
    let (cold, warm) = (leash_run_json(&hello, cache.path()), leash_run_json(&hello, cache.path()));
    assert_eq!((cold["compile_cached"].as_bool(), warm["compile_cached"].as_bool()), (Some(false), Some(true)));
    assert!(cold["compile_ms"].as_f64().unwrap() > 0.0 && warm["compile_ms"].as_f64().unwrap() > 0.0);
    // The big guests, with the tests' shared cache (whether the first run
    // compiles depends on which test got there first): compiling an
    // interpreter takes longer than running hello in it.
    for lang in Lang::ALL {
        let Some(wasm) = polyglot::guest(lang, "hello") else { return };
        let first = leash_run_json(&wasm, &cache_dir());
        assert_eq!(first["status"], "succeeded", "{lang:?}");
        let greeting: serde_json::Value = serde_json::from_str(first["output"].as_str().unwrap()).unwrap();
        assert_eq!(greeting["greeting"], "Hello, Ada!");
        assert!(first["logs"].as_array().unwrap().iter().any(|r| r["message"] == "greeting Ada"), "{first}");
        let again = leash_run_json(&wasm, &cache_dir());
        assert_eq!(again["compile_cached"], true, "{lang:?}");
        if first["compile_cached"] == false {
            let (compile_ms, run_ms) = (first["compile_ms"].as_f64().unwrap(), first["duration_ms"].as_f64().unwrap());
            assert!(run_ms < compile_ms, "{lang:?}: ran in {run_ms} ms, compiled in {compile_ms} ms");
        }
    }
}

/// An `async` JavaScript handler is awaited: the value it resolves to is
/// the output (not its promise encoded as `{}`), a rejection with an
/// expected error is that error, and output JSON cannot hold fails,
/// saying why, rather than being replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_javascript_handler_is_awaited_and_output_json_cannot_hold_fails() {
    let Some(plugin) = load(Lang::Js, "async").await else { return };
    let outcome = run(&plugin, r#"{"then":"output"}"#, limits()).await;
    let output = output_json(&outcome);
    assert_eq!((output["doubled"].as_u64(), output["attempt"].as_u64()), (Some(10), Some(1)), "{output}");
    assert!(outcome.logs.iter().any(|r| r.message == "awaited"), "{:?}", outcome.logs);

    let retry = run(&plugin, r#"{"then":"retry"}"#, limits()).await.result.unwrap_err();
    let said = (retry.kind, retry.retryable, retry.message.as_str());
    assert_eq!(said, (ErrorKind::GuestError, true, "Retryable: upstream busy after 10 ms"));
    for (then, says) in [("bigint", "BigInt"), ("nothing", "returned undefined")] {
        let failure = run(&plugin, &format!(r#"{{"then":"{then}"}}"#), limits()).await.result.unwrap_err();
        assert_eq!(failure.kind, ErrorKind::GuestError, "{then}: {failure:?}");
        assert!(failure.message.starts_with("Failed: cannot encode output as JSON"), "{then}: {}", failure.message);
        assert!(failure.message.contains(says), "{then}: {}", failure.message);
    }
}

/// The SDKs' HTTP helpers (`leash_sdk::http`, `leash.http` in Python and
/// JavaScript: `plugins/fetch`, `plugins/{python,js}/fetch`) send, answer
/// and fail alike: JSON in and out, a secret in a header, an error status
/// as a response, and no response as the job's error, named by its
/// wasi:http code and retryable when a later try may succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_helpers_send_answer_and_fail_alike_in_every_language() {
    use leash::job::Grants;
    use leash::job::grant::HttpGrant;
    use leash::sandbox::http::SecretStore;
    use serde_json::{Value, json};

    const VALUE: &str = "helper-s3cr3t";
    let secrets = SecretStore::from_pairs([("TOKEN".to_owned(), VALUE.to_owned())]).unwrap();
    let sandbox = Arc::new(Sandbox::new(SandboxConfig { secrets: Arc::new(secrets), ..sandbox_config() }).unwrap());
    let upstream = crate::support::Upstream::start().await;
    let mut guests = vec![("rust", crate::support::load(&sandbox, "fetch"))];
    for lang in Lang::ALL {
        let Some(bytes) = tokio::task::spawn_blocking(move || polyglot::guest_bytes(lang, "fetch")).await.unwrap()
        else {
            return;
        };
        guests.push((lang.name(), sandbox.compile(Arc::new(bytes)).await.unwrap()));
    }
    let grant = |rules: &[String]| HttpGrant {
        hosts: rules.iter().map(|r| r.parse().unwrap()).collect(),
        ..HttpGrant::default()
    };
    let mut granted = grant(&[upstream.url("")]);
    granted.bind_secret("TOKEN".parse().unwrap(), upstream.url("").parse().unwrap());
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let refused = format!("http://{closed}/json");
    let both = grant(&[upstream.url(""), format!("http://{closed}")]);

    let stop = StopHandle::new();
    for (lang, plugin) in &guests {
        let go = |input: Value, http: HttpGrant| {
            let grants = Arc::new(Grants { http, ..Grants::default() });
            let job = leash::sandbox::RunRequest { grants, ..request(input.to_string().as_bytes(), limits()) };
            sandbox.run(plugin, job, &stop, Arc::new(NoObserver))
        };
        let got = output_json(&go(json!({ "url": upstream.url("/json") }), granted.clone()).await);
        let want = json!({ "status": 200, "content_type": "application/json", "text": r#"{"hello":"world"}"# });
        assert_eq!(got, want, "{lang}: get");

        let posted =
            output_json(&go(json!({ "url": upstream.url("/echo"), "json": {"a": [1, "x"]} }), granted.clone()).await);
        assert_eq!(posted["content_type"], "application/json", "{lang}: post_json");
        let echoed: Value = serde_json::from_str(posted["text"].as_str().unwrap()).unwrap();
        assert_eq!(echoed, json!({"a": [1, "x"]}), "{lang}: post_json");

        let headers = json!({ "authorization": "Bearer {secret:TOKEN}" });
        let authed = go(json!({ "url": upstream.url("/echo-auth"), "headers": headers }), granted.clone()).await;
        assert_eq!(output_json(&authed)["text"], "Bearer {secret:TOKEN}", "{lang}: the value never reaches the output");
        let sent = format!("GET /echo-auth authorization=Bearer {VALUE}");
        assert_eq!(upstream.received().last(), Some(&sent), "{lang}: the upstream got the value");

        let missing = output_json(&go(json!({ "url": upstream.url("/nothing-here") }), granted.clone()).await);
        assert_eq!(missing["status"], 404, "{lang}: an error status is a response");

        let url = upstream.url("/json");
        let denied = go(json!({ "url": url }), HttpGrant::default()).await.result.unwrap_err();
        let said = (denied.kind, denied.retryable, denied.message.as_str());
        let why = format!(
            "Failed: GET {url}: HTTP-request-denied (not granted to this job; its logs name the --allow-host rule that \
             grants it)"
        );
        assert_eq!(said, (ErrorKind::GuestError, false, why.as_str()), "{lang}: denied");

        let down = go(json!({ "url": refused }), both.clone()).await.result.unwrap_err();
        let said = (down.retryable, down.message.as_str());
        assert_eq!(said, (true, format!("Retryable: GET {refused}: connection-refused").as_str()), "{lang}: refused");

        let headers = json!({ "connection": "close" });
        let forbidden = go(json!({ "url": url, "headers": headers }), granted.clone()).await.result.unwrap_err();
        let said = (forbidden.retryable, forbidden.message.as_str());
        let why = format!("Failed: GET {url}: forbidden: header connection");
        assert_eq!(said, (false, why.as_str()), "{lang}: a header the host will not send");

        let slow = upstream.url("/slow");
        let waited = go(json!({ "url": slow, "timeout_ms": 300 }), granted.clone()).await.result.unwrap_err();
        let said = (waited.retryable, waited.message.as_str());
        assert_eq!(said, (true, format!("Retryable: GET {slow}: HTTP-response-timeout").as_str()), "{lang}: timeout");
    }
}

/// A JavaScript guest built without outbound HTTP (`-d http`) traps in a
/// stub where it first calls wasi:http; the report says so, and how to
/// build it with HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_guest_built_without_http_says_so_when_it_fetches() {
    let Some(plugin) = load(Lang::Js, "no-http").await else { return };
    let failure = run(&plugin, r#"{"url":"http://127.0.0.1:9/"}"#, limits()).await.result.unwrap_err();
    assert_eq!(failure.kind, ErrorKind::Trap, "{}", failure.message);
    assert!(
        failure.message.contains("an import its build replaced with a trap: it was built without outbound HTTP")
            && failure.message.contains("build with `-d fetch-event` only"),
        "{}",
        failure.message
    );
}
