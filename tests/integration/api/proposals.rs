//! The plan fence through a real `leash serve`: a plan's execute phase
//! sends no effect and proposes them instead, each checked against the
//! grant; the approver sees the proposals and approves them by their
//! binding digest; the apply phase sends exactly those, each once, even
//! across a kill and a re-run.

use reqwest::Method;
use serde_json::{Value, json};

use crate::api::plans::{Records, error_kind, poll_plan};
use crate::support::eventually;
use crate::support::server::Server;

/// Register `plan-probe`, granted `methods` on `records`.
async fn add_probe(server: &Server, records: &Records, methods: &str) {
    server.add_plugin("plan-probe").await;
    grant(server, records, methods).await;
}

/// Grant the registered `plan-probe` `methods` on `records`, and nothing
/// else.
async fn grant(server: &Server, records: &Records, methods: &str) {
    let grants = json!({ "http": { "hosts": [format!("{methods} http://{}", records.addr)],
                                   "private_ranges": ["127.0.0.0/8"] } });
    let (status, answer) = server.call(Method::PUT, "/v1/plugins/plan_probe@0.0.0/grants", Some(grants)).await;
    assert_eq!(status, 200, "{answer}");
}

/// Submit a plan of `plan-probe` with `input` (and `extra` fields).
async fn submit(server: &Server, input: Value, extra: Value) -> String {
    let mut body = json!({ "plugin": "plan_probe", "input": input });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (status, plan) = server.call(Method::POST, "/v1/plans", Some(body)).await;
    assert_eq!(status, 201, "{plan}");
    plan["plan_id"].as_str().unwrap().to_owned()
}

fn write(method: &str, records: &Records, key: &str, body: &str) -> Value {
    json!({ "method": method, "url": format!("{}/{key}", records.url()), "body": body })
}

async fn logs(server: &Server, job: &str) -> String {
    let (status, logs) = server.call(Method::GET, &format!("/v1/jobs/{job}/logs"), None).await;
    assert_eq!(status, 200, "{logs}");
    logs.to_string()
}

#[tokio::test]
async fn an_execute_phase_that_writes_is_refused_and_nothing_reaches_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[]).await;
    add_probe(&server, &records, "GET,PUT,POST,DELETE").await;
    let input = json!({ "writes": [write("POST", &records, "a", "1")], "execute": "post" });
    let id = submit(&server, input, json!({})).await;
    let plan = poll_plan(&server, &id, |s| s != "planning").await;
    assert_eq!(plan["status"], "awaiting_approval", "{plan}");
    assert_eq!(plan["execute"]["output"]["sent"], json!(["HTTP-request-denied"]), "the guest was refused: {plan}");
    assert!(records.changes().is_empty(), "nothing reached the upstream: {:?}", records.changes());
    let execute = plan["execute"]["job"]["id"].as_str().unwrap();
    let logged = logs(&server, execute).await;
    assert!(logged.contains("effects are not allowed in the execute phase; propose them"), "{logged}");
    assert_eq!(plan["effects"]["proposals"], json!([]), "it proposed nothing: {plan}");
}

#[tokio::test]
async fn a_proposal_the_grant_refuses_fails_the_execute_phase_even_if_the_guest_ignores_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[]).await;
    add_probe(&server, &records, "GET,PUT").await;
    for execute in ["propose", "propose_quietly"] {
        let writes = [write("PUT", &records, "a", "1"), write("POST", &records, "b", "2")];
        let id = submit(&server, json!({ "writes": writes, "execute": execute }), json!({})).await;
        let plan = poll_plan(&server, &id, |s| s != "planning").await;
        assert_eq!(plan["status"], "failed", "{execute}: {plan}");
        let message = plan["execute"]["job"]["error_message"].as_str().unwrap();
        assert!(message.contains("not granted") && message.contains("POST"), "{execute}: {message}");
        assert!(plan["apply"].is_null(), "no apply phase: {plan}");
    }
    assert!(records.changes().is_empty());
}

