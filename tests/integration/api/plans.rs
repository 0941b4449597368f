//! Plans through the HTTP API and the CLI, against a real `leash serve`
//! and the `file-sync` example: execute computes a diff against a record
//! store upstream, a person approves it, apply makes exactly that diff.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use reqwest::Method;
use serde_json::{Value, json};

use crate::cli::ops::{leash, leash_as};
use crate::support::eventually;
use crate::support::server::Server;

/// Each change request with its `Idempotency-Key`, as received.
type ChangeLog = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A record store on loopback: `GET /records` lists, `PUT` (or `POST`)
/// and `DELETE /records/{key}` change one record; every change is logged
/// with the `Idempotency-Key` it came with. The first `PUT` of the key
/// `slow` never answers (the store never applies it); a request whose key
/// the store has answered before is answered again and applied once.
pub(crate) struct Records {
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) records: Arc<Mutex<BTreeMap<String, String>>>,
    changes: ChangeLog,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Records {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Records {
    pub(crate) async fn start(initial: &[(&str, &str)]) -> Records {
        use axum::extract::{Path, State};
        use axum::http::{HeaderMap, Method as Verb};
        use axum::routing::{any, get};
        type Shared = (Arc<Mutex<BTreeMap<String, String>>>, ChangeLog, Arc<Mutex<std::collections::HashSet<String>>>);
        let records: Arc<Mutex<BTreeMap<String, String>>> =
            Arc::new(Mutex::new(initial.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()));
        let changes: ChangeLog = Arc::new(Mutex::new(Vec::new()));
        let change = |State((records, changes, applied)): State<Shared>,
                      verb: Verb,
                      Path(key): Path<String>,
                      headers: HeaderMap,
                      body: String| async move {
            let idempotency = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let shown = if verb == Verb::DELETE { format!("DELETE {key}") } else { format!("{verb} {key}={body}") };
            let first_slow = {
                let mut log = changes.lock().unwrap();
                let first = key == "slow" && !log.iter().any(|(c, _)| c.starts_with(&format!("{verb} slow")));
                log.push((shown, idempotency.clone()));
                first
            };
            if first_slow {
                std::future::pending::<()>().await;
            }
            // A key applied before is answered, not applied again.
            let repeated = idempotency.is_some_and(|k| !applied.lock().unwrap().insert(k));
            if !repeated {
                let mut records = records.lock().unwrap();
                if verb == Verb::DELETE {
                    records.remove(&key);
                } else {
                    records.insert(key, body);
                }
            }
        };
        let app = axum::Router::new()
            .route(
                "/records",
                get(|State((records, _, _)): State<Shared>| async move { axum::Json(records.lock().unwrap().clone()) }),
            )
            .route("/records/{key}", any(change))
            .with_state((records.clone(), changes.clone(), Arc::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Records { addr, records, changes, task }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/records", self.addr)
    }

    pub(crate) fn now(&self) -> BTreeMap<String, String> {
        self.records.lock().unwrap().clone()
    }

    /// Every change request received, in order.
    pub(crate) fn changes(&self) -> Vec<String> {
        self.changes.lock().unwrap().iter().map(|(c, _)| c.clone()).collect()
    }

    /// Every change request received with its `Idempotency-Key`.
    pub(crate) fn keyed(&self) -> Vec<(String, Option<String>)> {
        self.changes.lock().unwrap().clone()
    }
}

/// Register `file-sync` with a grant to reach `records`.
async fn add_file_sync(server: &Server, records: &Records) {
    server.add_plugin("file-sync").await;
    let grants = json!({ "http": { "hosts": [format!("GET,PUT,DELETE http://{}", records.addr)],
                                   "private_ranges": ["127.0.0.0/8"] } });
    let (status, answer) = server.call(Method::PUT, "/v1/plugins/file_sync@0.0.0/grants", Some(grants)).await;
    assert_eq!(status, 200, "{answer}");
}

pub(crate) fn error_kind(answer: &Value) -> &str {
    answer["error"]["kind"].as_str().unwrap_or_else(|| panic!("not an error body: {answer}"))
}

pub(crate) async fn poll_plan(server: &Server, id: &str, done: impl Fn(&str) -> bool) -> Value {
    eventually(format!("plan {id} gets there"), async || {
        let (status, plan) = server.call(Method::GET, &format!("/v1/plans/{id}"), None).await;
        assert_eq!(status, 200, "{plan}");
        done(plan["status"].as_str().unwrap()).then_some(plan)
    })
    .await
}

#[tokio::test]
async fn a_plan_runs_execute_waits_for_approval_and_applies_exactly_the_diff() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[("a", "1"), ("b", "old"), ("c", "gone")]).await;
    add_file_sync(&server, &records).await;
    let input = json!({ "store": records.url(), "desired": { "a": "1", "b": "new", "d": "4" } });
    let (status, plan) =
        server.call(Method::POST, "/v1/plans", Some(json!({ "plugin": "file_sync", "input": input }))).await;
    assert_eq!(status, 201, "{plan}");
    assert_eq!(plan["status"], "planning");
    let id = plan["plan_id"].as_str().unwrap().to_owned();
    assert_eq!(plan["execute"]["job"]["concurrency_key"], id.as_str(), "the plan id is its key");

    let plan = poll_plan(&server, &id, |s| s != "planning").await;
    assert_eq!(plan["status"], "awaiting_approval", "{plan}");
    let diff = &plan["execute"]["output"];
    assert_eq!(
        diff["changes"],
        json!([{"op": "put", "key": "b", "value": "new"}, {"op": "put", "key": "d", "value": "4"},
               {"op": "delete", "key": "c"}])
    );
    assert_eq!(plan["apply"]["job"]["status"], "pending_approval");
    assert!(records.changes().is_empty(), "nothing changes before the approval");
    // Someone changes the store meanwhile: apply applies the approved diff,
    // not a newer one.
    records.records.lock().unwrap().insert("e".into(), "late".into());

    // Its submitter (the server's token) may not approve it; alice may.
    let path = format!("/v1/plans/{id}/approve");
    let decision = json!({ "phase": "apply", "comment": "ok" });
    let (status, answer) = server.call(Method::POST, &path, Some(decision.clone())).await;
    assert_eq!((status, error_kind(&answer)), (403, "separation_of_duties"), "{answer}");
    let alice = server.principal("alice", &["approve"]).await;
    let (status, approved) = server.call_as(&alice, Method::POST, &path, Some(decision)).await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["approved_by"], "alice");
    let plan = poll_plan(&server, &id, |s| s != "applying" && s != "awaiting_approval").await;
    assert_eq!(plan["status"], "applied", "{plan}");
    assert_eq!(plan["apply"]["output"], json!({ "applied": 3 }));
    assert_eq!(records.changes(), ["PUT b=new", "PUT d=4", "DELETE c"]);
    let expected: BTreeMap<String, String> = [("a", "1"), ("b", "new"), ("d", "4"), ("e", "late")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(records.now(), expected);
    // Each change is an effect of the apply job, in its ledger.
    let apply_id = plan["apply"]["job"]["id"].as_str().unwrap();
    let (_, effects) = server.call(Method::GET, &format!("/v1/jobs/{apply_id}/effects"), None).await;
    assert_eq!(effects["effects"].as_array().unwrap().len(), 3, "{effects}");

    let (_, page) = server.call(Method::GET, "/v1/plans", None).await;
    assert_eq!(page["plans"][0]["plan_id"], id.as_str());
    let (status, answer) = server.call(Method::POST, &format!("/v1/plans/{id}/cancel"), None).await;
    assert_eq!((status, error_kind(&answer)), (409, "already_terminal"));
    let (status, answer) = server.call(Method::GET, "/v1/plans/01M8NXTW9W53S6M6JQYFF54HBH", None).await;
    assert_eq!((status, error_kind(&answer)), (404, "not_found"));
}

#[tokio::test]
async fn a_failed_execute_never_applies_and_a_rejected_plan_never_applies() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[("a", "1")]).await;
    add_file_sync(&server, &records).await;
    // The store is not reachable at this URL: execute fails.
    let input = json!({ "store": format!("http://{}/nowhere", records.addr), "desired": {} });
    let (_, plan) = server
        .call(Method::POST, "/v1/plans", Some(json!({ "plugin": "file_sync", "input": input, "apply": "auto" })))
        .await;
    let id = plan["plan_id"].as_str().unwrap().to_owned();
    let plan = poll_plan(&server, &id, |s| s != "planning").await;
    assert_eq!(plan["status"], "failed", "{plan}");
    assert!(plan["apply"].is_null(), "apply never exists after a failed execute: {plan}");

    let input = json!({ "store": records.url(), "desired": {} });
    let (_, plan) =
        server.call(Method::POST, "/v1/plans", Some(json!({ "plugin": "file_sync", "input": input }))).await;
    let id = plan["plan_id"].as_str().unwrap().to_owned();
    poll_plan(&server, &id, |s| s == "awaiting_approval").await;
    let (status, plan) =
        server.call(Method::POST, &format!("/v1/plans/{id}/reject"), Some(json!({ "phase": "apply" }))).await;
    assert_eq!((status, plan["status"].as_str()), (200, Some("rejected")), "{plan}");
    assert_eq!(plan["apply"]["job"]["error_kind"], "rejected");
    assert!(records.changes().is_empty(), "a rejected plan changes nothing");
    assert_eq!(records.now().len(), 1);
}

