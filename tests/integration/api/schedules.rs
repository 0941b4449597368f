//! Schedules against a real `leash serve` (its scheduler ticks each
//! second on the real clock) and the real CLI: a schedule fires and its
//! jobs run and carry it; every route and CLI verb; bad schedules refused
//! with nothing stored; the trail names who did what.

use reqwest::Method;
use serde_json::json;

use crate::cli::ops::leash;
use crate::support::eventually;
use crate::support::server::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_fires_a_schedule_and_its_jobs_run_and_carry_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let body = json!({
        "name": "tick",
        "every_ms": 1000,
        "overlap": "allow",
        "job": { "plugin": "hello", "input": { "name": "sched" }, "priority": 2 },
    });
    let (status, added) = server.call(Method::POST, "/v1/schedules", Some(body)).await;
    assert_eq!(status, 201, "{added}");
    assert_eq!((added["name"].as_str(), added["created_by"].as_str()), (Some("tick"), Some("admin")), "{added}");
    let id = added["id"].as_str().unwrap().to_owned();

    let jobs = eventually("two succeeded jobs of the schedule", async || {
        let (_, page) = server.call(Method::GET, "/v1/jobs?schedule=tick&status=succeeded", None).await;
        let jobs = page["jobs"].as_array().cloned().unwrap_or_default();
        (jobs.len() >= 2).then_some(jobs)
    })
    .await;
    for job in &jobs {
        assert_eq!(job["schedule_id"].as_str(), Some(id.as_str()), "{job}");
        assert_eq!((job["priority"].as_i64(), job["submitted_by"].as_str()), (Some(2), Some("admin")), "{job}");
    }
    let (status, shown) = server.call(Method::GET, "/v1/schedules/tick", None).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["upcoming"].as_array().unwrap().len(), 5, "{shown}");
    assert!(!shown["recent"].as_array().unwrap().is_empty(), "{shown}");
    assert!(shown["fired"].as_u64().unwrap() >= 2, "{shown}");
    assert!(shown["last_outcome"].as_str().unwrap().starts_with("submitted 1 job"), "{shown}");

    // Paused, it shows no next firing; resumed, it does again.
    let (status, paused) =
        server.call(Method::POST, "/v1/schedules/tick/pause", Some(json!({ "reason": "maintenance" }))).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["paused"]["reason"], "maintenance");
    assert!(paused.get("next_fire_at").is_none(), "{paused}");
    let (_, resumed) = server.call(Method::POST, "/v1/schedules/tick/resume", None).await;
    assert!(resumed.get("paused").is_none() && resumed["next_fire_at"].is_string(), "{resumed}");
    let (status, _) = server.call(Method::DELETE, "/v1/schedules/tick", None).await;
    assert_eq!(status, 204);
    let (status, gone) = server.call(Method::GET, "/v1/schedules/tick", None).await;
    assert_eq!((status, gone["error"]["kind"].as_str()), (404, Some("not_found")), "{gone}");
    let (_, page) = server.call(Method::GET, &format!("/v1/jobs/{}", jobs[0]["id"].as_str().unwrap()), None).await;
    assert_eq!(page["schedule_id"].as_str(), Some(id.as_str()), "a removed schedule's jobs stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_with_nothing_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let job = json!({ "plugin": "hello" });
    for (body, status, says) in [
        (json!({ "name": "a", "cron": "61 * * * *", "job": job }), 400, "cron expression"),
        (json!({ "name": "a", "cron": "@daily", "timezone": "Mars/Base", "job": job }), 400, "time zone"),
        (json!({ "name": "a", "cron": "@daily", "every_ms": 1000, "job": job }), 400, "not both"),
        (json!({ "name": "a", "job": job }), 400, "give `cron`"),
        (json!({ "name": "a", "every_ms": 10, "job": job }), 400, "out of range"),
        (json!({ "name": "Not OK", "every_ms": 1000, "job": job }), 400, "schedule name"),
        (json!({ "name": "a", "every_ms": 1000, "job": { "plugin": "nobody" } }), 404, "unknown plugin"),
        (
            json!({ "name": "a", "every_ms": 1000, "job": { "plugin": "hello", "memory_bytes": 1u64 << 40 } }),
            400,
            "ceiling",
        ),
        (json!({ "name": "a", "every_ms": 1000, "job": { "plugin": "hello", "run_at": "x" } }), 400, "run_at"),
        (json!({ "name": "a", "every_ms": 1000, "overlap": "sometimes", "job": job }), 400, "overlap"),
    ] {
        let (got, answer) = server.call(Method::POST, "/v1/schedules", Some(body.clone())).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{body}: {answer}");
    }
    let (_, list) = server.call(Method::GET, "/v1/schedules", None).await;
    assert_eq!(list["schedules"], json!([]), "nothing stored: {list}");
    let good = json!({ "name": "a", "cron": "0 3 * * *", "timezone": "Europe/Berlin", "job": job });
    assert_eq!(server.call(Method::POST, "/v1/schedules", Some(good.clone())).await.0, 201);
    let (status, taken) = server.call(Method::POST, "/v1/schedules", Some(good)).await;
    assert_eq!((status, taken["error"]["kind"].as_str()), (409, Some("name_taken")), "{taken}");
    for path in ["/v1/schedules/nobody/pause", "/v1/schedules/nobody/resume", "/v1/schedules/nobody/trigger"] {
        assert_eq!(server.call(Method::POST, path, None).await.0, 404, "{path}");
    }
    assert_eq!(server.call(Method::POST, "/v1/schedules/Bad%20Name/pause", None).await.0, 400);
    let (status, page) = server.call(Method::GET, "/v1/jobs?schedule=nobody", None).await;
    assert_eq!((status, &page["jobs"]), (200, &json!([])), "no such schedule: none of its jobs {page}");
    let (status, page) = server.call(Method::GET, "/v1/jobs?schedule=", None).await;
    assert_eq!(status, 400, "{page}");
}