#[tokio::test]
async fn apply_sends_exactly_the_approved_proposals_once_and_refuses_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[("c", "old")]).await;
    add_probe(&server, &records, "GET,PUT,DELETE").await;
    let writes =
        [write("PUT", &records, "a", "1"), write("PUT", &records, "b", "2"), write("DELETE", &records, "c", "")];
    let id = submit(&server, json!({ "writes": writes, "apply": "tamper" }), json!({})).await;
    let plan = poll_plan(&server, &id, |s| s != "planning").await;
    assert_eq!(plan["status"], "awaiting_approval", "{plan}");

    // The approver sees each write: method, URL, body, its digest.
    let effects = &plan["effects"];
    let proposals = effects["proposals"].as_array().unwrap();
    assert_eq!(proposals.len(), 3, "{effects}");
    assert_eq!(proposals[0]["method"], "PUT");
    assert_eq!(proposals[0]["url"], format!("{}/a", records.url()));
    assert_eq!(proposals[0]["body_text"], "1");
    assert_eq!(proposals[0]["body_bytes"], 1);
    assert!(proposals[0]["body_sha256"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(proposals[2]["method"], "DELETE");
    assert!(proposals.iter().all(|p| p["state"] == "not_sent"), "{effects}");
    let digest = effects["binding_digest"].as_str().unwrap().to_owned();

    // An approval of something else than what is shown is refused.
    let alice = server.principal("alice", &["approve"]).await;
    let path = format!("/v1/plans/{id}/approve");
    let stale = json!({ "phase": "apply", "digest": format!("sha256:{}", "0".repeat(64)) });
    let (status, answer) = server.call_as(&alice, Method::POST, &path, Some(stale)).await;
    assert_eq!((status, error_kind(&answer)), (409, "plan_changed"), "{answer}");
    let (_, plan) = server.call(Method::GET, &format!("/v1/plans/{id}"), None).await;
    assert_eq!(plan["status"], "awaiting_approval", "a refused approval approves nothing");

    let (status, approved) =
        server.call_as(&alice, Method::POST, &path, Some(json!({ "phase": "apply", "digest": digest }))).await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["approved_digest"], digest.as_str());
    let plan = poll_plan(&server, &id, |s| s != "applying" && s != "awaiting_approval").await;
    assert_eq!(plan["status"], "applied", "{plan}");
    // Every altered request was refused before it was sent; the upstream
    // saw exactly the proposals, in order, each with its own key.
    assert_eq!(
        plan["apply"]["output"]["tampered"],
        json!(["HTTP-request-denied", "HTTP-request-denied", "HTTP-request-denied"]),
        "{plan}"
    );
    assert_eq!(plan["apply"]["output"]["applied"], 3);
    let apply = plan["apply"]["job"]["id"].as_str().unwrap().to_owned();
    let expected: Vec<(String, Option<String>)> = ["PUT a=1", "PUT b=2", "DELETE c"]
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), Some(format!("{apply}/proposal/{}", i + 1))))
        .collect();
    assert_eq!(records.keyed(), expected);
    let effects = &plan["effects"];
    assert_eq!((effects["sent"].as_u64(), effects["not_sent"].as_u64()), (Some(3), Some(0)), "{effects}");
    assert_eq!(effects["refused"], 3, "the report counts the refused requests: {effects}");
    assert!(effects["proposals"].as_array().unwrap().iter().all(|p| p["state"] == "sent" && p["status"] == 200));
    let logged = logs(&server, &apply).await;
    assert!(logged.contains("not an approved proposal"), "{logged}");
    assert!(logged.contains("apply sent 3 of 3 approved proposals; 3 request(s) refused as not proposed"), "{logged}");
}

#[tokio::test]
async fn an_apply_that_skips_approved_proposals_fails_with_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[]).await;
    add_probe(&server, &records, "GET,PUT").await;
    let writes = [write("PUT", &records, "a", "1"), write("PUT", &records, "b", "2")];
    let id = submit(&server, json!({ "writes": writes, "apply": "first" }), json!({ "apply": "auto" })).await;
    let plan = poll_plan(&server, &id, |s| s != "planning" && s != "applying").await;
    assert_eq!(plan["status"], "failed", "{plan}");
    let message = plan["apply"]["job"]["error_message"].as_str().unwrap();
    assert!(message.contains("without sending every approved proposal") && message.contains("#2 PUT"), "{message}");
    assert_eq!(records.changes(), ["PUT a=1"]);
    assert_eq!((plan["effects"]["sent"].as_u64(), plan["effects"]["not_sent"].as_u64()), (Some(1), Some(1)));
}

/// A grant taken back between the approval and the apply's run: the one
/// worker slot is held by a sleeping job while the plan is approved and
/// the grant narrowed; once the slot frees, the apply phase is refused
/// before its guest starts, and nothing is sent.
#[tokio::test]
async fn a_grant_revoked_between_approval_and_apply_refuses_the_apply_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "1"]);
    let records = Records::start(&[]).await;
    add_probe(&server, &records, "GET,PUT,DELETE").await;
    server.add_plugin("sleep").await;
    let writes = [write("PUT", &records, "a", "1"), write("DELETE", &records, "b", "")];
    let id = submit(&server, json!({ "writes": writes }), json!({})).await;
    poll_plan(&server, &id, |s| s == "awaiting_approval").await;
    let (status, blocker) = server
        .call(Method::POST, "/v1/jobs", Some(json!({ "plugin": "sleep", "input": {}, "execution": "async" })))
        .await;
    assert_eq!(status, 202, "{blocker}");
    let blocker = blocker["job_id"].as_str().unwrap().to_owned();
    server.poll_job(&blocker, |j| j["status"] == "running").await;

    let alice = server.principal("alice", &["approve"]).await;
    let (status, answer) = server
        .call_as(&alice, Method::POST, &format!("/v1/plans/{id}/approve"), Some(json!({ "phase": "apply" })))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["apply"]["job"]["status"], "queued", "approved, waiting for the slot: {answer}");
    // The operator takes DELETE back before the apply phase runs.
    grant(&server, &records, "GET,PUT").await;
    let (status, answer) = server.call(Method::POST, &format!("/v1/jobs/{blocker}/cancel"), None).await;
    assert_eq!(status, 202, "{answer}");

    let plan = poll_plan(&server, &id, |s| s != "applying" && s != "awaiting_approval").await;
    assert_eq!(plan["status"], "failed", "{plan}");
    assert_eq!(plan["apply"]["job"]["error_kind"], "denied", "{plan}");
    let message = plan["apply"]["job"]["error_message"].as_str().unwrap();
    assert!(message.contains("#2 DELETE") && message.contains("no longer granted"), "{message}");
    assert!(message.contains("nothing was sent"), "{message}");
    assert!(records.changes().is_empty(), "not even the still-granted PUT: {:?}", records.changes());
}

