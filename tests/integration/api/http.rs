//! The HTTP API against a real `leash serve` on loopback: every route and
//! every status code it documents.

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use leash::job::JobStatus;

use crate::support::server::{Server, is_terminal};
use crate::support::{GENEROUS, eventually};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn submit(server: &Server, body: Value) -> (u16, Value) {
    server.call(Method::POST, "/v1/jobs", Some(body)).await
}

async fn submit_async(server: &Server, plugin: &str, input: Value) -> String {
    let (status, answer) = submit(server, json!({ "plugin": plugin, "input": input, "execution": "async" })).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["status"], "accepted");
    answer["job_id"].as_str().expect("job id").to_owned()
}

fn error_kind(answer: &Value) -> &str {
    answer["error"]["kind"].as_str().unwrap_or_else(|| panic!("not an error body: {answer}"))
}

#[tokio::test]
async fn every_route_but_the_liveness_probe_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let live = server.http.get(format!("{}/healthz", server.url)).send().await.unwrap();
    assert_eq!(live.status().as_u16(), 200);
    let routes = [
        (Method::GET, "/v1/plugins"),
        (Method::POST, "/v1/plugins"),
        (Method::GET, "/v1/plugins/hello"),
        (Method::PUT, "/v1/plugins/hello@1/grants"),
        (Method::GET, "/v1/jobs"),
        (Method::POST, "/v1/jobs"),
        (Method::GET, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH"),
        (Method::GET, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/logs"),
        (Method::GET, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/effects"),
        (Method::GET, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/output"),
        (Method::POST, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/cancel"),
        (Method::POST, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/approve"),
        (Method::POST, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/reject"),
        (Method::POST, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/run"),
        (Method::PUT, "/v1/plugins/hello@1/approval"),
        (Method::POST, "/v1/plugins/hello/pause"),
        (Method::POST, "/v1/plugins/hello/resume"),
        (Method::GET, "/v1/pauses"),
        (Method::GET, "/v1/health"),
        (Method::GET, "/v1/openapi.json"),
        (Method::GET, "/metrics"),
        // Routes that do not exist, or not with that method: 401 first.
        (Method::GET, "/v1/nowhere"),
        (Method::GET, "/v1"),
        (Method::DELETE, "/v1/jobs"),
        (Method::GET, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/approve"),
    ];
    for (method, path) in routes {
        let url = format!("{}{path}", server.url);
        for token in [None, Some("wrong"), Some(&server.token[..63])] {
            let mut request = server.http.request(method.clone(), &url);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status().as_u16(), 401, "{method} {path} with {token:?}");
            assert_eq!(response.headers()["www-authenticate"], "Bearer");
            let body: Value = response.json().await.unwrap();
            assert_eq!(error_kind(&body), "unauthorized");
        }
    }
    let (status, body) = server.call(Method::GET, "/v1/nowhere", None).await;
    assert_eq!((status, error_kind(&body)), (404, "not_found"));
    let (status, body) = server.call(Method::DELETE, "/v1/jobs", None).await;
    assert_eq!((status, error_kind(&body)), (405, "method_not_allowed"));
    let lower = server
        .http
        .get(format!("{}/v1/health", server.url))
        .header("authorization", format!("bearer {}", server.token));
    assert_eq!(lower.send().await.unwrap().status().as_u16(), 200, "the scheme is case-insensitive");
}

#[tokio::test]
async fn plugins_are_uploaded_validated_listed_and_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let bytes = leash_tests::plugin_bytes("hello");
    let response =
        server.request(Method::POST, "/v1/plugins?name=hello&version=1.0.0").body(bytes.clone()).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let info: Value = response.json().await.unwrap();
    assert_eq!((info["name"].as_str(), info["version"].as_str()), (Some("hello"), Some("1.0.0")));
    assert_eq!(info["size_bytes"], bytes.len());
    assert_eq!(info["digest"], leash::job::Digest::of(&bytes).to_string());

    let (status, list) = server.call(Method::GET, "/v1/plugins", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["plugins"].as_array().unwrap().len(), 1);
    for reference in ["hello", "hello@1.0.0", info["digest"].as_str().unwrap()] {
        let (status, shown) = server.call(Method::GET, &format!("/v1/plugins/{reference}"), None).await;
        assert_eq!((status, &shown["digest"]), (200, &info["digest"]), "{reference}");
    }
    let (status, body) = server.call(Method::GET, "/v1/plugins/hello@9.9.9", None).await;
    assert_eq!((status, error_kind(&body)), (404, "unknown_plugin"));
    let (status, body) = server.call(Method::GET, "/v1/plugins/Bad%20Name", None).await;
    assert_eq!((status, error_kind(&body)), (400, "invalid_request"));

    let refused = [
        (b"plain text".to_vec(), "not a WebAssembly file"),
        (bytes[..bytes.len() / 2].to_vec(), "invalid component"),
        (wat::parse_str("(module)").unwrap(), "core WebAssembly module"),
        (wat::parse_str("(component)").unwrap(), "does not implement leash:plugin"),
        (Vec::new(), "empty"),
    ];
    for (body, says) in refused {
        let response = server.request(Method::POST, "/v1/plugins?name=bad").body(body).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 400, "{says}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(error_kind(&answer), "invalid_plugin", "{answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{answer}");
    }
    let (_, list) = server.call(Method::GET, "/v1/plugins", None).await;
    assert_eq!(list["plugins"].as_array().unwrap().len(), 1, "refused uploads leave nothing behind");
}

#[tokio::test]
async fn grants_are_set_on_a_registration_and_bad_ones_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let bytes = leash_tests::plugin_bytes("hello");
    let response = server.request(Method::POST, "/v1/plugins?name=hello&version=1").body(bytes).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let path = "/v1/plugins/hello@1/grants";
    let grants = json!({ "http": { "hosts": ["GET https://api.example.com"], "private_ranges": ["10.0.0.0/8"],
        "limits": { "requests": 5 } } });
    let (status, info) = server.call(Method::PUT, path, Some(grants)).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["grants"]["http"]["hosts"], json!(["GET https://api.example.com"]));
    assert_eq!(info["grants"]["http"]["limits"]["requests"], 5);
    assert_eq!(info["grants"]["http"]["limits"]["request_timeout_ms"], 60_000, "unset limits take their defaults");
    let (_, shown) = server.call(Method::GET, "/v1/plugins/hello", None).await;
    assert_eq!(shown["grants"], info["grants"]);

    for (body, field, says) in [
        (json!({ "http": { "hosts": ["ftp://x.example"] } }), "`http.hosts[0]`", "not http or https"),
        (json!({ "http": { "private_ranges": ["10.0.0.1/8"] } }), "`http.private_ranges[0]`", "past the prefix"),
        (json!({ "http": { "limits": { "requests": -1 } } }), "`http.limits.requests`", "invalid value"),
        (json!({ "http": { "allow": [] } }), "`http.allow`", "unknown field `allow`"),
        (json!({ "http": { "limits": { "request_timeout_ms": 0 } } }), "", "request_timeout_ms must be at least 1"),
        (json!({ "config": { "": "x" } }), "invalid grant", "config key \"\": use 1 to 128 bytes"),
        (json!({ "config": { "k": 1 } }), "`config.k`", "invalid type"),
        (json!({ "http": { "safe_methods": ["get"] } }), "safe_methods", "not an upper-case method name"),
    ] {
        let (status, answer) = server.call(Method::PUT, path, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field) && message.contains(says), "{body}: {message}");
    }
    let (_, shown) = server.call(Method::GET, "/v1/plugins/hello@1", None).await;
    assert_eq!(shown["grants"], info["grants"], "refused grants change nothing");

    let (status, body) = server.call(Method::PUT, "/v1/plugins/nobody@1/grants", Some(json!({}))).await;
    assert_eq!((status, error_kind(&body)), (404, "unknown_plugin"));
    let (status, body) = server.call(Method::PUT, "/v1/plugins/hello/grants", Some(json!({}))).await;
    assert_eq!((status, error_kind(&body)), (400, "invalid_request"), "{body}");
    let (status, revoked) = server.call(Method::PUT, path, Some(json!({}))).await;
    assert_eq!(status, 200);
    assert!(revoked.get("grants").is_none(), "nothing granted: {revoked}");
}

#[tokio::test]
async fn sync_submits_answer_with_the_output_and_binary_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let echo = server.add_plugin("echo").await;

    let (status, answer) = submit(&server, json!({ "plugin": "hello", "input": { "name": "Ada" } })).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["job"]["status"], "succeeded");
    assert_eq!(answer["output"]["greeting"], "Hello, Ada!");
    assert_eq!(answer["job"]["plugin_name"]["name"], "hello");
    let id = answer["job"]["id"].as_str().unwrap();
    let (status, effects) = server.call(Method::GET, &format!("/v1/jobs/{id}/effects"), None).await;
    assert_eq!((status, effects), (200, json!({ "effects": [] })), "a job that made no effect has an empty ledger");
    let (status, body) = server.call(Method::GET, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/effects", None).await;
    assert_eq!((status, error_kind(&body)), (404, "not_found"));

    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let (status, answer) =
        submit(&server, json!({ "plugin": echo["digest"], "input_base64": b64(&binary), "execution": "sync" })).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["output"], Value::Null, "not JSON");
    assert_eq!(answer["output_base64"].as_str().unwrap(), b64(&binary));
    let id = answer["job"]["id"].as_str().unwrap();
    let raw = server.request(Method::GET, &format!("/v1/jobs/{id}/output")).send().await.unwrap();
    assert_eq!(raw.status().as_u16(), 200);
    assert_eq!(raw.headers()["content-type"], "application/octet-stream");
    assert_eq!(raw.bytes().await.unwrap().to_vec(), binary);

    let (status, answer) = submit(&server, json!({ "plugin": "hello", "input": { "name": " " } })).await;
    assert_eq!(status, 200, "a failed job is still an answer: {answer}");
    assert_eq!(
        (answer["job"]["status"].as_str(), answer["job"]["error_kind"].as_str()),
        (Some("failed"), Some("invalid_input"))
    );
    let id = answer["job"]["id"].as_str().unwrap();
    let (status, body) = server.call(Method::GET, &format!("/v1/jobs/{id}/output"), None).await;
    assert_eq!((status, error_kind(&body)), (409, "no_output"));
}

#[tokio::test]
async fn an_async_job_is_accepted_then_polled_to_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let id = submit_async(&server, "hello@0.0.0", json!({ "name": "later" })).await;
    let job = server.poll_job(&id, is_terminal).await;
    assert_eq!(job["status"], "succeeded");
    assert!(job["output_bytes"].as_u64().unwrap() > 0);
    assert_eq!(job["progress"]["done"], 1, "the guest's last progress report is kept");
    let (status, logs) = server.call(Method::GET, &format!("/v1/jobs/{id}/logs"), None).await;
    assert_eq!(status, 200);
    assert!(!logs["records"].as_array().unwrap().is_empty(), "hello logs once: {logs}");
    let (status, body) = server.call(Method::GET, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/logs", None).await;
    assert_eq!((status, error_kind(&body)), (404, "not_found"));
    let (status, body) = server.call(Method::GET, "/v1/jobs/not-an-id", None).await;
    assert_eq!((status, error_kind(&body)), (400, "invalid_request"));
}

#[tokio::test]
async fn bad_submits_are_refused_before_anything_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-body", "600KiB"]);
    server.add_plugin("hello").await;
    let cases = [
        (json!({ "plugin": "nobody" }), 404, "unknown_plugin"),
        (json!({ "plugin": "hello", "colour": "blue" }), 400, "invalid_request"),
        (json!({ "input": {} }), 400, "invalid_request"),
        (json!({ "plugin": "hello", "input": {}, "input_base64": "" }), 400, "invalid_request"),
        (json!({ "plugin": "hello", "input_base64": "not base64!" }), 400, "invalid_request"),
        (json!({ "plugin": "hello", "phase": "destroy" }), 400, "invalid_request"),
        (json!({ "plugin": "hello", "phase": "apply", "action": "x" }), 400, "invalid_request"),
        (json!({ "plugin": "hello", "execution": "later" }), 400, "invalid_request"),
        (json!({ "plugin": "hello", "memory_bytes": 1u64 << 40 }), 400, "invalid_job"),
        (json!({ "plugin": "hello", "timeout_ms": 1u64 << 40 }), 400, "sync_ceiling"),
        (json!({ "plugin": "hello", "timeout_ms": 1u64 << 40, "execution": "async" }), 400, "invalid_job"),
        (json!({ "plugin": "hello", "delay_ms": 1000 }), 400, "invalid_request"),
        (json!({ "plugin": "hello", "run_at": "tomorrow", "execution": "async" }), 400, "invalid_request"),
        (
            json!({ "plugin": "hello", "run_at": "2026-01-01T00:00:00Z", "delay_ms": 1, "execution": "async" }),
            400,
            "invalid_request",
        ),
        (json!({ "plugin": "hello", "delay_ms": 1u64 << 40, "execution": "async" }), 400, "invalid_job"),
        (
            json!({ "plugin": "hello", "backoff_ms": 5000, "backoff_cap_ms": 10, "execution": "async" }),
            400,
            "invalid_job",
        ),
        (json!({ "plugin": "hello", "backoff_ms": 0, "execution": "async" }), 400, "invalid_job"),
        (json!({ "plugin": "hello", "output_bytes": 1u64 << 40 }), 400, "invalid_job"),
        (json!({ "plugin": "hello", "max_attempts": 0 }), 400, "invalid_job"),
        (json!({ "plugin": "hello", "timeout_ms": 0 }), 400, "invalid_job"),
    ];
    for (body, want_status, want_kind) in cases {
        let (status, answer) = submit(&server, body.clone()).await;
        assert_eq!((status, error_kind(&answer)), (want_status, want_kind), "{body} → {answer}");
    }
    let (_, answer) = submit(&server, json!({ "plugin": "hello", "memory_bytes": 1u64 << 40 })).await;
    assert!(answer["error"]["message"].as_str().unwrap().contains("ceiling of 1073741824"), "{answer}");
    let malformed = server.request(Method::POST, "/v1/jobs").body("{not json").send().await.unwrap();
    assert_eq!(malformed.status().as_u16(), 400);
    let huge = json!({ "plugin": "hello", "input_base64": b64(&vec![7u8; 600 << 10]) });
    let (status, answer) = submit(&server, huge).await;
    assert_eq!((status, error_kind(&answer)), (413, "payload_too_large"));
    let oversized_plugin =
        server.request(Method::POST, "/v1/plugins?name=big").body(vec![0u8; 601 << 10]).send().await.unwrap();
    assert_eq!(oversized_plugin.status().as_u16(), 413);
    let (_, list) = server.call(Method::GET, "/v1/jobs", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 0, "nothing was queued");
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    // One slot, two queued at most; the queue is recounted only every 10 s,
    // so the count this process keeps decides.
    let server =
        Server::start(&dir.path().join("s.db"), &["--max-workers", "1", "--max-queued", "2", "--poll-interval", "10s"]);
    server.add_plugin("coop").await;
    let first = submit_async(&server, "coop", json!({})).await;
    server.poll_job(&first, |j| j["status"] == "running").await;
    let queued = [submit_async(&server, "coop", json!({})).await, submit_async(&server, "coop", json!({})).await];
    let response = server
        .request(Method::POST, "/v1/jobs")
        .json(&json!({ "plugin": "coop", "execution": "async" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(error_kind(&body), "backpressure");
    for id in queued.iter().chain([&first]) {
        server.call(Method::POST, &format!("/v1/jobs/{id}/cancel"), None).await;
    }
}

#[tokio::test]
async fn cancel_answers_200_queued_202_running_and_409_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "1"]);
    server.add_plugin("coop").await;
    let running = submit_async(&server, "coop", json!({})).await;
    server.poll_job(&running, |j| j["status"] == "running" && !j["progress"].is_null()).await;
    let queued = submit_async(&server, "coop", json!({})).await;

    let (status, answer) = server.call(Method::POST, &format!("/v1/jobs/{queued}/cancel"), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")));
    let (status, answer) = server.call(Method::POST, &format!("/v1/jobs/{running}/cancel"), None).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("cancel_requested")));
    let job = server.poll_job(&running, is_terminal).await;
    assert_eq!((job["status"].as_str(), job["error_kind"].as_str()), (Some("cancelled"), Some("cancelled")));
    let (status, answer) = server.call(Method::POST, &format!("/v1/jobs/{running}/cancel"), None).await;
    assert_eq!((status, error_kind(&answer)), (409, "already_terminal"));
    let (status, answer) = server.call(Method::POST, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/cancel", None).await;
    assert_eq!((status, error_kind(&answer)), (404, "not_found"));
}

/// An over-ceiling sync call is refused with a 400 naming the
/// ceiling, never turned into a background job.
#[tokio::test]
async fn a_sync_request_over_the_ceiling_is_refused_and_nothing_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--sync-timeout", "20s"]);
    server.add_plugin("hello").await;
    let (status, answer) = submit(&server, json!({ "plugin": "hello", "timeout_ms": 20_001 })).await;
    assert_eq!((status, error_kind(&answer)), (400, "sync_ceiling"), "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("20000 ms") && message.contains("\"execution\": \"async\""), "{message}");
    let (_, list) = server.call(Method::GET, "/v1/jobs", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 0, "nothing was queued");
    // At the ceiling it runs, and sync without a timeout takes the ceiling.
    let (status, answer) = submit(&server, json!({ "plugin": "hello", "timeout_ms": 20_000 })).await;
    assert_eq!((status, answer["job"]["status"].as_str()), (200, Some("succeeded")), "{answer}");
    let (status, answer) = submit(&server, json!({ "plugin": "hello" })).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["job"]["limits"]["timeout_ms"], 20_000, "{answer}");
    // The same timeout async is fine: the async ceiling is another one.
    let (status, _) = submit(&server, json!({ "plugin": "hello", "timeout_ms": 60_000, "execution": "async" })).await;
    assert_eq!(status, 202);
}

