//! "Allow & Remember" against a real `leash serve`: an approval that
//! remembers makes a standing rule; the rule approves the jobs already
//! waiting that match it exactly (bytes, target, grants, input, submitter)
//! and matching jobs as they arrive, each decision recorded as the rule's in
//! its author's name, in the audit trail too; it keeps the job's duties,
//! and it stops at once when revoked or when its author loses `approve`.
//! On SQLite, and on PostgreSQL with two replicas.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::server::Server;

const HOUR_MS: u64 = 3_600_000;

fn kind(answer: &Value) -> &str {
    answer["error"]["kind"].as_str().unwrap_or_else(|| panic!("not an error body: {answer}"))
}

/// Register `hello@1` gating `execute` (duties separated, quorum 1).
async fn gated_hello(server: &Server) {
    crate::api::duties::gated_hello(server, json!({})).await;
}

/// Submit a `hello@1` job with `input` as `token`'s principal; its id and
/// the state it was stored in.
async fn submit(server: &Server, token: &str, input: Value) -> (String, String) {
    let body = json!({ "plugin": "hello@1", "execution": "async", "input": input });
    let (status, answer) = server.call_as(token, Method::POST, "/v1/jobs", Some(body)).await;
    assert_eq!(status, 202, "{answer}");
    (answer["job_id"].as_str().unwrap().to_owned(), answer["status"].as_str().unwrap().to_owned())
}

async fn job(server: &Server, id: &str) -> Value {
    server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await.1
}

/// The approvals a job holds: (by, rule, remembered).
fn approvals(job: &Value) -> Vec<(String, Option<String>, Option<String>)> {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    job["approval"]["approvals"]
        .as_array()
        .unwrap_or_else(|| panic!("no approvals: {job}"))
        .iter()
        .map(|a| (a["by"].as_str().unwrap().to_owned(), text(&a["rule"]), text(&a["remembered"])))
        .collect()
}

fn remembering(ttl_ms: u64, any_submitter: bool) -> Value {
    json!({ "comment": "routine", "remember": { "ttl_ms": ttl_ms, "any_submitter": any_submitter } })
}

async fn remembered_rule(server: &Server, approver: &str, id: &str, any_submitter: bool) -> String {
    let path = format!("/v1/jobs/{id}/approve");
    let (status, answer) =
        server.call_as(approver, Method::POST, &path, Some(remembering(HOUR_MS, any_submitter))).await;
    assert_eq!(status, 200, "{answer}");
    let approved = approvals(&answer["job"]);
    assert_eq!(approved.len(), 1, "{answer}");
    approved[0].2.clone().unwrap_or_else(|| panic!("the approval names the rule it made: {answer}"))
}

/// The whole story on one server (or two replicas of one database): `a`
/// serves the approver, `b` everyone else.
async fn a_remembered_approval_cascades_and_approves_on_arrival(a: &Server, b: &Server) {
    gated_hello(a).await;
    let sam = a.principal("sam", &["submit"]).await;
    let sue = a.principal("sue", &["submit"]).await;
    let alice = a.principal("alice", &["approve"]).await;
    let bob = a.principal("bob", &["approve"]).await;

    // Waiting before the rule: one it decides on, a twin (same input, same
    // submitter), and three that differ in one thing each.
    let (first, _) = submit(b, &sam, json!({ "name": "ada" })).await;
    let (twin, _) = submit(b, &sam, json!({ "name": "ada" })).await;
    let (other_input, _) = submit(b, &sam, json!({ "name": "bob" })).await;
    let (other_submitter, _) = submit(b, &sue, json!({ "name": "ada" })).await;

    let rule = remembered_rule(a, &alice, &first, false).await;
    // The twin was approved by the rule, in alice's name; the others wait.
    let twin_job = job(b, &twin).await;
    assert_ne!(twin_job["status"], "pending_approval", "{twin_job}");
    assert_eq!(approvals(&twin_job), [("alice".to_owned(), Some(rule.clone()), None)], "{twin_job}");
    for id in [&other_input, &other_submitter] {
        assert_eq!(job(b, id).await["status"], "pending_approval", "a job unlike the rule's waits: {id}");
    }

    // Arriving while it stands: the same again is approved on arrival (on
    // the other replica too); a different input waits.
    let (arrived, status) = submit(b, &sam, json!({ "name": "ada" })).await;
    assert_eq!(status, "accepted", "approved on arrival");
    assert_eq!(approvals(&job(b, &arrived).await)[0].1.as_deref(), Some(rule.as_str()));
    let (_, status) = submit(b, &sam, json!({ "name": "eve" })).await;
    assert_eq!(status, "pending_approval");

    let (status, shown) = b.call_as(&bob, Method::GET, &format!("/v1/rules/{rule}"), None).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!((shown["author"].as_str(), shown["submitter"].as_str()), (Some("alice"), Some("sam")), "{shown}");
    assert_eq!((shown["uses"].as_u64(), shown["from_job"].as_str()), (Some(2), Some(first.as_str())), "{shown}");

    // The audit trail names the rule and its author for each.
    let (_, trail) = a.call(Method::GET, &format!("/v1/audit?target={rule}"), None).await;
    let made = &trail["rows"][0];
    assert_eq!((made["action"].as_str(), made["principal"].as_str()), (Some("rule.create"), Some("alice")), "{trail}");
    for id in [&twin, &arrived] {
        let (_, trail) = a.call(Method::GET, &format!("/v1/audit?target={id}&action=job.approve"), None).await;
        let row = &trail["rows"][0];
        assert_eq!(row["principal"], "alice", "{trail}");
        let detail: Value = serde_json::from_str(row["detail"].as_str().unwrap()).unwrap();
        assert_eq!(detail["rule"], rule.as_str(), "{trail}");
    }

    // Only its author (or an admin) revokes it; revoked, it approves
    // nothing more, on either replica.
    let path = format!("/v1/rules/{rule}/revoke");
    let (status, answer) = b.call_as(&bob, Method::POST, &path, None).await;
    assert_eq!((status, kind(&answer)), (403, "forbidden"), "{answer}");
    let (status, answer) = b.call_as(&alice, Method::POST, &path, None).await;
    assert_eq!((status, answer["revoked_by"].as_str()), (200, Some("alice")), "{answer}");
    let (_, status) = submit(a, &sam, json!({ "name": "ada" })).await;
    assert_eq!(status, "pending_approval", "a revoked rule approves nothing");
    let (_, listed) = a.call_as(&bob, Method::GET, "/v1/rules?active=true", None).await;
    assert_eq!(listed["rules"], json!([]), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_approval_cascades_approves_on_arrival_and_stops_when_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    a_remembered_approval_cascades_and_approves_on_arrival(&server, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_approval_holds_across_two_postgres_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_schema, a, b)) = crate::support::server::two_postgres_replicas(dir.path()).await else { return };
    a_remembered_approval_cascades_and_approves_on_arrival(&a, &b).await;
}

