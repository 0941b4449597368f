//! Runs both phases of the built component through `leash run` (the
//! `leash` on PATH, or the binary $LEASH names) against a record store on
//! 127.0.0.1: execute proposes, apply sends exactly what was proposed.
//! Build it first: see README.md.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

mod built;

/// A record store on 127.0.0.1 holding `a=1` and `c=3`: `GET /records`
/// lists it; every other request is logged (`PUT /records/b 2`) and
/// answered 204. Its grant rule, its URL and its log.
fn store() -> (String, String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let writes = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            let (mut line, mut length) = (String::new(), 0);
            while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let mut parts = request_line.split_whitespace();
            let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
            let (status, answer) = if method == "GET" {
                ("200 OK", r#"{"a":"1","c":"3"}"#)
            } else {
                writes.lock().unwrap().push(format!("{method} {path} {}", String::from_utf8_lossy(&body)).trim().to_owned());
                ("204 No Content", "")
            };
            let response = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}", answer.len());
            let _ = reader.get_mut().write_all(response.as_bytes());
        }
    });
    (format!("GET,PUT,DELETE http://{addr}"), format!("http://{addr}/records"), log)
}

fn input(url: &str) -> String {
    serde_json::json!({ "store": url, "desired": { "a": "1", "b": "2" } }).to_string()
}

#[test]
fn execute_proposes_the_writes_and_sends_none() {
    let (rule, url, log) = store();
    let report = built::run(&["--plan", "--phase", "execute", "--allow-host", &rule], &input(&url));
    assert_eq!(report["status"], "succeeded", "{report}");
    let proposed: Vec<String> = report["proposals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("{} {}", p["method"].as_str().unwrap(), p["url"].as_str().unwrap()))
        .collect();
    assert_eq!(proposed, [format!("PUT {url}/b"), format!("DELETE {url}/c")]);
    assert!(log.lock().unwrap().is_empty(), "execute wrote nothing");
}

#[test]
fn apply_sends_exactly_the_approved_writes() {
    let (rule, url, log) = store();
    let report = built::run(&["--plan", "--phase", "execute", "--allow-host", &rule], &input(&url));
    let approved = std::env::temp_dir().join(format!("{{name}}-approved-{}.json", std::process::id()));
    std::fs::write(&approved, report.to_string()).unwrap();
    let flags = ["--phase", "apply", "--approved", approved.to_str().unwrap(), "--allow-host", &rule];
    let report = built::run(&flags, "");
    let _ = std::fs::remove_file(&approved);
    assert_eq!(report["status"], "succeeded", "{report}");
    assert_eq!(*log.lock().unwrap(), ["PUT /records/b 2", "DELETE /records/c"]);
}
