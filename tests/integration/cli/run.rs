//! `leash run` as a user runs it: the real binary, real plugins, exit codes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use leash_tests::plugin_path;

fn leash() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leash"));
    cmd.env("LEASH_CACHE_DIR", crate::support::cache_dir());
    cmd
}

fn run(args: &[&str]) -> Output {
    leash().arg("run").args(args).output().expect("leash runs")
}

fn path(name: &str) -> String {
    plugin_path(name).display().to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn run_hello_prints_its_output_and_exits_0() {
    let output = run(&[&path("hello")]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["greeting"], "Hello, world!");
    assert!(stderr(&output).contains("[info] greeting world"), "guest logs go to stderr");
}

#[test]
fn run_reads_input_from_a_file_and_runs_an_action() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    std::fs::write(&input, r#"{"name":"Grace"}"#).unwrap();
    let output = run(&[&path("hello"), "--input", input.to_str().unwrap(), "--action", "wave"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["greeting"], "Hello, Grace!");
    assert_eq!(value["target"], "action:wave");
}

#[test]
fn run_json_reports_the_outcome_as_one_object() {
    let output = run(&[&path("spin"), "--timeout", "200ms", "--json"]);
    assert_eq!(output.status.code(), Some(3));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("stdout is one JSON object");
    assert_eq!(report["status"], "failed");
    assert_eq!(report["error_kind"], "timeout");
    for field in ["message", "fuel_used", "peak_memory_bytes", "duration_ms"] {
        assert!(!report[field].is_null(), "{field} missing from {report}");
    }
}

#[test]
fn run_json_carries_binary_output_as_base64() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    std::fs::write(&input, [0xff, 0x00, 0xfe]).unwrap();
    let output = run(&[&path("echo"), "--input", input.to_str().unwrap(), "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["output_base64"], "/wD+");
}

#[test]
fn each_kind_of_ending_has_its_exit_code() {
    let cases: &[(&[&str], i32)] = &[
        (&[&path("hello"), "--json"], 0),
        (&[&path("coop"), "--input", &path("hello")], 2),
        (&[&path("spin"), "--timeout", "200ms"], 3),
        (&[&path("spin"), "--fuel", "1000000"], 5),
        (&[&path("alloc-bomb"), "--memory", "16MiB"], 5),
        (&[&path("big-output"), "--output-limit", "1KiB"], 5),
        (&[&path("panic")], 6),
        (&[&path("stack-overflow")], 6),
    ];
    for (args, code) in cases {
        let output = run(args);
        assert_eq!(output.status.code(), Some(*code), "leash run {args:?}: {}", stderr(&output));
    }
}

#[test]
fn a_guest_error_exits_1_and_rejected_input_exits_2() {
    let output = run(&[&path("fail")]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("guest_error"));

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.json");
    std::fs::write(&input, r#"{"name":"  "}"#).unwrap();
    let output = run(&[&path("hello"), "--input", input.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("invalid_input"));
}

fn assert_one_line_error(output: &Output, needle: &str) {
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(output);
    assert_eq!(err.trim_end().lines().count(), 1, "one line, no backtrace: {err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

#[test]
fn a_file_that_is_not_a_component_gets_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("plugin.wasm");
    std::fs::write(&text, "hello, I am text").unwrap();
    assert_one_line_error(&run(&[text.to_str().unwrap()]), "not a WebAssembly file");

    let module = dir.path().join("module.wasm");
    std::fs::write(&module, wat::parse_str("(module)").unwrap()).unwrap();
    assert_one_line_error(&run(&[module.to_str().unwrap()]), "core WebAssembly module");

    let wrong_world = dir.path().join("empty.wasm");
    std::fs::write(&wrong_world, wat::parse_str("(component)").unwrap()).unwrap();
    assert_one_line_error(&run(&[wrong_world.to_str().unwrap()]), "does not implement leash:plugin@0.1.x");

    assert_one_line_error(&run(&["/nonexistent/plugin.wasm"]), "cannot read");
}

#[test]
fn bad_flags_are_usage_errors() {
    assert_eq!(run(&[&path("hello"), "--timeout", "soon"]).status.code(), Some(2));
    assert_eq!(run(&[&path("hello"), "--memory", "2GiB"]).status.code(), Some(2));
    assert_eq!(run(&[&path("hello"), "--action", "Bad Name"]).status.code(), Some(2));
    assert_eq!(run(&[&path("hello"), "--phase", "plan"]).status.code(), Some(2));
}

/// Start `leash run` and wait until it says the plugin is running.
fn start(args: &[&str]) -> (std::process::Child, BufReader<std::process::ChildStderr>) {
    let mut child = leash().arg("run").args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    wait_for_line(&mut err, "leash: running");
    (child, err)
}

fn wait_for_line(err: &mut impl BufRead, needle: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "leash exited before printing {needle:?}");
        if line.contains(needle) {
            return;
        }
    }
}

fn interrupt(child: &std::process::Child) {
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

#[test]
fn ctrl_c_cancels_a_cooperative_plugin() {
    let (mut child, _err) = start(&[&path("coop"), "--cancel-grace", "1h"]);
    interrupt(&child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(4), "cancelled, cooperatively (the grace is an hour)");
}

#[test]
fn a_second_ctrl_c_stops_a_plugin_that_ignores_the_first() {
    let (mut child, mut err) = start(&[&path("sleep"), "--cancel-grace", "1h"]);
    interrupt(&child);
    wait_for_line(&mut err, "press Ctrl-C again");
    interrupt(&child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(4));
}

#[test]
fn help_documents_the_exit_codes() {
    let output = leash().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0));
    for code in ["0 ", "1 ", "2 ", "3 ", "4 ", "5 ", "6 ", "7 ", "8 ", "70 "] {
        let line = help.lines().find(|l| l.starts_with(&format!("  {code}"))).unwrap_or_default();
        assert!(line.len() > code.len() + 4, "exit code {code} has a meaning in --help: {help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sends_http_only_to_hosts_allowed_on_the_command_line() {
    let upstream = crate::support::Upstream::start().await;
    let input = serde_json::json!({ "url": upstream.url("/hello") }).to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.json");
    std::fs::write(&file, input).unwrap();
    let plugin = path("http-get");
    let args = |extra: &[&str]| {
        let mut args = vec![plugin.as_str(), "--input", file.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run_async =
        |args: Vec<String>| tokio::task::spawn_blocking(move || leash().arg("run").args(args).output().unwrap());

    let denied = run_async(args(&[])).await.unwrap();
    assert_eq!(denied.status.code(), Some(1), "{}", stderr(&denied));
    let report: serde_json::Value = serde_json::from_slice(&denied.stdout).unwrap();
    assert!(report["message"].as_str().unwrap().contains("HttpRequestDenied"), "{report}");
    assert_eq!((report["http_requests"].as_u64(), report["http_denied"].as_u64()), (Some(0), Some(1)));
    assert!(upstream.received().is_empty());

    let rule = format!("GET {}", upstream.url(""));
    let allowed = run_async(args(&["--allow-host", &rule])).await.unwrap();
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    let report: serde_json::Value = serde_json::from_slice(&allowed.stdout).unwrap();
    let output: serde_json::Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["body_start"], "hello");
    assert_eq!(upstream.received(), vec!["GET /hello".to_owned()]);

    let bad = run(&[&plugin, "--allow-host", "api.example.com"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("expected [METHODS ]SCHEME://HOST[:PORT]"), "{}", stderr(&bad));
}

#[test]
fn run_gives_a_declaring_component_only_what_it_declares_and_is_granted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.json");
    std::fs::write(&file, r#"{"keys": ["greeting", "password"]}"#).unwrap();
    let output = run(&[
        &path("config-declared"),
        "--input",
        file.to_str().unwrap(),
        "--config-var",
        "greeting=hi",
        "--config-var",
        "password=hunter2",
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let got: serde_json::Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    assert_eq!(got["all"], serde_json::json!({ "greeting": "hi" }), "password is granted but not declared");
}

// Multi-threaded: `leash run` blocks this thread while the upstream, on
// this runtime, answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_a_plan_proposes_in_execute_and_sends_only_the_approved_in_apply() {
    use base64::Engine as _;
    let upstream = crate::support::Upstream::start().await;
    let addr = upstream.addr;
    let grant = format!("GET,PUT http://{addr}");
    let dir = tempfile::tempdir().unwrap();
    let plan_input = serde_json::json!({ "writes": [{ "method": "PUT", "url": format!("http://{addr}/hello"), "body": "1" }],
                                         "apply": "tamper" });
    let input = dir.path().join("in.json");
    std::fs::write(&input, plan_input.to_string()).unwrap();
    let input = input.to_str().unwrap();
    let flags = ["--allow-host", &grant, "--input", input, "--json"];

    // Not run as a plan: there is no plan to propose to.
    let plain = run(&[&[path("plan-probe").as_str()][..], &flags].concat());
    let report: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert_eq!(report["status"], "failed", "{report}");
    assert!(report["message"].as_str().unwrap().contains("proposed only in a plan's execute phase"), "{report}");

    // As a plan's execute phase: proposed, not sent.
    let executed = run(&[&[path("plan-probe").as_str(), "--plan"][..], &flags].concat());
    assert_eq!(executed.status.code(), Some(0), "{}", stderr(&executed));
    let report: serde_json::Value = serde_json::from_slice(&executed.stdout).unwrap();
    let proposals = report["proposals"].as_array().unwrap();
    assert_eq!(proposals.len(), 1, "{report}");
    assert_eq!((proposals[0]["method"].as_str(), proposals[0]["body_text"].as_str()), (Some("PUT"), Some("1")));
    assert!(upstream.received().is_empty(), "execute sent nothing");
    let approved = dir.path().join("approved.json");
    std::fs::write(&approved, &executed.stdout).unwrap();

    // As its apply phase, fenced to what execute proposed: the altered
    // request is refused, the approved one sent once.
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let apply_input = serde_json::json!({ "leash_apply": 1, "plan_id": "p", "execute_job_id": "e",
        "input_base64": b64(plan_input.to_string().as_bytes()), "execute_output_base64": "" });
    std::fs::write(dir.path().join("apply.json"), apply_input.to_string()).unwrap();
    let apply_path = dir.path().join("apply.json");
    let applied = run(&[
        &path("plan-probe"),
        "--phase",
        "apply",
        "--approved",
        approved.to_str().unwrap(),
        "--allow-host",
        &grant,
        "--input",
        apply_path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(applied.status.code(), Some(0), "{}", stderr(&applied));
    let report: serde_json::Value = serde_json::from_slice(&applied.stdout).unwrap();
    let output: serde_json::Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    assert_eq!(output, serde_json::json!({ "tampered": ["HTTP-request-denied"], "applied": 1 }));
    assert_eq!(upstream.received(), ["PUT /hello"], "the approved write, once");
    assert!(stderr(&applied).contains("apply sent 1 of 1 approved proposals; 1 request(s) refused as not proposed"));
}
