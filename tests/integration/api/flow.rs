//! Flow control against a real `leash serve` and the real CLI: a job's
//! priority is set at submit (a job or a plan), shown, and bounded.

use reqwest::Method;
use serde_json::json;

use crate::cli::ops::leash;
use crate::support::eventually;
use crate::support::server::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_is_set_at_submit_shown_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;

    let (status, answer) = server
        .call(Method::POST, "/v1/jobs", Some(json!({ "plugin": "hello", "priority": 3, "execution": "async" })))
        .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["job_id"].as_str().unwrap();
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(job["priority"], 3, "{job}");
    let (_, default) = server.call(Method::POST, "/v1/jobs", Some(json!({ "plugin": "hello" }))).await;
    assert_eq!(default["job"]["priority"], 0, "0 unless asked: {default}");

    for (priority, says) in
        [(json!(10), "priority 10 is out of range: use 0 (first) to 9 (last)"), (json!(-1), "priority")]
    {
        let body = json!({ "plugin": "hello", "priority": priority, "execution": "async" });
        let (status, answer) = server.call(Method::POST, "/v1/jobs", Some(body)).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{answer}");
    }
    let (_, page) = server.call(Method::GET, "/v1/jobs", None).await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2, "a refused submit stores nothing");

    // A plan's phases keep the plan's priority.
    let (status, plan) = server
        .call(Method::POST, "/v1/plans", Some(json!({ "plugin": "hello", "apply": "auto", "priority": 6 })))
        .await;
    assert_eq!(status, 201, "{plan}");
    assert_eq!(plan["execute"]["job"]["priority"], 6, "{plan}");
    let path = format!("/v1/plans/{}", plan["plan_id"].as_str().unwrap());
    let applied = eventually("the plan's apply phase", async || {
        let (_, plan) = server.call(Method::GET, &path, None).await;
        plan["apply"]["job"].is_object().then_some(plan)
    })
    .await;
    assert_eq!(applied["apply"]["job"]["priority"], 6, "{applied}");

    // The CLI: `--priority` on submit, shown by `jobs show`, bounded.
    let submitted = leash(&server, &["submit", "hello", "--priority", "7", "--json"]);
    assert_eq!(submitted.status.code(), Some(0), "{}", String::from_utf8_lossy(&submitted.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&submitted.stdout).unwrap();
    let id = answer["job_id"].as_str().unwrap();
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(job["priority"], 7, "{job}");
    let shown = leash(&server, &["jobs", "show", id]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.lines().any(|l| l.contains("priority") && l.contains("7 (0 is claimed first)")), "{text}");
    let refused = leash(&server, &["submit", "hello", "--priority", "10"]);
    assert_eq!(refused.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("0..=9"), "{}", String::from_utf8_lossy(&refused.stderr));
}

