//! Redrive by filter against a real `leash serve`: a dry run says what a
//! retry would take, the retry takes exactly that, page by page, and
//! leaves a plan's phase and a job that waited for approval alone; the CLI
//! does the same.

use reqwest::Method;
use serde_json::{Value, json};

use crate::cli::ops::leash;
use crate::support::server::{Server, is_terminal};

async fn submit(server: &Server, body: Value) -> String {
    let (status, answer) = server.call(Method::POST, "/v1/jobs", Some(body)).await;
    assert_eq!(status, 202, "{answer}");
    answer["job_id"].as_str().unwrap().to_owned()
}

async fn retry(server: &Server, body: Value) -> Value {
    let (status, answer) = server.call(Method::POST, "/v1/jobs:retry", Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

fn ids(answer: &Value, field: &str) -> Vec<String> {
    let mut ids: Vec<String> = answer[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().or_else(|| v["id"].as_str()).unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_says_what_a_retry_by_filter_takes_and_the_retry_takes_exactly_that() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "4"]);
    for plugin in ["fail", "spin", "hello", "plan-probe"] {
        server.add_plugin(plugin).await;
    }
    let async_job = |plugin: &str, input: Value| json!({ "plugin": plugin, "input": input, "execution": "async" });
    let mut failed = Vec::new();
    for n in 0..3 {
        failed.push(submit(&server, async_job("fail", json!({ "message": format!("DB down ({n})") }))).await);
    }
    let mut timed_out = Vec::new();
    for _ in 0..2 {
        let mut body = async_job("spin", json!({}));
        body["timeout_ms"] = json!(100);
        timed_out.push(submit(&server, body).await);
    }
    let hello = submit(&server, async_job("hello", json!({}))).await;
    // A rejected job (it waited for approval) and a plan whose execute
    // phase failed: neither may be retried on its own.
    let mut gated = async_job("hello", json!({}));
    gated["gate"] = json!("approval");
    let gated = submit(&server, gated).await;
    let (status, _) = server.call(Method::POST, &format!("/v1/jobs/{gated}/reject"), Some(json!({}))).await;
    assert_eq!(status, 200);
    let writes = [json!({ "method": "POST", "url": "http://127.0.0.1:9/x", "body": "" })];
    let (status, plan) = server
        .call(Method::POST, "/v1/plans", Some(json!({ "plugin": "plan_probe", "input": { "writes": writes } })))
        .await;
    assert_eq!(status, 201, "{plan}");
    let plan_execute = plan["execute"]["job"]["id"].as_str().unwrap().to_owned();
    for id in failed.iter().chain(&timed_out).chain([&hello, &plan_execute]) {
        server.poll_job(id, is_terminal).await;
    }

    // Dry: every failed job is matched; the plan's phase is refused; nothing changes.
    let dry = retry(&server, json!({ "dry_run": true })).await;
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["matched"], 6, "{dry}");
    assert_eq!(ids(&dry, "retried"), sorted([failed.clone(), timed_out.clone()].concat()), "{dry}");
    assert_eq!(ids(&dry, "refused"), std::slice::from_ref(&plan_execute));
    assert!(dry["refused"][0]["why"].as_str().unwrap().contains("phase of plan"), "{dry}");
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{}", failed[0]), None).await;
    assert_eq!(job["status"], "failed", "a dry run changes nothing");
    // Cancelled ones too, when asked: the rejected job is refused.
    let cancelled = retry(&server, json!({ "dry_run": true, "status": ["cancelled"] })).await;
    assert_eq!(ids(&cancelled, "refused"), std::slice::from_ref(&gated), "{cancelled}");
    assert!(cancelled["refused"][0]["why"].as_str().unwrap().contains("waited for approval"));

    // By error kind, and by error text (any case), a page at a time.
    let kinds = retry(&server, json!({ "dry_run": true, "error_kind": "timeout" })).await;
    assert_eq!(ids(&kinds, "retried"), sorted(timed_out.clone()));
    let page = retry(&server, json!({ "dry_run": true, "plugin": "fail", "error": "db DOWN", "limit": 2 })).await;
    assert_eq!((page["matched"].as_u64(), page["retried"].as_array().unwrap().len()), (Some(2), 2));
    let before = page["next_before"].as_str().expect("a full page says where the next starts");
    let rest = retry(&server, json!({ "dry_run": true, "plugin": "fail", "error": "db down", "before": before })).await;
    assert_eq!(rest["retried"].as_array().unwrap().len(), 1, "{rest}");
    assert!(rest["next_before"].is_null());

    // For real: exactly what the dry run named; each runs again.
    let done = retry(&server, json!({ "plugin": "fail", "error": "db down" })).await;
    assert_eq!((done["dry_run"].as_bool(), ids(&done, "retried")), (Some(false), sorted(failed.clone())));
    for id in &failed {
        let job = server.poll_job(id, |j| is_terminal(j) && j["attempt"] == 2).await;
        assert_eq!(job["status"], "failed", "{job}");
    }
    let (_, audit) = server.call(Method::GET, "/v1/audit?limit=500", None).await;
    let retried = audit["rows"].as_array().unwrap().iter().filter(|r| r["action"] == "job.retry").count();
    assert_eq!(retried, 3, "each retry is audited");
    let (status, answer) = server.call(Method::POST, "/v1/jobs:retry", Some(json!({ "status": ["succeeded"] }))).await;
    assert_eq!(status, 400, "{answer}");

    // The CLI: a dry run, then the retry, by filter.
    let dry = leash(&server, &["jobs", "retry", "--error-kind", "timeout", "--dry-run"]);
    let said = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert_eq!(dry.status.code(), Some(0), "{said}{}", String::from_utf8_lossy(&dry.stderr));
    assert!(said.starts_with("would retry 2 of 2 matching jobs"), "{said}");
    let done = leash(&server, &["jobs", "retry", "--error-kind", "timeout", "--since", "1h", "--json"]);
    let report: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(ids(&report, "retried"), sorted(timed_out.clone()));
    let nothing = leash(&server, &["jobs", "retry"]);
    assert_eq!(nothing.status.code(), Some(2), "a retry names its jobs");
    let both = leash(&server, &["jobs", "retry", &hello, "--status", "failed"]);
    assert_eq!(both.status.code(), Some(2), "ids or a filter, not both");
}