/// A rule for any submitter still never approves its author's own
/// submission where duties are separated, and it stops the moment its
/// author loses `approve` (and works again if it is given back, until it
/// expires).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_keeps_the_job_s_duties_and_lives_no_longer_than_its_author_s_role() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    gated_hello(&server).await;
    let sam = server.principal("sam", &["submit"]).await;
    let alice = server.principal("alice", &["approve", "submit"]).await;
    let (first, _) = submit(&server, &sam, json!({})).await;
    let (own, _) = submit(&server, &alice, json!({})).await;
    let rule = remembered_rule(&server, &alice, &first, true).await;
    assert_eq!(job(&server, &own).await["status"], "pending_approval", "its author's own job still waits");
    let (_, status) = submit(&server, &alice, json!({})).await;
    assert_eq!(status, "pending_approval", "nor is its author's own approved on arrival");
    let (_, status) = submit(&server, &sam, json!({})).await;
    assert_eq!(status, "accepted", "any submitter's: sam's is");

    // alice may no longer approve: her rule approves nothing.
    let (status, _) = server.call(Method::PUT, "/v1/principals/alice", Some(json!({ "roles": ["submit"] }))).await;
    assert_eq!(status, 200);
    let (_, status) = submit(&server, &sam, json!({})).await;
    assert_eq!(status, "pending_approval", "a rule never outlives its author's approve role");
    let (status, _) =
        server.call(Method::PUT, "/v1/principals/alice", Some(json!({ "roles": ["submit", "approve"] }))).await;
    assert_eq!(status, 200);
    let (_, status) = submit(&server, &sam, json!({})).await;
    assert_eq!(status, "accepted", "given back, the rule (unexpired) approves again");
    let (_, shown) = server.call(Method::GET, &format!("/v1/rules/{rule}"), None).await;
    assert_eq!(shown["uses"], 2, "{shown}");
}

/// A remembered approval is checked: a TTL out of bounds, a rejection that
/// asks to be remembered, and unknown fields are refused and change
/// nothing; a rule id that is not one is `400`, an unknown one `404`; a
/// principal without `approve` may not read rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_remember_requests_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    gated_hello(&server).await;
    let sam = server.principal("sam", &["submit"]).await;
    let alice = server.principal("alice", &["approve"]).await;
    let (id, _) = submit(&server, &sam, json!({})).await;
    let approve = format!("/v1/jobs/{id}/approve");
    for (path, body) in [
        (approve.as_str(), remembering(1_000, false)),
        (approve.as_str(), remembering(91 * 24 * HOUR_MS, false)),
        (approve.as_str(), json!({ "remember": { "ttl_ms": HOUR_MS, "for": "everyone" } })),
        (&format!("/v1/jobs/{id}/reject"), remembering(HOUR_MS, false)),
    ] {
        let (status, answer) = server.call_as(&alice, Method::POST, path, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    assert_eq!(job(&server, &id).await["status"], "pending_approval");
    let (_, listed) = server.call(Method::GET, "/v1/rules", None).await;
    assert_eq!(listed["rules"], json!([]), "{listed}");
    let (status, _) = server.call(Method::GET, "/v1/rules/not-a-rule", None).await;
    assert_eq!(status, 400);
    let (status, _) = server.call(Method::GET, "/v1/rules/rule_01kbxyz0000000000000000000", None).await;
    assert_eq!(status, 404);
    let (status, answer) = server.call_as(&sam, Method::GET, "/v1/rules", None).await;
    assert_eq!((status, kind(&answer)), (403, "forbidden"), "{answer}");
}
