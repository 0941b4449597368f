//! Principals, roles and tokens against a real `leash serve`: every route
//! refused (403) to a principal without the role it needs and allowed to
//! one with it; tokens revoked, expired, or whose principal was removed
//! refused at once; the server's own token as the bootstrap admin.

use reqwest::Method;
use serde_json::{Value, json};

use crate::cli::ops::leash;
use crate::support::eventually;
use crate::support::server::{Server, leash_bin};

const FAKE_JOB: &str = "01M8NXTW9W53S6M6JQYFF54HBH";

/// A rule id no rule has.
const FAKE_RULE: &str = "rule_01kbxyz0000000000000000000";

#[tokio::test]
async fn each_route_is_refused_to_a_principal_without_its_role_and_allowed_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let roles = ["submit", "approve", "operate", "admin"];
    let mut tokens = Vec::new();
    for role in roles {
        tokens.push((role, server.principal(&format!("p-{role}"), &[role]).await));
    }
    let (_, me) = server.call_as(&tokens[0].1, Method::GET, "/v1/whoami", None).await;
    assert_eq!((me["name"].as_str(), &me["roles"]), (Some("p-submit"), &json!(["submit"])), "{me}");
    let (_, me) = server.call(Method::GET, "/v1/whoami", None).await;
    assert_eq!(me["name"], "admin", "the server's token is the bootstrap admin: {me}");

    let job = json!({ "plugin": "hello", "execution": "async", "gate": "approval" });
    let decision = json!({ "comment": "x" });
    // (method, path, body, the role it needs; None: any principal).
    let routes: Vec<(Method, String, Option<Value>, Option<&str>)> = vec![
        (Method::GET, "/v1/jobs".into(), None, None),
        (Method::GET, format!("/v1/jobs/{FAKE_JOB}"), None, None),
        (Method::GET, format!("/v1/jobs/{FAKE_JOB}/why"), None, None),
        (Method::GET, "/v1/plans".into(), None, None),
        (Method::GET, "/v1/plugins".into(), None, None),
        (Method::GET, "/v1/health".into(), None, None),
        (Method::GET, "/v1/openapi.json".into(), None, None),
        (Method::POST, "/v1/jobs".into(), Some(job.clone()), Some("submit")),
        (Method::POST, "/v1/jobs:batch".into(), Some(json!({ "jobs": [job.clone()] })), Some("submit")),
        (Method::POST, "/v1/plans".into(), Some(json!({ "plugin": "hello" })), Some("submit")),
        (Method::POST, format!("/v1/jobs/{FAKE_JOB}/approve"), Some(decision.clone()), Some("approve")),
        (Method::POST, format!("/v1/jobs/{FAKE_JOB}/reject"), Some(decision.clone()), Some("approve")),
        (Method::POST, format!("/v1/jobs/{FAKE_JOB}/run"), None, Some("approve")),
        (Method::POST, format!("/v1/plans/{FAKE_JOB}/approve"), Some(json!({ "phase": "apply" })), Some("approve")),
        (Method::POST, format!("/v1/plans/{FAKE_JOB}/reject"), Some(json!({ "phase": "apply" })), Some("approve")),
        (Method::POST, format!("/v1/jobs/{FAKE_JOB}/cancel"), None, Some("operate")),
        (Method::POST, format!("/v1/jobs/{FAKE_JOB}/retry"), None, Some("operate")),
        (Method::POST, "/v1/jobs:retry".into(), Some(json!({ "dry_run": true })), Some("operate")),
        (Method::POST, format!("/v1/plans/{FAKE_JOB}/cancel"), None, Some("operate")),
        (Method::GET, "/v1/workers".into(), None, Some("operate")),
        (Method::POST, "/v1/plugins/hello/pause".into(), Some(json!({ "reason": "x" })), Some("operate")),
        (Method::POST, "/v1/plugins/hello/resume".into(), None, Some("operate")),
        (Method::GET, "/v1/pauses".into(), None, None),
        (Method::GET, "/v1/schedules".into(), None, None),
        (Method::GET, "/v1/schedules/nightly".into(), None, None),
        (
            Method::POST,
            "/v1/schedules".into(),
            Some(json!({ "name": "x", "cron": "@daily", "job": { "plugin": "hello" } })),
            Some("submit"),
        ),
        (Method::POST, "/v1/schedules/nightly/pause".into(), None, Some("operate")),
        (Method::POST, "/v1/schedules/nightly/resume".into(), None, Some("operate")),
        (Method::POST, "/v1/schedules/nightly/trigger".into(), None, Some("operate")),
        (Method::DELETE, "/v1/schedules/nightly".into(), None, Some("operate")),
        (Method::GET, "/v1/rate-limits".into(), None, None),
        (Method::GET, "/v1/rate-limits/api".into(), None, None),
        (Method::PUT, "/v1/rate-limits/api".into(), Some(json!({ "rate": "5/s" })), Some("operate")),
        (Method::DELETE, "/v1/rate-limits/nothing".into(), None, Some("operate")),
        (Method::GET, "/metrics".into(), None, Some("operate")),
        (Method::PUT, "/v1/plugins/hello@0.0.0/grants".into(), Some(json!({})), Some("admin")),
        (Method::PUT, "/v1/plugins/hello@0.0.0/approval".into(), Some(json!({ "require": [] })), Some("admin")),
        (Method::GET, "/v1/principals".into(), None, Some("admin")),
        (Method::PUT, "/v1/principals/someone".into(), Some(json!({ "roles": ["submit"] })), Some("admin")),
        (Method::DELETE, "/v1/principals/nobody".into(), None, Some("admin")),
        (Method::GET, "/v1/tokens".into(), None, Some("admin")),
        (Method::POST, "/v1/tokens".into(), Some(json!({ "principal": "nobody" })), Some("admin")),
        (Method::POST, "/v1/tokens/0000000000000000/revoke".into(), None, Some("admin")),
        (Method::GET, "/v1/audit".into(), None, Some("operate")),
        (Method::GET, "/v1/audit/head".into(), None, Some("operate")),
        (Method::GET, "/v1/rules".into(), None, Some("approve")),
        (Method::GET, format!("/v1/rules/{FAKE_RULE}"), None, Some("approve")),
        (Method::POST, format!("/v1/rules/{FAKE_RULE}/revoke"), None, Some("approve")),
    ];
    for (method, path, body, needs) in &routes {
        for (role, token) in &tokens {
            let allowed = needs.is_none_or(|needed| *role == "admin" || needed == *role);
            let (status, answer) = server.call_as(token, method.clone(), path, body.clone()).await;
            if allowed {
                assert!(status != 401 && status != 403, "{method} {path} as {role}: {status} {answer}");
            } else {
                assert_eq!(status, 403, "{method} {path} as {role}: {answer}");
                assert_eq!(answer["error"]["kind"], "forbidden");
                let says = answer["error"]["message"].as_str().unwrap();
                assert!(says.contains(&format!("`{}`", needs.unwrap())), "it names the role: {says}");
            }
        }
    }
    let (status, answer) = server.call(Method::PUT, "/v1/principals/admin", Some(json!({ "roles": ["submit"] }))).await;
    assert_eq!(status, 400, "the bootstrap name is the server token's: {answer}");
}