/// A sync job's deadline covers its queue wait: stuck behind a busy slot,
/// it answers with its own final `expired` outcome, never 202, and never
/// starts later.
#[tokio::test]
async fn a_sync_job_that_cannot_start_before_its_deadline_answers_expired() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts.log");
    let server =
        Server::start(&dir.path().join("s.db"), &["--max-workers", "1", "--start-log", starts.to_str().unwrap()]);
    server.add_plugin("coop").await;
    server.add_plugin("hello").await;
    let blocker = submit_async(&server, "coop", json!({})).await;
    server.poll_job(&blocker, |j| j["status"] == "running").await;
    let asked = std::time::Instant::now();
    let (status, answer) = submit(&server, json!({ "plugin": "hello", "timeout_ms": 1000 })).await;
    assert_eq!(status, 200, "{answer}");
    assert!(asked.elapsed() >= std::time::Duration::from_secs(1), "answered before the deadline");
    let job = &answer["job"];
    assert_eq!((job["status"].as_str(), job["error_kind"].as_str()), (Some("failed"), Some("expired")), "{answer}");
    assert!(job["error_message"].as_str().unwrap().contains("deadline"), "{answer}");
    assert_eq!(job["attempt"], 0, "it never started");
    let id = job["id"].as_str().unwrap().to_owned();
    // Free the slot: the expired job stays expired and never starts.
    server.call(Method::POST, &format!("/v1/jobs/{blocker}/cancel"), None).await;
    server.poll_job(&blocker, is_terminal).await;
    let hello = submit(&server, json!({ "plugin": "hello", "timeout_ms": 30_000 })).await;
    assert_eq!(hello.1["job"]["status"], "succeeded", "the slot is free again: {}", hello.1);
    let log = std::fs::read_to_string(&starts).unwrap();
    assert!(!log.contains(&id), "the expired sync job started: {log}");
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!((job["status"].as_str(), job["attempt"].as_u64()), (Some("failed"), Some(0)));
}