#[tokio::test]
async fn a_proposal_is_sent_at_most_once_across_a_kill_and_a_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let flags = ["--lease-ttl", "1s"];
    let mut server = Server::start(&db, &flags);
    let records = Records::start(&[]).await;
    add_probe(&server, &records, "GET,PUT").await;
    // The store never answers the first PUT of `slow`: the process is
    // killed while that request is in flight.
    let writes =
        [write("PUT", &records, "a", "1"), write("PUT", &records, "slow", "x"), write("PUT", &records, "b", "2")];
    let id = submit(&server, json!({ "writes": writes }), json!({ "apply": "auto", "max_attempts": 3 })).await;
    eventually("apply's second write reaches the store", async || {
        records.changes().iter().any(|c| c == "PUT slow=x").then_some(())
    })
    .await;
    server.kill();

    let server = Server::start(&db, &flags);
    let plan = poll_plan(&server, &id, |s| s != "applying").await;
    assert_eq!(plan["status"], "applied", "{plan}");
    let apply = plan["apply"]["job"]["id"].as_str().unwrap().to_owned();
    let key = |n: u32| Some(format!("{apply}/proposal/{n}"));
    // The answered write is never sent again; the one in doubt is sent
    // again under the same key (the store applies it once); the rest once.
    assert_eq!(
        records.keyed(),
        [
            ("PUT a=1".to_owned(), key(1)),
            ("PUT slow=x".to_owned(), key(2)),
            ("PUT slow=x".to_owned(), key(2)),
            ("PUT b=2".to_owned(), key(3)),
        ]
    );
    assert_eq!(records.now().len(), 3);
    let (_, ledger) = server.call(Method::GET, &format!("/v1/jobs/{apply}/effects"), None).await;
    let effects = ledger["effects"].as_array().unwrap();
    let of = |n: u64| effects.iter().filter(|e| e["proposal"] == n).count();
    assert_eq!((of(1), of(2), of(3)), (1, 2, 1), "{ledger}");
    assert!(effects.iter().filter(|e| e["proposal"] == 2).any(|e| e["status"].is_null()), "the first is in doubt");
}

/// The grant's private range taken back: a proposal to a name that
/// resolves into it is refused at the apply's start, though its host rule
/// still stands.
#[tokio::test]
async fn a_private_range_taken_back_refuses_an_apply_to_a_name_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let records = Records::start(&[]).await;
    server.add_plugin("plan-probe").await;
    let port = records.addr.port();
    let to_localhost = |ranges: Value| json!({ "http": { "hosts": [format!("GET,PUT http://localhost:{port}")], "private_ranges": ranges } });
    let path = "/v1/plugins/plan_probe@0.0.0/grants";
    let (status, answer) = server.call(Method::PUT, path, Some(to_localhost(json!(["127.0.0.0/8", "::1/128"])))).await;
    assert_eq!(status, 200, "{answer}");
    let writes = [json!({ "method": "PUT", "url": format!("http://localhost:{port}/records/a"), "body": "1" })];
    let id = submit(&server, json!({ "writes": writes }), json!({})).await;
    let plan = poll_plan(&server, &id, |s| s != "planning").await;
    assert_eq!(plan["status"], "awaiting_approval", "the name resolves into a granted range: {plan}");
    let (status, answer) = server.call(Method::PUT, path, Some(to_localhost(json!([])))).await;
    assert_eq!(status, 200, "{answer}");
    let alice = server.principal("alice", &["approve"]).await;
    let (status, answer) = server
        .call_as(&alice, Method::POST, &format!("/v1/plans/{id}/approve"), Some(json!({ "phase": "apply" })))
        .await;
    assert_eq!(status, 200, "{answer}");
    let plan = poll_plan(&server, &id, |s| s != "applying" && s != "awaiting_approval").await;
    assert_eq!(plan["apply"]["job"]["error_kind"], "denied", "{plan}");
    let message = plan["apply"]["job"]["error_message"].as_str().unwrap();
    assert!(message.contains("private address") && message.contains("nothing was sent"), "{message}");
    assert!(records.changes().is_empty());
}