#[tokio::test]
async fn a_token_revoked_expired_or_whose_principal_was_removed_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let first = server.principal("ops", &["operate"]).await;
    assert_eq!(server.call_as(&first, Method::GET, "/v1/workers", None).await.0, 200);
    let (_, listed) = server.call(Method::GET, "/v1/tokens?principal=ops", None).await;
    let record = &listed["tokens"][0];
    assert!(!listed.to_string().contains(&first[first.len() - 64..]), "no secret is listed: {listed}");
    let id = record["id"].as_str().unwrap();
    assert!(first.contains(id));
    let (status, _) = server.call_as(&server.token, Method::POST, &format!("/v1/tokens/{id}/revoke"), None).await;
    assert_eq!(status, 204);
    let (status, answer) = server.call_as(&first, Method::GET, "/v1/workers", None).await;
    assert_eq!(status, 401, "revoked: refused at once: {answer}");
    let (status, _) = server.call_as(&server.token, Method::POST, &format!("/v1/tokens/{id}/revoke"), None).await;
    assert_eq!(status, 404, "revoked once");
    let tampered = format!("{}0", &first[..first.len() - 1]);
    assert_eq!(server.call_as(&tampered, Method::GET, "/v1/health", None).await.0, 401);

    // Expiry: a token made to live 1 ms stops working by itself.
    let (status, created) =
        server.call(Method::POST, "/v1/tokens", Some(json!({ "principal": "ops", "ttl_ms": 1 }))).await;
    assert_eq!(status, 201, "{created}");
    let brief = created["token"].as_str().unwrap().to_owned();
    assert!(created["record"]["expires_at"].is_string(), "{created}");
    eventually("the 1 ms token expires", async || {
        (server.call_as(&brief, Method::GET, "/v1/health", None).await.0 == 401).then_some(())
    })
    .await;

    // Removing the principal ends its other tokens.
    let second = server.principal("ops", &["operate"]).await;
    assert_eq!(server.call_as(&second, Method::GET, "/v1/health", None).await.0, 200);
    let (status, _) = server.call_as(&server.token, Method::DELETE, "/v1/principals/ops", None).await;
    assert_eq!(status, 204);
    assert_eq!(server.call_as(&second, Method::GET, "/v1/health", None).await.0, 401);
    let (status, answer) = server.call(Method::POST, "/v1/tokens", Some(json!({ "principal": "ops" }))).await;
    assert_eq!((status, answer["error"]["kind"].as_str()), (404, Some("not_found")), "{answer}");
}

