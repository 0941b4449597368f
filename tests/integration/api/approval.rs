//! Approval gates through the HTTP API and the CLI, against a real
//! `leash serve`: a gated job waits for a person, runs once approved, never
//! runs once rejected, and a policy the submitter tries to lower is
//! refused.

use std::process::Output;

use reqwest::Method;
use serde_json::{Value, json};

use crate::cli::ops::{leash, leash_as};
use crate::support::server::{Server, is_terminal};

fn error_kind(answer: &Value) -> &str {
    answer["error"]["kind"].as_str().unwrap_or_else(|| panic!("not an error body: {answer}"))
}

async fn submit(server: &Server, body: Value) -> (u16, Value) {
    server.call(Method::POST, "/v1/jobs", Some(body)).await
}

/// Submit a gated job; it must answer `pending_approval`, not `accepted`.
async fn submit_gated(server: &Server, body: Value) -> String {
    let (status, answer) = submit(server, body).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("pending_approval")), "{answer}");
    answer["job_id"].as_str().unwrap().to_owned()
}

/// Decide as principal `by` (made an approver here), with a comment; a
/// run is triggered with the server's token.
async fn decide(server: &Server, id: &str, what: &str, by: &str) -> (u16, Value) {
    let path = format!("/v1/jobs/{id}/{what}");
    if what == "run" {
        return server.call(Method::POST, &path, None).await;
    }
    let token = server.principal(by, &["approve"]).await;
    server.call_as(&token, Method::POST, &path, Some(json!({ "comment": format!("{by} looked") }))).await
}

#[tokio::test]
async fn a_gated_async_job_waits_for_approval_then_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let id = submit_gated(
        &server,
        json!({ "plugin": "hello", "input": { "name": "gate" }, "execution": "async", "gate": "approval" }),
    )
    .await;
    let job = server.poll_job(&id, |_| true).await;
    assert_eq!(job["status"], "pending_approval");
    assert_eq!(job["approval"]["required_by"], "request");
    assert_eq!(job["approval"]["execution"], "async");
    let (_, health) = server.call(Method::GET, "/v1/health", None).await;
    let counts = &health["health"]["counts"];
    assert_eq!((counts["pending_approval"].as_u64(), counts["queued"].as_u64()), (Some(1), Some(0)), "{health}");
    let (_, page) = server.call(Method::GET, "/v1/jobs?status=pending_approval", None).await;
    assert_eq!(page["jobs"][0]["id"], id.as_str());

    let (status, answer) = decide(&server, &id, "approve", "alice").await;
    assert_eq!(status, 200, "{answer}");
    assert!(matches!(answer["job"]["status"].as_str(), Some("queued" | "running" | "succeeded")), "{answer}");
    let done = server.poll_job(&id, is_terminal).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["approval"]["decision"]["by"], "alice");
    assert_eq!(done["approval"]["decision"]["comment"], "alice looked");
    assert_eq!(done["approval"]["decision"]["verdict"], "approved");

    let (status, answer) = decide(&server, &id, "approve", "bob").await;
    assert_eq!((status, error_kind(&answer)), (409, "already_terminal"), "approving a finished job");
    let (status, answer) = decide(&server, "01M8NXTW9W53S6M6JQYFF54HBH", "approve", "bob").await;
    assert_eq!((status, error_kind(&answer)), (404, "not_found"));
}

#[tokio::test]
async fn a_gated_sync_call_answers_at_once_and_its_approval_answers_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let id = submit_gated(&server, json!({ "plugin": "hello", "input": { "name": "sync" }, "gate": "approval" })).await;
    let job = server.poll_job(&id, |_| true).await;
    assert_eq!(job["status"], "pending_approval", "a sync call does not wait for a person");
    assert_eq!(job["approval"]["execution"], "sync", "the mode asked for is stamped");
    assert!(job["deadline_at"].is_null(), "its deadline counts from the trigger");
    // The approval triggers the run; stamped sync, it answers the outcome.
    let (status, answer) = decide(&server, &id, "approve", "alice").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["job"]["status"], "succeeded", "{answer}");
    assert_eq!(answer["output"]["greeting"], "Hello, sync!");
}

