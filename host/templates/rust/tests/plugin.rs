//! Runs the built component through `leash run` (the `leash` on PATH, or
//! the binary $LEASH names). Build it first: see README.md.

use std::io::Write;
use std::process::{Command, Stdio};

fn run(input: &str) -> serde_json::Value {
    let wasm = concat!(env!("CARGO_MANIFEST_DIR"), "/{{name}}.wasm");
    assert!(std::path::Path::new(wasm).is_file(), "{wasm} is not built yet: see README.md");
    let leash = std::env::var("LEASH").unwrap_or_else(|_| "leash".into());
    let mut child = Command::new(&leash)
        .args(["run", "--json", "--input", "-", wasm])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {leash}: {e} (set LEASH to the leash binary)"));
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("leash run printed no report ({e}): {}", String::from_utf8_lossy(&output.stderr)))
}

#[test]
fn greets_the_name_it_is_given_and_logs_it() {
    let report = run(r#"{"name": "Ada"}"#);
    assert_eq!(report["status"], "succeeded", "{report}");
    let output: serde_json::Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["greeting"], "Hello, Ada!");
    assert!(report["logs"].as_array().unwrap().iter().any(|r| r["message"].as_str().unwrap().contains("Ada")));
}

#[test]
fn a_blank_name_is_invalid_input() {
    let report = run(r#"{"name": " "}"#);
    assert_eq!(report["error_kind"], "invalid_input", "{report}");
}
