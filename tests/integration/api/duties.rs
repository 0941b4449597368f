//! Who may decide, against a real `leash serve`: a decision is recorded as
//! the principal whose token made it (a `by` naming anyone else is
//! refused), the submitter of a gated job may not approve it unless its
//! plugin's policy allows it, and a quorum takes that many distinct
//! approvers.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::server::{Server, is_terminal};

fn kind(answer: &Value) -> &str {
    answer["error"]["kind"].as_str().unwrap_or_else(|| panic!("not an error body: {answer}"))
}

/// Register `hello@1` gating `execute` with these duties.
pub(crate) async fn gated_hello(server: &Server, duties: Value) {
    let response = server
        .request(Method::POST, "/v1/plugins?name=hello&version=1")
        .body(leash_tests::plugin_bytes("hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let mut policy = json!({ "require": ["execute"] });
    policy.as_object_mut().unwrap().extend(duties.as_object().unwrap().clone());
    let (status, info) = server.call(Method::PUT, "/v1/plugins/hello@1/approval", Some(policy)).await;
    assert_eq!(status, 200, "{info}");
}

/// Submit a gated `hello@1` job as `token`'s principal; its id.
async fn submit_as(server: &Server, token: &str) -> String {
    let body = json!({ "plugin": "hello@1", "execution": "async" });
    let (status, answer) = server.call_as(token, Method::POST, "/v1/jobs", Some(body)).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("pending_approval")), "{answer}");
    answer["job_id"].as_str().unwrap().to_owned()
}

async fn approve(server: &Server, token: &str, id: &str, body: Value) -> (u16, Value) {
    server.call_as(token, Method::POST, &format!("/v1/jobs/{id}/approve"), Some(body)).await
}

#[tokio::test]
async fn a_decision_is_its_token_s_principal_s_and_no_body_names_another() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    gated_hello(&server, json!({})).await;
    let sam = server.principal("sam", &["submit"]).await;
    let alice = server.principal("alice", &["approve"]).await;
    let id = submit_as(&server, &sam).await;
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(job["submitted_by"], "sam", "{job}");
    let (status, answer) = approve(&server, &alice, &id, json!({ "by": "mallory" })).await;
    assert_eq!((status, kind(&answer)), (403, "impersonation"), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("alice"), "{answer}");
    // Naming itself is allowed (older clients send `by`).
    let (status, answer) = approve(&server, &alice, &id, json!({ "by": "alice", "comment": "ok" })).await;
    assert_eq!(status, 200, "{answer}");
    let done = server.poll_job(&id, is_terminal).await;
    assert_eq!(
        (done["status"].as_str(), done["approval"]["decision"]["by"].as_str()),
        (Some("succeeded"), Some("alice"))
    );
}

#[tokio::test]
async fn the_submitter_may_not_approve_its_own_job_unless_the_policy_lets_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    gated_hello(&server, json!({})).await;
    let sam = server.principal("sam", &["submit", "approve"]).await;
    let id = submit_as(&server, &sam).await;
    let waiting = submit_as(&server, &sam).await;
    let (status, answer) = approve(&server, &sam, &id, json!({})).await;
    assert_eq!((status, kind(&answer)), (403, "separation_of_duties"), "{answer}");
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(job["status"], "pending_approval", "nothing changed: {job}");
    // It may still reject its own job.
    let (status, answer) = server.call_as(&sam, Method::POST, &format!("/v1/jobs/{id}/reject"), Some(json!({}))).await;
    assert_eq!((status, answer["job"]["error_kind"].as_str()), (200, Some("rejected")), "{answer}");

    // The policy lets submitters approve: jobs gated from now on follow it.
    let policy = json!({ "require": ["execute"], "separate_approver": false });
    let (status, info) = server.call(Method::PUT, "/v1/plugins/hello@1/approval", Some(policy)).await;
    assert_eq!((status, &info["approval"]["separate_approver"]), (200, &json!(false)), "{info}");
    let id = submit_as(&server, &sam).await;
    let (status, answer) = approve(&server, &sam, &id, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    // A job gated before the change keeps the duties it was gated with.
    let (status, answer) = approve(&server, &sam, &waiting, json!({})).await;
    assert_eq!((status, kind(&answer)), (403, "separation_of_duties"), "{answer}");
    // A policy with a field it does not know is refused, not half-read.
    let typo = json!({ "require": ["execute"], "quorom": 2 });
    let (status, answer) = server.call(Method::PUT, "/v1/plugins/hello@1/approval", Some(typo)).await;
    assert_eq!((status, kind(&answer)), (400, "invalid_request"), "{answer}");
    let (status, answer) = server
        .call(Method::PUT, "/v1/plugins/hello@1/approval", Some(json!({ "require": ["execute"], "quorum": 11 })))
        .await;
    assert_eq!(status, 400, "{answer}");
}

#[tokio::test]
async fn a_quorum_of_two_takes_two_distinct_approvers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    gated_hello(&server, json!({ "quorum": 2 })).await;
    let alice = server.principal("alice", &["approve"]).await;
    let bob = server.principal("bob", &["approve"]).await;
    let id = submit_as(&server, &server.token).await;
    let path = format!("/v1/jobs/{id}/approve");
    let keyed = |token: &str| {
        server
            .http
            .post(format!("{}{path}", server.url))
            .bearer_auth(token)
            .header("Idempotency-Key", "a-1")
            .json(&json!({}))
    };
    let first = keyed(&alice).send().await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["job"]["status"], "pending_approval", "one of two: {first}");
    assert_eq!(first["job"]["approval"]["approvals"][0]["by"], "alice");
    // The same approval resent under its key is answered as made; sent
    // again without it, it is refused: each approver counts once.
    let again = keyed(&alice).send().await.unwrap();
    assert_eq!(again.status().as_u16(), 200, "a replay");
    let (status, answer) = approve(&server, &alice, &id, json!({})).await;
    assert_eq!((status, kind(&answer)), (403, "distinct_approvers"), "{answer}");
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(job["approval"]["approvals"].as_array().unwrap().len(), 1, "{job}");
    // The second approver's approval runs it.
    let (status, answer) = approve(&server, &bob, &id, json!({ "comment": "second" })).await;
    assert_eq!(status, 200, "{answer}");
    let done = server.poll_job(&id, is_terminal).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let approvers: Vec<&str> =
        done["approval"]["approvals"].as_array().unwrap().iter().map(|a| a["by"].as_str().unwrap()).collect();
    assert_eq!(approvers, ["alice", "bob"]);
    assert_eq!(done["approval"]["decision"]["by"], "bob");
    assert_eq!(done["approval"]["quorum"], 2);
}