#[tokio::test]
async fn cancelling_a_plan_while_apply_runs_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--cancel-grace", "1s"]);
    let records = Records::start(&[]).await;
    add_file_sync(&server, &records).await;
    // Its apply phase (auto) hangs on the store's answer until the plan is
    // cancelled.
    let input = json!({ "store": records.url(), "desired": { "slow": "x" } });
    let (status, plan) = server
        .call(Method::POST, "/v1/plans", Some(json!({ "plugin": "file_sync", "input": input, "apply": "auto" })))
        .await;
    assert_eq!(status, 201, "{plan}");
    let id = plan["plan_id"].as_str().unwrap().to_owned();
    let plan = poll_plan(&server, &id, |s| s != "planning").await;
    assert_eq!(plan["status"], "applying", "{plan}");
    eventually("apply reaches the store", async || (!records.changes().is_empty()).then_some(())).await;
    let (status, plan) = server.call(Method::POST, &format!("/v1/plans/{id}/cancel"), None).await;
    assert_eq!(status, 200, "{plan}");
    let plan = poll_plan(&server, &id, |s| s != "applying").await;
    assert_eq!(plan["status"], "cancelled", "{plan}");
    assert_eq!(plan["apply"]["job"]["error_kind"], "cancelled");
    assert!(plan["cancelled_at"].is_string());
}