/// A sync job's run is cut to what is left of its deadline: the answer is
/// its `timeout`, not a 202 while it goes on.
#[tokio::test]
async fn a_sync_job_that_runs_past_its_deadline_answers_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--cancel-grace", "200ms"]);
    server.add_plugin("sleep").await;
    let (status, answer) =
        submit(&server, json!({ "plugin": "sleep", "input": { "ms": 60_000 }, "timeout_ms": 3000 })).await;
    assert_eq!(status, 200, "{answer}");
    let job = &answer["job"];
    assert_eq!((job["status"].as_str(), job["error_kind"].as_str()), (Some("failed"), Some("timeout")), "{answer}");
}

/// A stored job's limits are clamped again, against the ceiling
/// in force when a worker claims it.
#[tokio::test]
async fn a_stored_job_is_clamped_to_the_ceiling_in_force_at_claim() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let id = {
        let submitter = leash::runtime::Runtime::builder(&db).without_workers().build().await.unwrap();
        let mut job = leash::runtime::Submit::new(
            leash::runtime::PluginSource::Bytes(leash_tests::plugin_bytes("sleep")),
            leash::job::Target::Execute,
            br#"{"ms": 600000}"#.to_vec(),
        );
        job.timeout = Some(std::time::Duration::from_secs(3600));
        let id = submitter.submit(job).await.unwrap();
        submitter.shutdown().await;
        id
    };
    let server = Server::start(&db, &["--max-timeout", "1s", "--cancel-grace", "200ms"]);
    let job = server.poll_job(&id.to_string(), is_terminal).await;
    assert_eq!((job["status"].as_str(), job["error_kind"].as_str()), (Some("failed"), Some("timeout")), "{job}");
    assert!(job["error_message"].as_str().unwrap().contains("1s"), "ran with the new ceiling: {job}");
    assert_eq!(job["limits"]["timeout_ms"], 3_600_000, "the stored request is kept as asked");
    // New submits above the lowered ceiling are refused outright.
    server.add_plugin("hello").await;
    let (status, answer) =
        submit(&server, json!({ "plugin": "hello", "timeout_ms": 2000, "execution": "async" })).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_job"), "{answer}");
}