#[tokio::test]
async fn a_held_approval_waits_for_run_and_two_approvals_race_to_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let body = json!({ "plugin": "hello", "execution": "async", "gate": "approval", "run_on_approve": false });
    let id = submit_gated(&server, body.clone()).await;
    let (status, answer) = decide(&server, &id, "run", "-").await;
    assert_eq!((status, error_kind(&answer)), (409, "not_approved"));
    // Approvals racing: exactly one wins.
    let (a, b) = tokio::join!(decide(&server, &id, "approve", "alice"), decide(&server, &id, "approve", "bob"));
    let mut codes = [a.0, b.0];
    codes.sort();
    assert_eq!(codes, [200, 409], "{a:?} {b:?}");
    let loser = if a.0 == 409 { &a.1 } else { &b.1 };
    assert_eq!(error_kind(loser), "already_decided");
    let job = server.poll_job(&id, |_| true).await;
    assert_eq!(job["status"], "approved", "held until its run is triggered");
    let (status, answer) = decide(&server, &id, "run", "-").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(server.poll_job(&id, is_terminal).await["status"], "succeeded");
    let (status, answer) = decide(&server, &id, "run", "-").await;
    assert_eq!((status, error_kind(&answer)), (409, "already_terminal"));

    // `run_on_approve` without a gate is refused before anything is queued.
    let (status, answer) =
        submit(&server, json!({ "plugin": "hello", "execution": "async", "run_on_approve": false })).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_job"), "{answer}");
}

#[tokio::test]
async fn a_rejected_job_is_cancelled_and_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let id = submit_gated(&server, json!({ "plugin": "hello", "execution": "async", "gate": "approval" })).await;
    let (status, answer) = decide(&server, &id, "reject", "carol").await;
    assert_eq!(status, 200, "{answer}");
    let job = &answer["job"];
    assert_eq!((job["status"].as_str(), job["error_kind"].as_str()), (Some("cancelled"), Some("rejected")));
    assert_eq!(job["error_message"], "Rejected: by carol: carol looked");
    assert_eq!(job["attempt"], 0, "it never ran");
    let (status, answer) = decide(&server, &id, "approve", "alice").await;
    assert_eq!((status, error_kind(&answer)), (409, "already_terminal"), "approving a rejected job");
    // A job waiting for approval is cancelled at once.
    let other = submit_gated(&server, json!({ "plugin": "hello", "execution": "async", "gate": "approval" })).await;
    let (status, answer) = server.call(Method::POST, &format!("/v1/jobs/{other}/cancel"), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")));
}