// Multi-threaded: the CLI blocks this thread while the record store
// upstream, on this runtime, answers the plan's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_from_the_cli_shows_the_diff_to_approve() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[("a", "1")]).await;
    add_file_sync(&server, &records).await;
    let input = dir.path().join("plan.json");
    std::fs::write(&input, json!({ "store": records.url(), "desired": { "b": "2" } }).to_string()).unwrap();
    let submitted =
        leash(&server, &["plan", "submit", "file_sync", "--input", input.to_str().unwrap(), "--wait", "30s"]);
    let shown = String::from_utf8_lossy(&submitted.stdout).into_owned();
    assert_eq!(submitted.status.code(), Some(0), "{shown}\n{}", String::from_utf8_lossy(&submitted.stderr));
    assert!(shown.contains("awaiting_approval"), "{shown}");
    assert!(shown.contains(r#""op":"put","key":"b","value":"2""#), "the diff is shown: {shown}");
    let id = shown.split_whitespace().nth(1).unwrap().to_owned();
    assert!(shown.contains(&format!("leash plan approve {id} --phase apply")), "the hint names the phase: {shown}");
    let alice = server.principal("alice", &["approve"]).await;
    let approved = leash_as(&server, &alice, &["plan", "approve", &id, "--phase", "apply"]);
    assert_eq!(approved.status.code(), Some(0), "{}", String::from_utf8_lossy(&approved.stderr));
    poll_plan(&server, &id, |s| s == "applied").await;
    let listed = leash(&server, &["plan", "list"]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.contains(&id) && listed.contains("applied") && listed.contains("alice"), "{listed}");
    assert_eq!(records.changes(), ["PUT b=2", "DELETE a"]);
    let again = leash_as(&server, &alice, &["plan", "approve", &id, "--phase", "apply"]);
    assert_eq!(again.status.code(), Some(7), "nothing waits: refused");
}

/// A decision names the phase it decides: resent, an approval of a gated
/// execute phase is refused, and never approves the apply phase that
/// followed it (which nobody has reviewed); a decision without a phase is
/// refused, naming the field.
#[tokio::test]
async fn a_resent_approval_of_execute_never_approves_the_apply_phase() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[("a", "1")]).await;
    add_file_sync(&server, &records).await;
    let policy = json!({ "require": ["execute", "apply"] });
    let (status, answer) = server.call(Method::PUT, "/v1/plugins/file_sync@0.0.0/approval", Some(policy)).await;
    assert_eq!(status, 200, "{answer}");
    let input = json!({ "store": records.url(), "desired": { "b": "2" } });
    let (status, plan) =
        server.call(Method::POST, "/v1/plans", Some(json!({ "plugin": "file_sync@0.0.0", "input": input }))).await;
    assert_eq!(status, 201, "{plan}");
    let id = plan["plan_id"].as_str().unwrap().to_owned();
    assert_eq!(plan["status"], "awaiting_approval", "execute waits: {plan}");

    let path = format!("/v1/plans/{id}/approve");
    let alice = server.principal("alice", &["approve"]).await;
    let (status, answer) = server.call_as(&alice, Method::POST, &path, Some(json!({}))).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_request"), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("phase"), "{answer}");
    let (status, answer) = server.call_as(&alice, Method::POST, &path, Some(json!({ "phase": "apply" }))).await;
    assert_eq!((status, error_kind(&answer)), (409, "not_gated"), "no apply phase yet: {answer}");

    let execute = json!({ "phase": "execute" });
    let (status, answer) = server.call_as(&alice, Method::POST, &path, Some(execute.clone())).await;
    assert_eq!(status, 200, "{answer}");
    let plan = poll_plan(&server, &id, |s| s == "awaiting_approval" || s == "failed").await;
    assert_eq!(plan["apply"]["job"]["status"], "pending_approval", "{plan}");
    let (status, answer) = server.call_as(&alice, Method::POST, &path, Some(execute)).await;
    assert_eq!((status, error_kind(&answer)), (409, "already_terminal"), "execute ran: {answer}");
    // The phase named by its job's id instead: the same rules.
    let execute_id = plan["execute"]["job"]["id"].clone();
    let (status, answer) = server.call_as(&alice, Method::POST, &path, Some(json!({ "job_id": execute_id }))).await;
    assert_eq!((status, error_kind(&answer)), (409, "already_terminal"), "{answer}");
    let stranger = json!({ "job_id": "01M8NXTW9W53S6M6JQYFF54HBH" });
    let (status, answer) = server.call_as(&alice, Method::POST, &path, Some(stranger)).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_job"), "not this plan's job: {answer}");
    let both = json!({ "phase": "apply", "job_id": execute_id });
    let (status, answer) = server.call_as(&alice, Method::POST, &path, Some(both)).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_request"), "one of the two: {answer}");
    let (_, plan) = server.call(Method::GET, &format!("/v1/plans/{id}"), None).await;
    assert_eq!(plan["apply"]["job"]["status"], "pending_approval", "apply still waits for its own review: {plan}");
    assert!(records.changes().is_empty(), "nothing applied: {:?}", records.changes());
}