#[tokio::test]
async fn jobs_are_listed_filtered_and_paged() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let mut ids = Vec::new();
    for plan in ["p1", "p1", "p2"] {
        let (status, answer) =
            submit(&server, json!({ "plugin": "hello", "plan_id": plan, "concurrency_key": plan })).await;
        assert_eq!(status, 200, "{answer}");
        ids.push(answer["job"]["id"].as_str().unwrap().to_owned());
    }
    let ids_of = |page: &Value| -> Vec<String> {
        page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_owned()).collect()
    };
    let (status, page) = server.call(Method::GET, "/v1/jobs?plan=p1&limit=1", None).await;
    assert_eq!(status, 200);
    assert_eq!(ids_of(&page), vec![ids[1].clone()]);
    let next = page["next_before"].as_str().unwrap();
    let (_, page2) = server.call(Method::GET, &format!("/v1/jobs?plan=p1&limit=1&before={next}"), None).await;
    assert_eq!(ids_of(&page2), vec![ids[0].clone()]);
    let (_, by_key) = server.call(Method::GET, "/v1/jobs?concurrency_key=p2", None).await;
    assert_eq!(ids_of(&by_key), vec![ids[2].clone()]);
    let (_, by_status) = server.call(Method::GET, "/v1/jobs?status=succeeded&plugin=hello", None).await;
    assert_eq!(ids_of(&by_status).len(), 3);
    assert_eq!(by_status["next_before"], Value::Null);
    let (_, either) = server.call(Method::GET, "/v1/jobs?status=failed,succeeded&plugin=hello", None).await;
    assert_eq!(ids_of(&either), ids_of(&by_status), "any of several states: {either}");
    for bad in
        ["status=done", "status=succeeded,done", "limit=0", "limit=501", "before=x", "plugin=Bad%20Name", "colour=blue"]
    {
        let (status, body) = server.call(Method::GET, &format!("/v1/jobs?{bad}"), None).await;
        assert_eq!((status, error_kind(&body)), (400, "invalid_request"), "{bad}");
    }
}

#[tokio::test]
async fn health_and_metrics_report_the_pool_and_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "3"]);
    server.add_plugin("hello").await;
    let (status, _) = submit(&server, json!({ "plugin": "hello" })).await;
    assert_eq!(status, 200);
    // The pool counts an attempt once its end is in the store, so the
    // answer, read from the store, can come a moment before the count.
    let text = eventually("the attempt is counted and its slot free", async || {
        let response = server.request(Method::GET, "/metrics").send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let text = response.text().await.unwrap();
        (text.contains("leash_job_duration_seconds_count{plugin=\"hello\"} 1")
            && text.contains("leash_pool_free_slots 3"))
        .then_some(text)
    })
    .await;
    let (status, report) = server.call(Method::GET, "/v1/health", None).await;
    assert_eq!(status, 200);
    let health = &report["health"];
    assert_eq!((health["state"].as_str(), health["max_workers"].as_u64()), (Some("running"), Some(3)));
    assert_eq!((health["processed"].as_u64(), health["counts"]["succeeded"].as_u64()), (Some(1), Some(1)));
    assert!(health["last_heartbeat"].as_str().unwrap().ends_with('Z'), "UTC: {health}");
    assert_eq!(report["ceilings"]["max_memory_bytes"], 1u64 << 30);

    for needle in [
        "leash_jobs_finished_total{status=\"succeeded\",error_kind=\"\",plugin=\"hello\"} 1",
        "leash_attempts_total{plugin=\"hello\",outcome=\"succeeded\"} 1",
        "leash_job_duration_seconds_count{plugin=\"hello\"} 1",
        "leash_queue_wait_seconds_count{plugin=\"hello\"} 1",
        "leash_oldest_queued_seconds 0.0",
        "leash_queue_depth{state=\"succeeded\"} 1",
        "leash_queue_depth{state=\"queued\"} 0",
        "leash_running_jobs 0",
        "leash_pool_slots 3",
        "leash_pool_free_slots 3",
        "leash_claim_seconds_count",
        "leash_complete_seconds_count 1",
        "leash_lease_renewals_total",
        "leash_leases_lost_total 0",
        "leash_fuel_used_total",
        "leash_event_loop_lag_seconds",
    ] {
        assert!(text.contains(needle), "metrics lack {needle:?}:\n{text}");
    }
}