/// Every CLI verb against a real server; a submit-only principal adds a
/// schedule (its jobs are submitted as it) but may not pause or trigger
/// it; the trail names each change's principal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cli_verb_works_and_the_trail_names_who_did_what() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    server.add_plugin("hello").await;
    let input = dir.path().join("input.json");
    std::fs::write(&input, br#"{"name":"nightly"}"#).unwrap();
    let input = input.to_string_lossy().into_owned();
    let out = |args: &[&str]| {
        let run = leash(&server, args);
        let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        assert_eq!(run.status.code(), Some(0), "{args:?}: {stdout}{stderr}");
        stdout.into_owned()
    };
    let added = out(&[
        "schedules",
        "add",
        "nightly",
        "hello",
        "--cron",
        "30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--input",
        &input,
        "--overlap",
        "queue",
        "--catch-up",
        "all",
        "--priority",
        "4",
        "--paused",
    ]);
    assert!(
        added.contains("schedule nightly added: 30 2 * * * (Europe/Berlin); next firing never (paused)"),
        "{added}"
    );
    let listed = out(&["schedules", "list"]);
    assert!(listed.lines().any(|l| l.contains("nightly") && l.contains("hello") && l.contains("paused")), "{listed}");
    let resumed = out(&["schedules", "resume", "nightly"]);
    assert!(resumed.contains("nightly is running; next firing 20"), "{resumed}");
    let shown = out(&["schedules", "show", "nightly"]);
    for says in ["queue", "all", r#""priority":4"#, r#""input":{"name":"nightly"}"#, "next firings"] {
        assert!(shown.contains(says), "{says}: {shown}");
    }
    // 02:30 in Berlin is 00:30 or 01:30 UTC: every next firing says so.
    let (_, body) = server.call(Method::GET, "/v1/schedules/nightly", None).await;
    for time in body["upcoming"].as_array().unwrap() {
        let time = time.as_str().unwrap();
        assert!(time.ends_with("T00:30:00.000Z") || time.ends_with("T01:30:00.000Z"), "{time}");
    }
    let job = out(&["schedules", "trigger", "nightly"]);
    let (_, triggered) = server.call(Method::GET, &format!("/v1/jobs/{}", job.trim()), None).await;
    assert_eq!(triggered["schedule_id"], body["id"], "{triggered}");
    assert_eq!(triggered["concurrency_key"], "schedule:nightly", "overlap queue: one key: {triggered}");
    let paused = out(&["schedules", "pause", "nightly", "--reason", "freeze"]);
    assert!(paused.contains("nightly is paused since"), "{paused}");

    // A submit-only principal adds its own; pausing or triggering it needs `operate`.
    let submitter = server.principal("sam", &["submit"]).await;
    let body = json!({ "name": "sams", "every_ms": 3_600_000, "job": { "plugin": "hello" } });
    let (status, sams) = server.call_as(&submitter, Method::POST, "/v1/schedules", Some(body)).await;
    assert_eq!((status, sams["created_by"].as_str()), (201, Some("sam")), "{sams}");
    let (status, _) = server.call_as(&submitter, Method::POST, "/v1/schedules/sams/trigger", None).await;
    assert_eq!(status, 403);
    let (_, triggered) = server.call(Method::POST, "/v1/schedules/sams/trigger", None).await;
    let (_, job) =
        server.call(Method::GET, &format!("/v1/jobs/{}", triggered["job"]["id"].as_str().unwrap()), None).await;
    assert_eq!(job["submitted_by"], "sam", "a schedule's jobs are its creator's: {job}");

    let removed = out(&["schedules", "remove", "nightly"]);
    assert!(removed.contains("schedule nightly removed"), "{removed}");
    let refused = leash(&server, &["schedules", "show", "nightly"]);
    assert_ne!(refused.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no schedule \"nightly\""), "{refused:?}");
    let (_, trail) = server.call(Method::GET, "/v1/audit?limit=100", None).await;
    let rows: Vec<(String, String, String)> = trail["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"].as_str().unwrap().starts_with("schedule."))
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (field("action"), field("target"), field("principal"))
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        ("schedule.add", "nightly", "admin"),
        ("schedule.resume", "nightly", "admin"),
        ("schedule.trigger", "nightly", "admin"),
        ("schedule.pause", "nightly", "admin"),
        ("schedule.add", "sams", "sam"),
        ("schedule.trigger", "sams", "admin"),
        ("schedule.remove", "nightly", "admin"),
    ]
    .iter()
    .map(|(a, t, p)| (a.to_string(), t.to_string(), p.to_string()))
    .collect();
    assert_eq!(rows, expected);
}

