//! Runs the built component through `leash run` (the `leash` on PATH, or
//! the binary $LEASH names) against an upstream on 127.0.0.1. Build it
//! first: see README.md.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

mod built;

/// An upstream on 127.0.0.1: `/todo` answers JSON, `/down` 503. Its
/// `GET http://127.0.0.1:PORT` grant rule.
fn upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let rule = format!("GET http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            let mut line = String::new();
            while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                line.clear();
            }
            let (status, body) = if request_line.contains(" /todo ") {
                ("200 OK", r#"{"id":1,"title":"write a plugin"}"#)
            } else {
                ("503 Service Unavailable", r#"{"error":"down"}"#)
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = reader.get_mut().write_all(response.as_bytes());
        }
    });
    rule
}

fn run(grant: Option<&str>, input: &str) -> serde_json::Value {
    match grant {
        Some(rule) => built::run(&["--allow-host", rule], input),
        None => built::run(&[], input),
    }
}

#[test]
fn fetches_json_from_a_granted_upstream() {
    let rule = upstream();
    let url = format!("{}/todo", rule.replace("GET ", ""));
    let report = run(Some(&rule), &serde_json::json!({ "url": url }).to_string());
    assert_eq!(report["status"], "succeeded", "{report}");
    let output: serde_json::Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["data"]["title"], "write a plugin");
}

#[test]
fn a_5xx_is_retryable() {
    let rule = upstream();
    let url = format!("{}/down", rule.replace("GET ", ""));
    let report = run(Some(&rule), &serde_json::json!({ "url": url }).to_string());
    assert_eq!(report["retryable"], true, "{report}");
    assert!(report["message"].as_str().unwrap().contains("503"), "{report}");
}

#[test]
fn an_ungranted_host_is_refused() {
    let rule = upstream();
    let url = format!("{}/todo", rule.replace("GET ", ""));
    let report = run(None, &serde_json::json!({ "url": url }).to_string());
    assert_eq!(report["status"], "failed", "{report}");
    assert!(report["message"].as_str().unwrap().contains("HTTP-request-denied"), "{report}");
}