#[tokio::test]
async fn a_job_outlives_a_sigkilled_server_and_ends_per_the_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let mut server = Server::start(&db, &["--lease-ttl", "1s"]);
    server.add_plugin("sleep").await;
    let (status, answer) =
        submit(&server, json!({ "plugin": "sleep", "input": { "ms": 1500 }, "max_attempts": 2, "execution": "async" }))
            .await;
    assert_eq!(status, 202);
    let retried = answer["job_id"].as_str().unwrap().to_owned();
    let (_, answer) =
        submit(&server, json!({ "plugin": "sleep", "input": { "ms": 1500 }, "execution": "async" })).await;
    let once = answer["job_id"].as_str().unwrap().to_owned();
    for id in [&retried, &once] {
        server.poll_job(id, |j| j["status"] == "running").await;
    }
    server.kill();

    let server = Server::start(&db, &["--lease-ttl", "1s"]);
    // Neither issued an effect, so each runs again without spending an
    // attempt, the one-attempt job too.
    for id in [&retried, &once] {
        let job = server.poll_job(id, is_terminal).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        let counters = (job["attempt"].as_u64(), job["lost_leases"].as_u64(), job["free_reruns"].as_u64());
        assert_eq!(counters, (Some(2), Some(0), Some(1)), "{job}");
        // Both runs on record: the one the kill cut short (its process
        // fell silent), then the rerun.
        let (status, list) = server.call(Method::GET, &format!("/v1/jobs/{id}/attempts"), None).await;
        assert_eq!(status, 200, "{list}");
        let runs: Vec<(u64, &str)> = list["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["run"].as_u64().unwrap(), a["outcome"].as_str().unwrap()))
            .collect();
        assert_eq!(runs, [(1, "process_died"), (2, "succeeded")], "{list}");
    }
    let (_, list) = server.call(Method::GET, "/v1/jobs", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 2, "nothing vanished");
}

/// Each attempt of a retried job is listed: its worker, its times, how it
/// ended and its error; the last is the job's own ending.
#[tokio::test]
async fn a_retried_job_lists_each_attempt_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("fail").await;
    let input = json!({ "kind": "retryable", "message": "upstream busy" });
    let body = json!({ "plugin": "fail", "input": input, "max_attempts": 2, "backoff_ms": 10, "execution": "async" });
    let (status, answer) = submit(&server, body).await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["job_id"].as_str().unwrap().to_owned();
    let job = server.poll_job(&id, is_terminal).await;
    assert_eq!(job["status"], "failed", "{job}");
    let (status, list) = server.call(Method::GET, &format!("/v1/jobs/{id}/attempts"), None).await;
    assert_eq!(status, 200, "{list}");
    let attempts = list["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{list}");
    let (first, last) = (&attempts[0], &attempts[1]);
    assert_eq!((first["run"].as_u64(), first["outcome"].as_str()), (Some(1), Some("retried")), "{list}");
    assert_eq!(first["error"], "guest_error: Retryable: upstream busy");
    assert_eq!((last["run"].as_u64(), last["outcome"].as_str()), (Some(2), Some("failed")), "{list}");
    assert!(last["error"].as_str().unwrap().contains("upstream busy"), "{list}");
    for attempt in attempts {
        assert!(attempt["worker_id"].as_str().is_some_and(|w| !w.is_empty()), "{attempt}");
        assert!(attempt["started_at"].as_str().unwrap() <= attempt["ended_at"].as_str().unwrap(), "{attempt}");
    }
    let (status, _) = server.call(Method::GET, "/v1/jobs/01ARZ3NDEKTSV4RRFFQ69G5FAV/attempts", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn sigterm_with_a_sync_request_open_exits_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("s.db"), &["--sync-timeout", "60s", "--shutdown-budget", "2s"]);
    server.add_plugin("coop").await;
    let waiting = {
        let request = server.request(Method::POST, "/v1/jobs").json(&json!({ "plugin": "coop" }));
        tokio::spawn(async move { request.send().await })
    };
    let list = eventually("the job starts", async || {
        let (_, list) = server.call(Method::GET, "/v1/jobs?status=running", None).await;
        (!list["jobs"].as_array().unwrap().is_empty()).then_some(list)
    })
    .await;
    let id = list["jobs"][0]["id"].as_str().unwrap().to_owned();
    let started = std::time::Instant::now();
    assert!(
        std::process::Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap().success()
    );
    let status = server.child.wait().unwrap();
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took <= std::time::Duration::from_secs(4),
        "exited in {took:?} with a 2 s budget and a 60 s sync wait open"
    );
    // The open sync request is dropped with the process, or, if the store
    // closed under it first, answered 503 `shutting_down` (retry
    // elsewhere); never an outcome, a 202 or a timeout.
    if let Ok(response) = waiting.await.unwrap() {
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        assert_eq!((status, body["error"]["kind"].as_str()), (503, Some("shutting_down")), "{body}");
    }
    let reader = leash::runtime::Runtime::builder(dir.path().join("s.db")).without_workers().build().await.unwrap();
    let job = reader.get(id.parse().unwrap()).await.unwrap();
    assert_eq!((job.status, job.attempt, job.lost_leases), (JobStatus::Queued, 1, 0), "released, no attempt spent");
}