/// Two `leash serve` processes on one store, each running a scheduler on
/// the real clock, fire a schedule due every second for 60 firings: every
/// firing from the schedule's creation to its last is taken once, and
/// submitted one job (none skipped, none twice). On `db`, with each
/// server's token in its own file.
async fn two_servers_fire_each_of_sixty_firings_once_on(db: &std::ffi::OsStr, dir: &std::path::Path) {
    let a = Server::start_on(db, &dir.join("a.token"), &[], |_| {});
    let b = Server::start_on(db, &dir.join("b.token"), &[], |_| {});
    a.add_plugin("hello").await;
    let body = json!({
        "name": "each-second",
        "cron": "* * * * * *",
        "overlap": "allow",
        "catch_up": "all",
        "job": { "plugin": "hello" },
    });
    let (status, added) = a.call(Method::POST, "/v1/schedules", Some(body)).await;
    assert_eq!(status, 201, "{added}");
    let within = std::time::Duration::from_secs(150);
    crate::support::eventually_within(within, "60 firings", async || {
        let (_, shown) = b.call(Method::GET, "/v1/schedules/each-second", None).await;
        (shown["fired"].as_u64()? >= 60).then_some(())
    })
    .await;
    let (_, paused) = b.call(Method::POST, "/v1/schedules/each-second/pause", None).await;
    let seconds = |field: &str| {
        let text = paused[field].as_str().unwrap();
        leash::clock::Timestamp::parse_rfc3339(text).unwrap().unix_ms().div_euclid(1000)
    };
    // Firings are whole seconds after the creation, up to the last taken.
    let firings = (seconds("last_fired_at") - seconds("created_at")) as u64;
    let (fired, skipped) = (paused["fired"].as_u64().unwrap(), paused["skipped"].as_u64().unwrap());
    assert_eq!((fired, skipped), (firings, 0), "every firing submitted exactly one job: {paused}");
    let (_, page) = a.call(Method::GET, "/v1/jobs?schedule=each-second&limit=500", None).await;
    assert_eq!(page["jobs"].as_array().unwrap().len() as u64, fired, "one job per firing taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a minute of real firings: the long step runs it"]
async fn two_servers_fire_each_of_sixty_firings_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    two_servers_fire_each_of_sixty_firings_once_on(dir.path().join("s.db").as_os_str(), dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a minute of real firings: the long step runs it"]
async fn two_servers_fire_each_of_sixty_firings_once_on_postgres() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = crate::support::pg::Schema::create(&url).await;
    let dir = tempfile::tempdir().unwrap();
    two_servers_fire_each_of_sixty_firings_once_on(std::ffi::OsStr::new(&schema.url), dir.path()).await;
}
