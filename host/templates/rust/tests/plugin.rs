//! Runs the built component through `leash run` (the `leash` on PATH, or
//! the binary $LEASH names). Build it first: see README.md.

mod built;

fn run(input: &str) -> serde_json::Value {
    built::run(&[], input)
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