/// Every number a client can send, at its extremes: accepted, or refused
/// with a JSON error naming the field before anything is queued; and no
/// accepted job breaks a later read of itself or of a list page.
#[tokio::test]
async fn every_numeric_field_at_its_extremes_is_checked_before_queueing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "1"]);
    server.add_plugin("hello").await;
    let fields = ["timeout_ms", "fuel", "memory_bytes", "output_bytes", "max_attempts", "queue_ttl_ms"];
    let values =
        [json!(0), json!(1), json!(9_007_199_254_740_992u64), json!(u64::MAX), json!(-1), json!(1.5), json!("1")];
    let mut accepted = Vec::new();
    for field in fields {
        for value in &values {
            let body = json!({ "plugin": "hello", "execution": "async", field: value });
            let (status, answer) = submit(&server, body.clone()).await;
            match status {
                202 => accepted.push(answer["job_id"].as_str().unwrap().to_owned()),
                400 => {
                    let message = answer["error"]["message"].as_str().unwrap_or_default();
                    let stem = field.trim_end_matches("_ms");
                    assert!(message.contains(stem), "{body} → {answer}: the message names {stem}");
                }
                other => panic!("{body} → {other} {answer}"),
            }
        }
    }
    // The report's repro: a queue TTL that put `expires_at` past year 9999.
    let (status, answer) =
        submit(&server, json!({ "plugin": "hello", "execution": "async", "queue_ttl_ms": 9_007_199_254_740_992u64 }))
            .await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_job"), "{answer}");
    for id in &accepted {
        let (status, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
        assert_eq!(status, 200, "{job}");
    }
    let (status, page) = server.call(Method::GET, "/v1/jobs?limit=500", None).await;
    assert_eq!(status, 200);
    assert_eq!(page["jobs"].as_array().unwrap().len(), accepted.len());
}

#[tokio::test]
async fn only_canonical_job_ids_are_accepted_and_every_refusal_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "1"]);
    server.add_plugin("hello").await;
    let id = submit_async(&server, "hello", json!({})).await;
    let (status, _) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(status, 200);
    let alias = format!("8{}", &id[1..]);
    for path in [
        format!("/v1/jobs/{alias}"),
        format!("/v1/jobs/{alias}/logs"),
        format!("/v1/jobs/{alias}/output"),
        format!("/v1/jobs/{}", id.to_lowercase()),
        "/v1/jobs?before=ZZZZZZZZZZZZZZZZZZZZZZZZZZ".to_owned(),
        "/v1/jobs/%FF".to_owned(),
        "/v1/jobs/%FF/logs".to_owned(),
        "/v1/jobs/%FF/output".to_owned(),
        "/v1/plugins/%FF".to_owned(),
    ] {
        let (status, answer) = server.call(Method::GET, &path, None).await;
        assert_eq!((status, error_kind(&answer)), (400, "invalid_request"), "{path} → {answer}");
    }
    for path in [format!("/v1/jobs/{alias}/cancel"), "/v1/jobs/%FF/cancel".to_owned()] {
        let (status, answer) = server.call(Method::POST, &path, None).await;
        assert_eq!((status, error_kind(&answer)), (400, "invalid_request"), "{path} → {answer}");
    }
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_ne!(job["status"], "cancelled", "the alias did not reach the real job");
    // A wrong type names its field.
    let (status, answer) = submit(&server, json!({ "plugin": 123 })).await;
    assert_eq!(status, 400);
    assert!(answer["error"]["message"].as_str().unwrap().contains("`plugin`"), "{answer}");
    let (_, answer) = submit(&server, json!({ "plugin": "hello", "timeout_ms": "soon" })).await;
    assert!(answer["error"]["message"].as_str().unwrap().contains("`timeout_ms`"), "{answer}");
}

/// Clients that open connections and stall: over the connection cap a new
/// request is answered 503 at once (not left hanging), the stalled ones
/// are closed after the header timeout, and then the API answers again.
/// An idle keep-alive connection is closed after the same time, and the
/// server raised its open-files limit to the hard limit at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_cannot_lock_the_api_out() {
    use std::os::unix::process::CommandExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        &dir.path().join("s.db"),
        &["--header-timeout", "1s", "--max-connections", "64"],
        |command| {
            // SAFETY: setrlimit is async-signal-safe; it only lowers this
            // child's soft open-files limit before exec.
            unsafe {
                command.pre_exec(|| {
                    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                    libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
                    limit.rlim_cur = limit.rlim_cur.min(256);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                    Ok(())
                });
            }
        },
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.child.id())).unwrap();
    let files = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let numbers: Vec<&str> = files.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers[0], numbers[1], "the soft limit was raised to the hard one: {files}");

    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut stalled = Vec::new();
    for _ in 0..100 {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: leash\r\n").await.unwrap();
        stalled.push(stream);
    }
    let healthz = format!("{}/healthz", server.url);
    let over = tokio::time::timeout(GENEROUS, server.http.get(&healthz).send()).await.expect("no hang").unwrap();
    assert_eq!(over.status().as_u16(), 503);
    assert_eq!(over.headers()["retry-after"], "1");
    let body: Value = over.json().await.unwrap();
    assert_eq!(error_kind(&body), "busy");
    // Every stalled connection is closed by the server.
    for mut stream in stalled {
        let mut rest = Vec::new();
        tokio::time::timeout(GENEROUS, stream.read_to_end(&mut rest)).await.expect("closed by the server").ok();
    }
    let healthy = tokio::time::timeout(GENEROUS, server.http.get(&healthz).send()).await.expect("no hang").unwrap();
    assert_eq!(healthy.status().as_u16(), 200);

    // An idle keep-alive connection is closed once the timeout passes.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: leash\r\n\r\n").await.unwrap();
    let mut answer = vec![0u8; 1024];
    let n = idle.read(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"));
    let answered = std::time::Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(GENEROUS, idle.read_to_end(&mut rest)).await.expect("closed by the server").ok();
    assert!(answered.elapsed() >= std::time::Duration::from_millis(900), "closed for being idle, not at once");
}

/// A compile bomb uploaded to a server is refused before it is compiled,
/// as `compile_limit`, while jobs of another plugin keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_bomb_is_refused_while_other_jobs_run() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "2"]);
    server.add_plugin("hello").await;
    let max = leash::sandbox::ComponentLimits::default().max_functions as usize;
    let bomb = wat::parse_str(format!("(component (core module {}))", "(func)".repeat(max + 1))).unwrap();
    let before: Vec<String> = queue_hellos(&server, 4).await;
    let upload = server.request(Method::POST, "/v1/plugins?name=bomb").body(bomb).send();
    let (answer, during) = tokio::join!(upload, queue_hellos(&server, 4));
    let answer = answer.unwrap();
    assert_eq!(answer.status().as_u16(), 400);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(error_kind(&body), "compile_limit", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(&format!("{} functions", max + 1)), "{body}");
    for id in before.iter().chain(&during) {
        let job = server.poll_job(id, is_terminal).await;
        assert_eq!(job["status"], "succeeded", "{job}");
    }
}