/// An operator pauses a plugin and resumes it through the API and the
/// CLI: its queued jobs wait (one slot, and the held job due first, so a
/// pause that did not hold would have run it first), health, the pause
/// list, `jobs list` and `plugins list` say so, both are audited, and bad
/// names are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_and_resumes_a_plugin_through_the_api_and_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "1"]);
    server.add_plugin("hello").await;
    server.add_plugin("echo").await;

    let (status, pause) =
        server.call(Method::POST, "/v1/plugins/hello/pause", Some(json!({ "reason": "quota spent" }))).await;
    assert_eq!(status, 200, "{pause}");
    assert_eq!((pause["name"].as_str(), pause["paused_by"].as_str()), (Some("hello"), Some("admin")));
    let (status, again) = server.call(Method::POST, "/v1/plugins/hello/pause", None).await;
    assert_eq!((status, &again), (200, &pause), "pausing again answers the first pause");
    for (path, status, says) in [
        ("/v1/plugins/hello@0.0.0/pause", 400, "give the name alone"),
        ("/v1/plugins/nobody/pause", 404, "nobody"),
        ("/v1/plugins/nobody/resume", 404, "nobody"),
    ] {
        let (got, answer) = server.call(Method::POST, path, None).await;
        assert_eq!(got, status, "{path}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{path}: {answer}");
    }
    let long = json!({ "reason": "x".repeat(1025) });
    let (status, answer) = server.call(Method::POST, "/v1/plugins/hello/pause", Some(long)).await;
    assert_eq!(status, 400, "a reason over 1,024 bytes: {answer}");

    let submit = async |plugin: &str| {
        let (status, answer) =
            server.call(Method::POST, "/v1/jobs", Some(json!({ "plugin": plugin, "execution": "async" }))).await;
        assert_eq!(status, 202, "{answer}");
        answer["job_id"].as_str().unwrap().to_owned()
    };
    let held = submit("hello").await;
    let other = submit("echo").await;
    server.poll_job(&other, |j| j["status"] == "succeeded").await;
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{held}"), None).await;
    assert_eq!(job["status"], "queued", "held by the pause: {job}");
    let (_, list) = server.call(Method::GET, "/v1/pauses", None).await;
    assert_eq!(list["pauses"], json!([pause]));
    let (_, health) = server.call(Method::GET, "/v1/health", None).await;
    assert_eq!(health["health"]["paused_plugins"], json!([pause]), "{health}");

    let listed = leash(&server, &["jobs", "list"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.lines().any(|l| l.contains(&held) && l.contains("queued (paused)")), "{text}");
    assert!(text.lines().any(|l| l.contains(&other) && l.contains("succeeded")), "{text}");
    let plugins = leash(&server, &["plugins", "list"]);
    let text = String::from_utf8_lossy(&plugins.stdout);
    assert!(text.lines().any(|l| l.contains("hello") && l.contains("since")), "{text}");
    assert!(text.lines().any(|l| l.contains("echo") && !l.contains("since")), "{text}");

    let resumed = leash(&server, &["plugins", "resume", "hello"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("hello is resumed"));
    server.poll_job(&held, |j| j["status"] == "succeeded").await;
    let twice = leash(&server, &["plugins", "resume", "hello"]);
    assert!(String::from_utf8_lossy(&twice.stdout).contains("hello was not paused: nothing changed"));

    let paused = leash(&server, &["plugins", "pause", "hello", "--reason", "again"]);
    let said = String::from_utf8_lossy(&paused.stdout);
    assert!(said.starts_with("hello is paused since ") && said.trim_end().ends_with("by admin: again"), "{said}");
    let (_, resumed) = server.call(Method::POST, "/v1/plugins/hello/resume", None).await;
    assert_eq!(resumed, json!({ "resumed": true }));

    let (_, audit) = server.call(Method::GET, "/v1/audit?target=hello", None).await;
    let actions: Vec<&str> = audit["rows"].as_array().unwrap().iter().filter_map(|r| r["action"].as_str()).collect();
    assert_eq!(actions, ["plugin.pause", "plugin.resume", "plugin.pause", "plugin.resume"], "once each: {audit}");
}

/// Tags and metadata through the API and the CLI: set at submit (a job,
/// a batch, a schedule's jobs), shown, and listed by (all tags, any tag,
/// metadata entries); bad ones refused with nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_carry_tags_and_metadata_and_are_listed_by_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "1"]);
    server.add_plugin("hello").await;
    let submit = async |body: serde_json::Value| {
        let (status, answer) = server.call(Method::POST, "/v1/jobs", Some(body)).await;
        assert_eq!(status, 202, "{answer}");
        answer["job_id"].as_str().unwrap().to_owned()
    };
    let a = submit(json!({ "plugin": "hello", "execution": "async", "tags": ["env:prod", "team/pay"],
        "metadata": { "customer": "acme", "batch": 42 } }))
    .await;
    let b = submit(json!({ "plugin": "hello", "execution": "async", "tags": ["env:prod"] })).await;
    let (_, shown) = server.call(Method::GET, &format!("/v1/jobs/{a}"), None).await;
    assert_eq!(
        (&shown["tags"], &shown["metadata"]["batch"]),
        (&json!(["env:prod", "team/pay"]), &json!(42)),
        "{shown}"
    );

    let list = async |query: &str| {
        let (status, page) = server.call(Method::GET, &format!("/v1/jobs?{query}"), None).await;
        assert_eq!(status, 200, "{query}: {page}");
        let mut ids: Vec<String> =
            page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_owned()).collect();
        ids.sort();
        ids
    };
    let both = {
        let mut v = vec![a.clone(), b.clone()];
        v.sort();
        v
    };
    assert_eq!(list("tag=env:prod").await, both);
    assert_eq!(list("tag=env:prod,team/pay").await, std::slice::from_ref(&a));
    assert_eq!(list("tag=team/pay,nowhere&tag_match=any").await, std::slice::from_ref(&a));
    assert_eq!(list("meta=%7B%22customer%22%3A%22acme%22%7D").await, std::slice::from_ref(&a));
    assert_eq!(list("meta=%7B%22batch%22%3A42%7D").await, std::slice::from_ref(&a));
    for (query, says) in [
        ("tag=a%20b", "`tag`: tag \"a b\" is not valid"),
        ("tag=a&tag_match=some", "`tag_match` is `all` or `any`"),
        ("meta=%5B1%5D", "`meta` must be a JSON object"),
        ("meta=%7B%22k%22%3A%5B1%5D%7D", "is neither"),
    ] {
        let (status, answer) = server.call(Method::GET, &format!("/v1/jobs?{query}"), None).await;
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{query}: {answer}");
    }
    let (status, refused) = server
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({ "plugin": "hello", "execution": "async", "metadata": { "k": {} } })),
        )
        .await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("a string, a number or a boolean"), "{refused}");

    // The CLI: `--tag` and `--meta` on submit and on `jobs list`; `jobs show` says them.
    let run = |args: &[&str]| {
        let out = leash(&server, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let c = run(&["submit", "hello", "--tag", "env:test", "--meta", "customer=acme"]).trim().to_owned();
    let listed = run(&["jobs", "list", "--meta", "customer=acme", "--json"]);
    let page: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let mut found: Vec<&str> = page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect();
    found.sort();
    let mut expected = vec![a.as_str(), c.as_str()];
    expected.sort();
    assert_eq!(found, expected);
    let any = run(&["jobs", "list", "--tag", "env:test", "--tag", "team/pay", "--any-tag"]);
    assert!(any.contains(&a) && any.contains(&c) && !any.contains(&b), "{any}");
    let shown = run(&["jobs", "show", &c]);
    assert!(shown.lines().any(|l| l.contains("tags") && l.contains("env:test")), "{shown}");
    assert!(shown.lines().any(|l| l.contains("metadata") && l.contains(r#"{"customer":"acme"}"#)), "{shown}");

    // A schedule's jobs carry its template's tags.
    let body =
        json!({ "name": "tagged", "every_ms": 3_600_000, "job": { "plugin": "hello", "tags": ["from:schedule"] } });
    assert_eq!(server.call(Method::POST, "/v1/schedules", Some(body)).await.0, 201);
    let (_, triggered) = server.call(Method::POST, "/v1/schedules/tagged/trigger", None).await;
    let id = triggered["job"]["id"].as_str().unwrap().to_owned();
    assert_eq!(list("tag=from:schedule").await, [id]);
}

/// Rate limits through the API and the CLI: set (and changed), listed,
/// shown, used by jobs (a job over its limit waits queued for its slot,
/// shown as `waiting_rate`; the key rendered from the input), removed;
/// bad names, rates and unknown limits refused; audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sets_a_rate_limit_and_jobs_over_it_wait_for_their_slots() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;

    let set = leash(&server, &["limits", "set", "per-org", "1/min"]);
    assert_eq!(set.status.code(), Some(0), "{}", String::from_utf8_lossy(&set.stderr));
    assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "rate limit per-org set: 1/min, burst 1");
    let (status, changed) =
        server.call(Method::PUT, "/v1/rate-limits/per-org", Some(json!({ "rate": "2/2min", "burst": 1 }))).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(
        (&changed["rate"], &changed["count"], &changed["per_ms"]),
        (&json!("2/2min"), &json!(2), &json!(120_000))
    );
    assert_eq!(changed["updated_by"], "admin");
    let (_, shown) = server.call(Method::GET, "/v1/rate-limits/per-org", None).await;
    assert_eq!(shown, changed);
    let (_, list) = server.call(Method::GET, "/v1/rate-limits", None).await;
    assert_eq!(list["limits"], json!([changed]));
    let listed = leash(&server, &["limits", "list"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.lines().any(|l| l.contains("per-org") && l.contains("2/2min") && l.contains("admin")), "{text}");

    for (method, path, body, status, says) in [
        (Method::PUT, "/v1/rate-limits/per-org", json!({ "rate": "fast" }), 400, "COUNT/INTERVAL"),
        (Method::PUT, "/v1/rate-limits/per-org", json!({ "rate": "1/s", "burst": 0 }), 400, "burst 0"),
        (Method::PUT, "/v1/rate-limits/Per%20Org", json!({ "rate": "1/s" }), 400, "not valid"),
        (Method::PUT, "/v1/rate-limits/per-org", json!({ "rate": "1/s", "extra": 1 }), 400, "extra"),
        (Method::GET, "/v1/rate-limits/nothing", json!(null), 404, "nothing"),
        (Method::POST, "/v1/jobs", json!({ "plugin": "hello", "rate_limit": "nothing" }), 400, "does not exist"),
        (Method::POST, "/v1/jobs", json!({ "plugin": "hello", "rate_key": "x" }), 400, "needs a rate_limit"),
    ] {
        let body = (!body.is_null()).then_some(body);
        let (got, answer) = server.call(method.clone(), path, body).await;
        assert_eq!(got, status, "{method} {path}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{method} {path}: {answer}");
    }

    // Two jobs of one org: the first runs, the second waits for its slot
    // a minute on; another org's job runs beside them.
    let submit = async |org: &str| {
        let body = json!({ "plugin": "hello", "execution": "async", "input": { "name": org },
            "rate_limit": "per-org", "rate_key": "{plugin}:{input.name}" });
        let (status, answer) = server.call(Method::POST, "/v1/jobs", Some(body)).await;
        assert_eq!(status, 202, "{answer}");
        answer["job_id"].as_str().unwrap().to_owned()
    };
    let first = submit("acme").await;
    server.poll_job(&first, |j| j["status"] == "succeeded").await;
    let second = submit("acme").await;
    let other = submit("globex").await;
    server.poll_job(&other, |j| j["status"] == "succeeded").await;
    let waiting = server.poll_job(&second, |j| j["rate_slot"].is_string()).await;
    assert_eq!((&waiting["status"], &waiting["rate_key"]), (&json!("queued"), &json!("hello:acme")), "{waiting}");
    assert_eq!(waiting["run_after"], waiting["rate_slot"], "{waiting}");
    let listed = leash(&server, &["jobs", "list"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.lines().any(|l| l.contains(&second) && l.contains("queued (waiting_rate)")), "{text}");
    let shown = leash(&server, &["jobs", "show", &second]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.lines().any(|l| l.contains("per-org · key hello:acme · waiting_rate until")), "{text}");

    // The CLI's own flags.
    let input = dir.path().join("in.json");
    std::fs::write(&input, r#"{"name":"initech"}"#).unwrap();
    let input = input.to_string_lossy().into_owned();
    let args =
        ["submit", "hello", "--input", &input, "--rate-limit", "per-org", "--rate-key", "{input.name}", "--json"];
    let submitted = leash(&server, &args);
    assert_eq!(submitted.status.code(), Some(0), "{}", String::from_utf8_lossy(&submitted.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&submitted.stdout).unwrap();
    let (_, job) = server.call(Method::GET, &format!("/v1/jobs/{}", answer["job_id"].as_str().unwrap()), None).await;
    assert_eq!((&job["rate_limit"], &job["rate_key"]), (&json!("per-org"), &json!("initech")), "{job}");

    let removed = leash(&server, &["limits", "remove", "per-org"]);
    assert_eq!(String::from_utf8_lossy(&removed.stdout).trim(), "rate limit per-org removed");
    let (status, _) = server.call(Method::DELETE, "/v1/rate-limits/per-org", None).await;
    assert_eq!(status, 404, "removed once");
    let (_, audit) = server.call(Method::GET, "/v1/audit?target=per-org", None).await;
    let actions: Vec<&str> = audit["rows"].as_array().unwrap().iter().filter_map(|r| r["action"].as_str()).collect();
    assert_eq!(actions, ["rate_limit.set", "rate_limit.set", "rate_limit.remove"], "{audit}");
}

/// A limit on outbound requests through the CLI and the API: `--host` and
/// `--secret` are kept and shown by `limits set`, `show` and `list`, and
/// the API's `hosts` and `secrets`; a bad rule, a bad secret name and a
/// rule named twice are refused with what is wrong, and the limit is left
/// as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_limits_the_requests_to_an_upstream_by_host_and_by_secret() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let args = ["limits", "set", "github", "5000/h", "--host", "https://api.github.com", "--secret", "GH_TOKEN"];
    let set = leash(&server, &args);
    assert_eq!(set.status.code(), Some(0), "{}", String::from_utf8_lossy(&set.stderr));
    assert_eq!(
        String::from_utf8_lossy(&set.stdout).trim(),
        "rate limit github set: 5000/h, burst 1; requests to https://api.github.com, secret GH_TOKEN"
    );
    let (_, shown) = server.call(Method::GET, "/v1/rate-limits/github", None).await;
    assert_eq!((&shown["hosts"], &shown["secrets"]), (&json!(["https://api.github.com"]), &json!(["GH_TOKEN"])));
    let listed = leash(&server, &["limits", "list"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.lines().any(|l| l.contains("github") && l.contains("https://api.github.com, secret GH_TOKEN")),
        "{text}"
    );
    let show = leash(&server, &["limits", "show", "github"]);
    assert!(String::from_utf8_lossy(&show.stdout).contains("5000/h (burst 1); requests to https://api.github.com"));

    let body = json!({ "rate": "10/s", "hosts": ["GET https://*.example.com", "http://127.0.0.1:8080"] });
    let (status, changed) = server.call(Method::PUT, "/v1/rate-limits/github", Some(body)).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(
        (&changed["hosts"], &changed["secrets"]),
        (&json!(["GET https://*.example.com", "http://127.0.0.1:8080"]), &json!([]))
    );

    for (body, says) in [
        (json!({ "rate": "1/s", "hosts": ["api.github.com"] }), "SCHEME://HOST"),
        (json!({ "rate": "1/s", "secrets": ["gh-token"] }), "secret name"),
        (json!({ "rate": "1/s", "hosts": ["https://x.com", "https://X.com"] }), "named twice"),
    ] {
        let (status, answer) = server.call(Method::PUT, "/v1/rate-limits/github", Some(body)).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer["error"]["message"].as_str().unwrap_or_default().contains(says), "{answer}");
    }
    let (_, kept) = server.call(Method::GET, "/v1/rate-limits/github", None).await;
    assert_eq!(kept, changed, "refused changes leave the limit as it was");
}