/// The CLI as an operator runs it: add a principal, create its token
/// (printed once), act as it (`whoami`), be refused what its role does not
/// allow, and revoke the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_adds_principals_creates_and_revokes_tokens_and_says_who_it_acts_as() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let said = |output: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
    };
    let added = leash(&server, &["principals", "add", "ci-bot", "--role", "submit"]);
    assert_eq!(added.status.code(), Some(0), "{}", said(&added));
    assert_eq!(String::from_utf8_lossy(&added.stdout).trim(), "ci-bot submit");
    let created = leash(&server, &["tokens", "create", "ci-bot", "--label", "deploys", "--ttl", "30d"]);
    assert_eq!(created.status.code(), Some(0), "{}", said(&created));
    let token = String::from_utf8_lossy(&created.stdout).trim().to_owned();
    assert!(token.starts_with("leash_"), "{token}");
    assert!(String::from_utf8_lossy(&created.stderr).contains("shown this once"));
    let as_bot = |args: &[&str]| {
        leash_bin().args(args).args(["--server", &server.url]).env("LEASH_API_TOKEN", &token).output().unwrap()
    };
    let me = as_bot(&["whoami"]);
    assert_eq!(String::from_utf8_lossy(&me.stdout).trim(), "ci-bot submit", "{}", said(&me));
    let refused = as_bot(&["principals", "list"]);
    assert_ne!(refused.status.code(), Some(0));
    assert!(said(&refused).contains("`admin`"), "{}", said(&refused));
    let listed = leash(&server, &["tokens", "list", "--principal", "ci-bot"]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.contains("deploys") && !listed.contains(&token[token.len() - 64..]), "{listed}");
    let id = token.split('_').nth(1).unwrap();
    let revoked = leash(&server, &["tokens", "revoke", id]);
    assert_eq!(revoked.status.code(), Some(0), "{}", said(&revoked));
    let after = as_bot(&["whoami"]);
    assert_ne!(after.status.code(), Some(0), "a revoked token: {}", said(&after));
    let (_, principals) = server.call(Method::GET, "/v1/principals", None).await;
    assert_eq!(principals["principals"][0]["name"], "ci-bot");
    let removed = leash(&server, &["principals", "remove", "ci-bot"]);
    assert_eq!(removed.status.code(), Some(0), "{}", said(&removed));
}