#[tokio::test]
async fn an_operator_policy_gates_jobs_and_a_submitter_cannot_lower_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let response = server
        .request(Method::POST, "/v1/plugins?name=hello&version=1&require_approval=execute,action:deploy")
        .body(leash_tests::plugin_bytes("hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let info: Value = response.json().await.unwrap();
    assert_eq!(info["approval"]["require"], json!(["execute", "action:deploy"]));

    // Gated by policy with no gate asked for, sync or async.
    let id = submit_gated(&server, json!({ "plugin": "hello", "execution": "async" })).await;
    assert_eq!(server.poll_job(&id, |_| true).await["approval"]["required_by"], "policy");
    submit_gated(&server, json!({ "plugin": "hello@1" })).await;
    // A submit that asks for no gate is refused, and nothing is queued.
    let (status, answer) = submit(&server, json!({ "plugin": "hello", "gate": "none" })).await;
    assert_eq!((status, error_kind(&answer)), (403, "approval_required"), "{answer}");
    let (_, page) = server.call(Method::GET, "/v1/jobs", None).await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2, "the refused submit queued nothing");
    // A target the policy does not name runs at once.
    let (status, answer) = submit(&server, json!({ "plugin": "hello", "phase": "apply", "execution": "async" })).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("accepted")), "{answer}");

    // The operator lowers the policy: later submits run at once.
    let (status, info) = server.call(Method::PUT, "/v1/plugins/hello@1/approval", Some(json!({ "require": [] }))).await;
    assert_eq!(status, 200, "{info}");
    assert!(info.get("approval").is_none(), "no policy left: {info}");
    let (status, answer) = submit(&server, json!({ "plugin": "hello", "execution": "async", "gate": "none" })).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("accepted")), "{answer}");
    // Bad policies are refused by field.
    let (status, answer) =
        server.call(Method::PUT, "/v1/plugins/hello@1/approval", Some(json!({ "require": ["plan"] }))).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_request"), "{answer}");
    let (status, answer) =
        server.call(Method::PUT, "/v1/plugins/hello/approval", Some(json!({ "require": ["apply"] }))).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_request"), "a policy needs name@version: {answer}");
    let response = server
        .request(Method::POST, "/v1/plugins?require_approval=apply")
        .body(leash_tests::plugin_bytes("hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400, "a policy without a name");
}

fn said(output: &Output) -> String {
    format!("stdout: {}\nstderr: {}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[tokio::test]
async fn the_cli_gates_approves_rejects_and_refuses_a_lowered_policy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let hello = leash_tests::plugin_path("hello");
    let added = leash(&server, &["plugins", "add", hello.to_str().unwrap(), "--require-approval", "execute", "--json"]);
    assert_eq!(added.status.code(), Some(0), "{}", said(&added));
    let shown = leash(&server, &["plugins", "show", "hello"]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("execute"), "{}", said(&shown));

    let submitted = leash(&server, &["submit", "hello", "--json"]);
    assert_eq!(submitted.status.code(), Some(0), "{}", said(&submitted));
    let answer: Value = serde_json::from_slice(&submitted.stdout).unwrap();
    assert_eq!(answer["status"], "pending_approval");
    let id = answer["job_id"].as_str().unwrap().to_owned();

    let alice = server.principal("alice", &["approve"]).await;
    let own = leash(&server, &["jobs", "approve", &id]);
    assert_eq!(own.status.code(), Some(7), "the submitter may not approve: {}", said(&own));
    assert!(String::from_utf8_lossy(&own.stderr).contains("separation_of_duties"), "{}", said(&own));
    let approved = leash_as(&server, &alice, &["jobs", "approve", &id, "--comment", "fine"]);
    assert_eq!(approved.status.code(), Some(0), "{}", said(&approved));
    assert!(String::from_utf8_lossy(&approved.stdout).starts_with(&id), "{}", said(&approved));
    assert!(String::from_utf8_lossy(&approved.stdout).contains("approved by alice"), "{}", said(&approved));
    let waited = leash(&server, &["jobs", "wait", &id, "--timeout", "30s", "--json"]);
    let done: Value = serde_json::from_slice(&waited.stdout).unwrap();
    assert_eq!(done["job"]["status"], "succeeded", "{}", said(&waited));
    assert_eq!(done["job"]["approval"]["decision"]["by"], "alice");
    let bob = server.principal("bob", &["approve"]).await;
    let twice = leash_as(&server, &bob, &["jobs", "approve", &id]);
    assert_eq!(twice.status.code(), Some(7), "a refused decision exits 7: {}", said(&twice));

    let other = leash(&server, &["submit", "hello"]);
    let other_id = String::from_utf8_lossy(&other.stdout).trim().to_owned();
    let rejected = leash(&server, &["jobs", "reject", &other_id, "--json"]);
    let answer: Value = serde_json::from_slice(&rejected.stdout).unwrap();
    assert_eq!(answer["job"]["error_kind"], "rejected", "{}", said(&rejected));

    let lowered = leash(&server, &["submit", "hello", "--gate", "none"]);
    assert_eq!(lowered.status.code(), Some(7), "{}", said(&lowered));
    assert!(String::from_utf8_lossy(&lowered.stderr).contains("approval policy"), "{}", said(&lowered));

    let cleared = leash(&server, &["plugins", "approval", "hello@0.0.0"]);
    assert_eq!(cleared.status.code(), Some(0), "{}", said(&cleared));
    let ungated = leash(&server, &["submit", "hello", "--wait", "30s"]);
    assert_eq!(ungated.status.code(), Some(0), "{}", said(&ungated));
}

/// A decision sent again under its `Idempotency-Key` (a client retrying
/// after a lost answer) is answered as made; without the key, by someone
/// else, or as the other verdict it is refused as already decided.
#[tokio::test]
async fn a_decision_resent_under_its_key_is_answered_as_made() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let body = json!({ "plugin": "hello", "execution": "async", "gate": "approval", "run_on_approve": false });
    let id = submit_gated(&server, body).await;
    let tokens = [
        ("alice", server.principal("alice", &["approve"]).await),
        ("bob", server.principal("bob", &["approve"]).await),
    ];
    let send = |what: &str, by: &str, key: Option<&str>| {
        let token = &tokens.iter().find(|(name, _)| *name == by).unwrap().1;
        let url = format!("{}/v1/jobs/{id}/{what}", server.url);
        let mut request = server.http.post(url).bearer_auth(token).json(&json!({}));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, first) = send("approve", "alice", Some("decide-1")).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["job"]["status"], "approved");
    let (status, again) = send("approve", "alice", Some("decide-1")).await;
    assert_eq!(status, 200, "the resend is answered as made: {again}");
    assert_eq!(again["job"]["approval"]["decision"], first["job"]["approval"]["decision"], "one decision");
    for (what, by, key) in
        [("approve", "alice", None), ("approve", "bob", Some("decide-1")), ("reject", "alice", Some("decide-1"))]
    {
        let (status, answer) = send(what, by, key).await;
        assert_eq!((status, error_kind(&answer)), (409, "already_decided"), "{what} by {by} with {key:?}: {answer}");
    }
    let long = "k".repeat(256);
    let (status, answer) = send("approve", "alice", Some(&long)).await;
    assert_eq!((status, error_kind(&answer)), (400, "invalid_request"), "{answer}");
}