/// Queue `n` hello jobs.
async fn queue_hellos(server: &Server, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(submit_async(server, "hello", json!({ "name": format!("n{i}") })).await);
    }
    ids
}

#[tokio::test]
async fn an_idempotency_key_makes_a_retried_submit_safe() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let keyed = |key: &str, body: &str| {
        server
            .request(Method::POST, "/v1/jobs")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
    };
    let body = r#"{"plugin":"hello","input":{"name":"Ida"},"execution":"async"}"#;
    let first = keyed("order-1", body).await.unwrap();
    assert_eq!(first.status().as_u16(), 202);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.unwrap();
    // The same request again, even spelled differently: the same job, marked.
    let reordered = r#"{ "execution": "async", "input": {"name": "Ida"}, "plugin": "hello" }"#;
    for again in [body, reordered] {
        let replay = keyed("order-1", again).await.unwrap();
        assert_eq!(replay.status().as_u16(), 202);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        let replay: Value = replay.json().await.unwrap();
        assert_eq!(replay["job_id"], first["job_id"]);
    }
    // Another request under the same key: refused, nothing queued.
    let other = keyed("order-1", r#"{"plugin":"hello","input":{"name":"Other"},"execution":"async"}"#).await.unwrap();
    assert_eq!(other.status().as_u16(), 409);
    let other: Value = other.json().await.unwrap();
    assert_eq!(error_kind(&other), "idempotency_conflict");
    for bad in ["", &"k".repeat(256)] {
        let refused = keyed(bad, body).await.unwrap();
        assert_eq!(refused.status().as_u16(), 400, "key {bad:?}");
    }
    // A sync request replays its outcome.
    let sync = r#"{"plugin":"hello","input":{"name":"Sy"}}"#;
    let (a, b) = (keyed("order-2", sync).await.unwrap(), keyed("order-2", sync).await.unwrap());
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    assert_eq!(b.headers()["idempotent-replayed"], "true");
    let (a, b): (Value, Value) = (a.json().await.unwrap(), b.json().await.unwrap());
    assert_eq!(a["job"]["id"], b["job"]["id"]);
    assert_eq!(b["output"]["greeting"], "Hello, Sy!");
    let (_, list) = server.call(Method::GET, "/v1/jobs", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 2, "one job per key: {list}");
}