/// A principal with only `submit` reads its own jobs and plans, and no one
/// else's (`404`, as for a job that does not exist); `approve` and
/// `operate` read every one, and may narrow a list to one submitter.
#[tokio::test]
async fn a_submit_principal_reads_only_its_own_jobs_and_plans() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let sam = server.principal("sam", &["submit"]).await;
    let sue = server.principal("sue", &["submit"]).await;
    let olive = server.principal("olive", &["operate"]).await;
    let job = json!({ "plugin": "hello", "execution": "async" });
    let submit = async |token: &str| {
        let (status, answer) = server.call_as(token, Method::POST, "/v1/jobs", Some(job.clone())).await;
        assert_eq!(status, 202, "{answer}");
        answer["job_id"].as_str().unwrap().to_owned()
    };
    let (mine, theirs) = (submit(&sam).await, submit(&sue).await);
    let ids = |page: &Value| -> Vec<String> {
        page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_owned()).collect()
    };
    let (_, page) = server.call_as(&sam, Method::GET, "/v1/jobs", None).await;
    assert_eq!(ids(&page), [mine.as_str()], "sam lists only its own");
    let (_, page) = server.call_as(&sam, Method::GET, "/v1/jobs?submitted_by=sue", None).await;
    assert_eq!(ids(&page), [mine.as_str()], "nor can it ask for another's");
    for path in ["", "/logs", "/effects", "/input", "/output"] {
        let (status, answer) = server.call_as(&sam, Method::GET, &format!("/v1/jobs/{theirs}{path}"), None).await;
        assert_eq!(status, 404, "{path}: {answer}");
    }
    let (status, job) = server.call_as(&sam, Method::GET, &format!("/v1/jobs/{mine}"), None).await;
    assert_eq!((status, job["submitted_by"].as_str()), (200, Some("sam")), "{job}");
    let (_, page) = server.call_as(&olive, Method::GET, "/v1/jobs", None).await;
    assert_eq!(ids(&page).len(), 2, "an operator reads every job");
    let (_, page) = server.call_as(&olive, Method::GET, "/v1/jobs?submitted_by=sue", None).await;
    assert_eq!(ids(&page), [theirs.as_str()]);
    let (status, answer) = server.call_as(&sam, Method::GET, "/v1/events", None).await;
    assert_eq!((status, answer["error"]["kind"].as_str()), (403, Some("forbidden")), "{answer}");

    let (status, plan) = server.call_as(&sue, Method::POST, "/v1/plans", Some(json!({ "plugin": "hello" }))).await;
    assert_eq!(status, 201, "{plan}");
    let plan_id = plan["plan_id"].as_str().unwrap().to_owned();
    let (_, plans) = server.call_as(&sam, Method::GET, "/v1/plans", None).await;
    assert_eq!(plans["plans"].as_array().map(Vec::len), Some(0), "{plans}");
    let (status, _) = server.call_as(&sam, Method::GET, &format!("/v1/plans/{plan_id}"), None).await;
    assert_eq!(status, 404);
    let (_, plans) = server.call_as(&sue, Method::GET, "/v1/plans", None).await;
    assert_eq!(plans["plans"][0]["plan_id"], plan_id.as_str());
    let (status, _) = server.call_as(&sue, Method::GET, &format!("/v1/plans/{plan_id}"), None).await;
    assert_eq!(status, 200);
}

/// Two `leash serve` replicas on one PostgreSQL database: a token made on
/// one works on the other; revoked, expired, or its principal removed on
/// one, it is refused by the other at once (every request reads its row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_expiry_and_removal_hold_at_once_on_every_postgres_replica() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_schema, a, b)) = crate::support::server::two_postgres_replicas(dir.path()).await else { return };
    let whoami = async |server: &Server, token: &str| server.call_as(token, Method::GET, "/v1/whoami", None).await.0;

    let first = a.principal("ops", &["operate"]).await;
    assert_eq!(whoami(&b, &first).await, 200, "made on a, it works on b");
    let (_, listed) = b.call(Method::GET, "/v1/tokens?principal=ops", None).await;
    let id = listed["tokens"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(a.call(Method::POST, &format!("/v1/tokens/{id}/revoke"), None).await.0, 204);
    assert_eq!(whoami(&b, &first).await, 401, "revoked on a: refused by b at once");

    let (status, created) = a.call(Method::POST, "/v1/tokens", Some(json!({ "principal": "ops", "ttl_ms": 1 }))).await;
    assert_eq!(status, 201, "{created}");
    let brief = created["token"].as_str().unwrap().to_owned();
    eventually("the 1 ms token made on a expires on b", async || (whoami(&b, &brief).await == 401).then_some(())).await;

    let second = b.principal("ops", &["operate"]).await;
    assert_eq!(whoami(&a, &second).await, 200);
    assert_eq!(b.call(Method::DELETE, "/v1/principals/ops", None).await.0, 204);
    assert_eq!(whoami(&a, &second).await, 401, "removed on b: its tokens are refused by a at once");
}