/// `Idempotency-Key` on `POST /v1/plans`: the same request again answers
/// the plan it created (201, replayed) and creates nothing; another body
/// under the key is a conflict; a job's key and a plan's never collide.
#[tokio::test]
async fn a_plan_created_with_an_idempotency_key_is_created_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[("a", "1")]).await;
    add_file_sync(&server, &records).await;
    let send = |key: &'static str, body: Value| {
        server.request(Method::POST, "/v1/plans").header("Idempotency-Key", key).json(&body).send()
    };
    let body = json!({ "plugin": "file_sync", "input": { "store": records.url(), "desired": {} } });
    let first = send("plan-7", body.clone()).await.unwrap();
    assert_eq!(first.status().as_u16(), 201);
    let first: Value = first.json().await.unwrap();
    let again = send("plan-7", body.clone()).await.unwrap();
    assert_eq!(again.status().as_u16(), 201, "answered as the first time");
    assert_eq!(again.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["plan_id"], first["plan_id"], "the same plan: {again}");
    let other = send("plan-7", json!({ "plugin": "file_sync", "input": { "other": true } })).await.unwrap();
    assert_eq!(other.status().as_u16(), 409);
    let other: Value = other.json().await.unwrap();
    assert_eq!(error_kind(&other), "idempotency_conflict");
    assert!(other["error"]["message"].as_str().unwrap().contains("\"plan-7\""), "the key as sent: {other}");
    let (_, page) = server.call(Method::GET, "/v1/plans", None).await;
    assert_eq!(page["plans"].as_array().unwrap().len(), 1, "one plan: {page}");
    let job = server
        .request(Method::POST, "/v1/jobs")
        .header("Idempotency-Key", "plan-7")
        .json(&json!({ "plugin": "file_sync", "input": {}, "execution": "async" }))
        .send()
        .await
        .unwrap();
    assert_eq!(job.status().as_u16(), 202, "a job's key is its own: {}", job.text().await.unwrap());
}