/// `leash submit` whose first answer is lost (the connection drops after
/// the server took the request) retries under the same key: one job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leash_submit_retries_a_lost_answer_without_queueing_twice() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "1"]);
    server.add_plugin("hello").await;
    let upstream = server.url.trim_start_matches("http://").to_owned();
    // A proxy that passes the first request on, then drops the connection
    // before the answer comes back; later connections pass both ways.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    tokio::spawn(async move {
        let mut first = true;
        loop {
            let (mut client, _) = proxy.accept().await.unwrap();
            let mut upstream = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            if std::mem::take(&mut first) {
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 65536];
                    // Headers and the whole JSON body, then the answer is dropped.
                    while !String::from_utf8_lossy(&request).contains("}") {
                        let n = client.read(&mut buffer).await.unwrap();
                        request.extend_from_slice(&buffer[..n]);
                    }
                    upstream.write_all(&request).await.unwrap();
                    let n = upstream.read(&mut buffer).await.unwrap();
                    assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 202"));
                    drop(client);
                });
            } else {
                tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        }
    });
    let output = tokio::task::spawn_blocking({
        let token_file = server.token_file.clone();
        move || {
            crate::support::server::leash_bin()
                .args(["submit", "hello", "--server", &proxy_url, "--token-file"])
                .arg(token_file)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let id = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let (_, list) = server.call(Method::GET, "/v1/jobs", None).await;
    let jobs = list["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "queued once: {list}");
    assert_eq!(jobs[0]["id"], id);
}

/// A waiter that gives up never cancels the job. A sync client
/// that disconnects leaves its job running, and the wait is counted as
/// abandoned in health and metrics.
#[tokio::test]
async fn a_sync_client_that_disconnects_leaves_its_job_running_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("coop").await;
    let impatient = reqwest::Client::builder().timeout(std::time::Duration::from_millis(700)).build().unwrap();
    let gave_up = impatient
        .post(format!("{}/v1/jobs", server.url))
        .bearer_auth(&server.token)
        .json(&json!({ "plugin": "coop", "timeout_ms": 30_000 }))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out before the job ended");
    let health = eventually("the abandoned wait is counted", async || {
        let (_, report) = server.call(Method::GET, "/v1/health", None).await;
        (report["health"]["waits_abandoned"] == 1).then_some(report)
    })
    .await;
    assert_eq!(health["health"]["counts"]["running"], 1, "the job goes on: {health}");
    let (_, page) = server.call(Method::GET, "/v1/jobs?status=running", None).await;
    let id = page["jobs"][0]["id"].as_str().unwrap().to_owned();
    let metrics = server.request(Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("leash_waits_abandoned_total 1"), "{metrics}");
    server.call(Method::POST, &format!("/v1/jobs/{id}/cancel"), None).await;
    let job = server.poll_job(&id, is_terminal).await;
    assert_eq!(job["status"], "cancelled", "it ran until cancelled, not until its client left");
}

/// The client reads answers through the API's own types: every answer of
/// a live server must read back as its type, with nothing lost.
#[tokio::test]
async fn every_answer_reads_back_as_its_api_type() {
    use leash::api::types::{Accepted, CancelAnswer, Finished, HealthReport, JobPage, JobView, PluginList};
    use leash::client::typed;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    server.add_plugin("coop").await;
    let (_, sync) =
        server.call(Method::POST, "/v1/jobs", Some(json!({ "plugin": "hello", "input": { "name": "typed" } }))).await;
    let finished: Finished<JobView> = typed(sync.clone()).unwrap();
    assert_eq!(finished.job.job.status, JobStatus::Succeeded);
    assert_eq!(serde_json::to_value(&finished).unwrap(), sync, "a field was lost reading the sync answer");
    let (_, accepted) = server
        .call(Method::POST, "/v1/jobs", Some(json!({ "plugin": "coop", "input": {}, "execution": "async" })))
        .await;
    let accepted: Accepted = typed(accepted).unwrap();
    let (_, one) = server.call(Method::GET, &format!("/v1/jobs/{}", accepted.job_id), None).await;
    let view: JobView = typed(one.clone()).unwrap();
    assert_eq!(serde_json::to_value(&view).unwrap(), one, "a field was lost reading a job");
    for (path, check) in [
        ("/v1/jobs", (|v: Value| serde_json::to_value(typed::<JobPage>(v).unwrap()).unwrap()) as fn(Value) -> Value),
        ("/v1/plugins", |v| serde_json::to_value(typed::<PluginList>(v).unwrap()).unwrap()),
        ("/v1/health", |v| serde_json::to_value(typed::<HealthReport>(v).unwrap()).unwrap()),
        ("/v1/workers", |v| serde_json::to_value(typed::<leash::runtime::Workers>(v).unwrap()).unwrap()),
    ] {
        let (status, answer) = server.call(Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {answer}");
        assert_eq!(check(answer.clone()), answer, "{path}: a field was lost reading it back");
    }
    let (_, cancel) = server.call(Method::POST, &format!("/v1/jobs/{}/cancel", accepted.job_id), None).await;
    let cancel: CancelAnswer = typed(cancel).unwrap();
    assert_eq!(cancel.job_id, accepted.job_id);
}

async fn batch(server: &Server, key: Option<&str>, body: &Value) -> (u16, Value, bool) {
    let mut request = server.request(Method::POST, "/v1/jobs:batch").json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    (status, response.json().await.expect("a JSON answer"), replayed)
}

#[tokio::test]
async fn a_batch_is_queued_whole_in_order_and_a_retry_answers_the_same_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let body = json!({ "jobs": [
        { "plugin": "hello@0.0.0", "input": { "name": "one" } },
        { "plugin": "hello", "input": { "name": "two" }, "execution": "async" },
        { "plugin": "hello", "input": { "name": "three" }, "gate": "approval" },
    ]});
    let (status, answer, replayed) = batch(&server, Some("batch-1"), &body).await;
    assert_eq!(status, 202, "{answer}");
    assert!(!replayed);
    let jobs = answer["jobs"].as_array().unwrap();
    let statuses: Vec<&str> = jobs.iter().map(|j| j["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["accepted", "accepted", "pending_approval"]);
    let ids: Vec<String> = jobs.iter().map(|j| j["job_id"].as_str().unwrap().to_owned()).collect();
    for (id, name) in ids.iter().zip(["one", "two", "three"]) {
        let (status, input) = server.call(Method::GET, &format!("/v1/jobs/{id}/input"), None).await;
        assert_eq!((status, input), (200, json!({ "name": name })), "the answer keeps the batch's order");
    }
    for id in &ids[..2] {
        let job = server.poll_job(id, is_terminal).await;
        assert_eq!(job["status"], "succeeded");
    }

    // A retry with the same key and body answers the same jobs, queueing
    // none; the same key on another body is a conflict.
    let (status, again, replayed) = batch(&server, Some("batch-1"), &body).await;
    assert_eq!(status, 202, "{again}");
    assert!(replayed, "the retry is marked as a replay");
    let again_ids: Vec<&str> =
        again["jobs"].as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(again_ids, ids);
    assert_eq!(again["jobs"][2]["status"], "pending_approval");
    let other = json!({ "jobs": [{ "plugin": "hello" }] });
    let (status, answer, _) = batch(&server, Some("batch-1"), &other).await;
    assert_eq!((status, error_kind(&answer)), (409, "idempotency_conflict"));
    let (_, list) = server.call(Method::GET, "/v1/jobs", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 3, "nothing more was queued: {list}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("\"batch-1\""), "the key as sent: {answer}");

    // A single job's key that spells a batch job's place (`batch-1#0`) is
    // its own key, and a batch's key that a single job used first is too.
    let single = |key: &str| {
        server
            .request(Method::POST, "/v1/jobs")
            .header("Idempotency-Key", key)
            .json(&json!({ "plugin": "hello", "input": {}, "execution": "async" }))
            .send()
    };
    for key in ["batch-1#0", "order-7#0"] {
        let response = single(key).await.unwrap();
        assert_eq!(response.status().as_u16(), 202, "{key}: {}", response.text().await.unwrap());
    }
    let (status, answer, replayed) = batch(&server, Some("order-7"), &other).await;
    assert_eq!((status, replayed), (202, false), "{answer}");
    let replay = single("order-7#0").await.unwrap();
    assert_eq!(replay.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
}

#[tokio::test]
async fn a_batch_with_one_bad_job_queues_nothing_and_names_that_job() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-queued", "4", "--poll-interval", "10s"]);
    server.add_plugin("hello").await;
    let good = json!({ "plugin": "hello", "input": { "name": "fine" } });
    let many = |n: usize| json!({ "jobs": vec![good.clone(); n] });
    let cases = [
        (json!({ "jobs": [good, { "plugin": "nobody" }] }), 404, "unknown_plugin", Some("jobs[1]: ")),
        (
            json!({ "jobs": [good, good, { "plugin": "hello", "memory_bytes": 1u64 << 40 }] }),
            400,
            "invalid_job",
            Some("jobs[2]: "),
        ),
        (json!({ "jobs": [{ "plugin": "hello", "phase": "destroy" }] }), 400, "invalid_request", Some("jobs[0]: ")),
        (json!({ "jobs": [good, { "plugin": "hello", "colour": "blue" }] }), 400, "invalid_request", Some("jobs[1]")),
        (
            json!({ "jobs": [good, { "plugin": "hello", "execution": "sync" }] }),
            400,
            "invalid_request",
            Some("jobs[1].execution"),
        ),
        (json!({ "jobs": [] }), 400, "invalid_request", None),
        (many(1001), 400, "invalid_request", None),
        (json!({ "job": [good] }), 400, "invalid_request", None),
        // Admission counts the whole batch: five do not fit in four.
        (many(5), 429, "backpressure", None),
    ];
    for (body, want_status, want_kind, place) in cases {
        let (status, answer, _) = batch(&server, None, &body).await;
        let shown: String = body.to_string().chars().take(200).collect();
        assert_eq!((status, error_kind(&answer)), (want_status, want_kind), "{shown} → {answer}");
        if let Some(place) = place {
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains(place), "{message:?} names {place:?}");
        }
    }
    let long_key = "k".repeat(252);
    let (status, answer, _) = batch(&server, Some(&long_key), &many(1)).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_request"), "{answer}");
    let (_, list) = server.call(Method::GET, "/v1/jobs", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 0, "nothing was queued: {list}");
    let (status, answer, _) = batch(&server, None, &many(4)).await;
    assert_eq!(status, 202, "a batch that fits is queued: {answer}");
}