/// A principal's own ceilings: a submit asking for more is refused, naming
/// the ceiling; a default above one is cut to it; and a timeout ceiling
/// lowered while a job waits holds that job when a worker claims it.
#[tokio::test]
async fn a_principal_s_ceilings_hold_its_submits_and_its_waiting_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    server.add_plugin("sleep").await;
    let ceilings = json!({ "max_timeout_ms": 20_000, "max_attempts": 2, "max_queue_ttl_ms": 60_000 });
    let (status, sam) = server
        .call(Method::PUT, "/v1/principals/sam", Some(json!({ "roles": ["submit"], "ceilings": ceilings })))
        .await;
    assert_eq!((status, &sam["ceilings"]), (200, &ceilings), "{sam}");
    let token = server.principal_token("sam").await;
    let submit = async |body: Value| server.call_as(&token, Method::POST, "/v1/jobs", Some(body)).await;
    for (field, value) in [("timeout_ms", 30_000), ("max_attempts", 3), ("queue_ttl_ms", 120_000)] {
        let mut body = json!({ "plugin": "hello", "execution": "async" });
        body[field] = json!(value);
        let (status, answer) = submit(body).await;
        assert_eq!((status, answer["error"]["kind"].as_str()), (400, Some("invalid_job")), "{field}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("principal \"sam\"'s ceiling"), "{answer}");
    }
    let (status, answer) = submit(json!({ "plugin": "hello", "execution": "async" })).await;
    assert_eq!(status, 202, "{answer}");
    let job = server.poll_job(answer["job_id"].as_str().unwrap(), |_| true).await;
    // The defaults (1 h timeout, one attempt, 1 h queue TTL) within sam's.
    assert_eq!((job["limits"]["timeout_ms"].as_u64(), job["max_attempts"].as_u64()), (Some(20_000), Some(1)), "{job}");
    let ms = |at: &Value| serde_json::from_value::<leash::clock::Timestamp>(at.clone()).unwrap().unix_ms();
    assert_eq!(ms(&job["expires_at"]) - ms(&job["created_at"]), 60_000, "the queue TTL cut to sam's: {job}");

    // A sleeper due in 2 s; its submitter's timeout ceiling drops meanwhile.
    let (status, answer) =
        submit(json!({ "plugin": "sleep", "input": { "ms": 600_000 }, "execution": "async", "delay_ms": 2_000 })).await;
    assert_eq!(status, 202, "{answer}");
    let lowered = json!({ "roles": ["submit"], "ceilings": { "max_timeout_ms": 300 } });
    assert_eq!(server.call(Method::PUT, "/v1/principals/sam", Some(lowered)).await.0, 200);
    let done = server.poll_job(answer["job_id"].as_str().unwrap(), crate::support::server::is_terminal).await;
    assert_eq!(done["error_kind"], "timeout", "{done}");
    assert!(done["error_message"].as_str().unwrap().contains("300ms"), "the ceiling at claim, not at submit: {done}");
}

/// A principal's running cap: with slots free, its second job waits
/// queued while its first runs (a job submitted after it by another
/// principal starts), and starts once the first ends; the cap is shown
/// with the principal.
#[tokio::test]
async fn a_principal_s_running_cap_keeps_its_jobs_queued_while_slots_are_free() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "4"]);
    server.add_plugin("sleep").await;
    let body = json!({ "roles": ["submit"], "ceilings": { "max_running": 1 } });
    let (status, sam) = server.call(Method::PUT, "/v1/principals/sam", Some(body)).await;
    assert_eq!((status, &sam["ceilings"]), (200, &json!({ "max_running": 1 })), "{sam}");
    let refused = json!({ "roles": ["submit"], "ceilings": { "max_running": 0 } });
    assert_eq!(server.call(Method::PUT, "/v1/principals/sam", Some(refused)).await.0, 400, "a cap of none is no cap");
    let token = server.principal_token("sam").await;
    let sleeper = json!({ "plugin": "sleep", "input": { "ms": 600_000 }, "execution": "async" });
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, answer) = server.call_as(&token, Method::POST, "/v1/jobs", Some(sleeper.clone())).await;
        assert_eq!(status, 202, "{answer}");
        ids.push(answer["job_id"].as_str().unwrap().to_owned());
    }
    let (status, answer) = server.call(Method::POST, "/v1/jobs", Some(sleeper)).await;
    assert_eq!(status, 202, "{answer}");
    let later = answer["job_id"].as_str().unwrap().to_owned();
    let running = |job: &Value| job["status"] == "running";
    server.poll_job(&ids[0], running).await;
    server.poll_job(&later, running).await;
    let second = server.poll_job(&ids[1], |_| true).await;
    assert_eq!(second["status"], "queued", "sam runs one at a time, though slots are free: {second}");

    let (status, answer) = server.call(Method::POST, &format!("/v1/jobs/{}/cancel", ids[0]), None).await;
    assert!((200..300).contains(&status), "{answer}");
    server.poll_job(&ids[1], running).await;
    for id in [&ids[1], &later] {
        server.call(Method::POST, &format!("/v1/jobs/{id}/cancel"), None).await;
    }
}
