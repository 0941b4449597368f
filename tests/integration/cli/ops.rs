//! The operator CLI: the real `leash` binary against a real server, and on
//! a local database.

use std::process::Output;

use serde_json::Value;

use crate::support::server::{Server, leash_bin};
use crate::support::{GENEROUS, eventually_blocking};

/// Run `leash <args>` against `server`.
pub(crate) fn leash(server: &Server, args: &[&str]) -> Output {
    leash_bin()
        .args(args)
        .args(["--server", &server.url, "--token-file"])
        .arg(&server.token_file)
        .output()
        .expect("run leash")
}

/// `leash` against `server` as the principal whose token is `token`.
pub(crate) fn leash_as(server: &Server, token: &str, args: &[&str]) -> Output {
    leash_bin().args(args).args(["--server", &server.url]).env("LEASH_API_TOKEN", token).output().expect("run leash")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!("not JSON ({e}): {}\nstderr: {}", stdout(output), String::from_utf8_lossy(&output.stderr))
    })
}

#[tokio::test]
async fn submit_wait_prints_the_output_of_hello() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let input = dir.path().join("in.json");
    std::fs::write(&input, r#"{"name":"CLI"}"#).unwrap();
    let hello = leash_tests::plugin_path("hello");
    let output =
        leash(&server, &["submit", hello.to_str().unwrap(), "--input", input.to_str().unwrap(), "--wait", "30s"]);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    let greeting: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(greeting["greeting"], "Hello, CLI!");

    // By registry name, with --json: the job and its output.
    let added = leash(&server, &["plugins", "add", hello.to_str().unwrap(), "--version", "2.0.0", "--json"]);
    assert_eq!(json(&added)["version"], "2.0.0");
    let output = leash(&server, &["submit", "hello@2.0.0", "--wait", "30s", "--json"]);
    let answer = json(&output);
    assert_eq!(answer["job"]["status"], "succeeded");
    assert_eq!(answer["output"]["greeting"], "Hello, world!");
}

#[tokio::test]
async fn a_running_coop_job_is_cancelled_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let coop = leash_tests::plugin_path("coop");
    let submitted = leash(&server, &["submit", coop.to_str().unwrap()]);
    assert_eq!(submitted.status.code(), Some(0));
    let id = stdout(&submitted).trim().to_owned();
    eventually_blocking("the job runs", || {
        (json(&leash(&server, &["jobs", "show", &id, "--json"]))["status"] == "running").then_some(())
    });
    let cancelled = leash(&server, &["jobs", "cancel", &id]);
    assert_eq!(cancelled.status.code(), Some(0));
    assert_eq!(stdout(&cancelled).trim(), format!("{id} cancel requested"));
    let waited = leash(&server, &["jobs", "wait", &id, "--json"]);
    assert_eq!(waited.status.code(), Some(4), "a cancelled job exits 4");
    assert_eq!(json(&waited)["job"]["status"], "cancelled");
    let again = leash(&server, &["jobs", "cancel", &id]);
    assert_eq!(again.status.code(), Some(7), "cancelling a finished job is refused (409)");
}

#[tokio::test]
async fn every_command_prints_json_that_parses() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let hello = leash_tests::plugin_path("hello");
    leash(&server, &["plugins", "add", hello.to_str().unwrap()]);
    let done = json(&leash(&server, &["submit", "hello", "--wait", "30s", "--json"]));
    let id = done["job"]["id"].as_str().unwrap().to_owned();
    let plugins = json(&leash(&server, &["plugins", "list", "--json"]));
    assert_eq!(plugins["plugins"][0]["name"], "hello");
    assert_eq!(json(&leash(&server, &["plugins", "show", "hello", "--json"]))["name"], "hello");
    assert_eq!(json(&leash(&server, &["jobs", "list", "--json"]))["jobs"][0]["id"], id.as_str());
    assert_eq!(json(&leash(&server, &["jobs", "show", &id, "--json"]))["status"], "succeeded");
    assert!(json(&leash(&server, &["jobs", "logs", &id, "--json"]))["records"].is_array());
    assert_eq!(json(&leash(&server, &["diagnostics", "--json"]))["health"]["counts"]["succeeded"], 1);
    let queued = json(&leash(&server, &["submit", "hello", "--json"]));
    assert_eq!(queued["status"], "queued");

    // Tables for people.
    let table = stdout(&leash(&server, &["jobs", "list"]));
    assert!(table.contains("STATUS") && table.contains(&id), "{table}");
    let logs = stdout(&leash(&server, &["jobs", "logs", &id]));
    assert!(logs.contains("[info]"), "{logs}");
}

#[tokio::test]
async fn failures_exit_with_their_documented_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &[]);
    let unknown = leash(&server, &["jobs", "show", "01M8NXTW9W53S6M6JQYFF54HBH"]);
    assert_eq!(unknown.status.code(), Some(2), "unknown job");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no job"));
    let no_plugin = leash(&server, &["submit", "nobody"]);
    assert_eq!(no_plugin.status.code(), Some(2), "unknown plugin");
    let wrong =
        leash_bin().args(["jobs", "list", "--server", &server.url]).env("LEASH_API_TOKEN", "wrong").output().unwrap();
    assert_eq!(wrong.status.code(), Some(7), "bad token: {}", String::from_utf8_lossy(&wrong.stderr));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let unreachable =
        leash_bin().args(["jobs", "list", "--server", &closed]).env("LEASH_API_TOKEN", "t").output().unwrap();
    assert_eq!(unreachable.status.code(), Some(8));
    let help = stdout(&leash_bin().args(["jobs", "--help"]).output().unwrap());
    for code in ["  7 ", "  8 "] {
        assert!(help.contains(code), "exit code {code} documented: {help}");
    }
}

#[tokio::test]
async fn commands_work_on_a_local_database_without_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("local.db");
    let local = |args: &[&str]| leash_bin().args(args).arg("--db").arg(&db).output().unwrap();
    let hello = leash_tests::plugin_path("hello");
    let added = local(&["plugins", "add", hello.to_str().unwrap(), "--name", "greeter", "--json"]);
    assert_eq!(json(&added)["name"], "greeter");
    let queued = json(&local(&["submit", "greeter", "--json"]));
    let id = queued["job_id"].as_str().unwrap().to_owned();
    let cancelled = local(&["jobs", "cancel", &id, "--json"]);
    assert_eq!(json(&cancelled)["status"], "cancelled");
    let done = local(&["submit", "greeter", "--work", "--wait", "30s", "--json"]);
    assert_eq!(done.status.code(), Some(0));
    assert_eq!(json(&done)["job"]["status"], "succeeded");
    let listed = json(&local(&["jobs", "list", "--plugin", "greeter", "--json"]));
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 2);
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&db).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "the database is private to its owner");
}

/// `submit --wait` says which job it waits for and narrates each retry:
/// the attempt that failed, why, and when and which the next is; `jobs
/// show` and `jobs attempts` then list both attempts.
#[test]
fn submit_wait_narrates_retries_and_jobs_show_lists_the_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("local.db");
    let input = dir.path().join("in.json");
    std::fs::write(&input, r#"{"kind":"retryable","message":"upstream busy"}"#).unwrap();
    let local = |args: &[&str]| leash_bin().args(args).arg("--db").arg(&db).output().unwrap();
    let fail = leash_tests::plugin_path("fail");
    let done = local(&[
        "submit",
        fail.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--max-attempts",
        "2",
        "--retry-backoff",
        "500ms",
        "--work",
        "--wait",
        "30s",
    ]);
    assert_eq!(done.status.code(), Some(1), "the plugin's error");
    let said = String::from_utf8_lossy(&done.stderr);
    let id = said.split("leash: job ").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap_or_else(|| {
        panic!("no job id: {said}");
    });
    assert!(said.contains(&format!("leash: job {id} queued; waiting")), "{said}");
    // "retrying in 0.4 s" when a poll sees it queued for its backoff
    // (one does unless the machine stalls past it), else "retrying".
    assert!(said.contains("leash: attempt 1 failed (guest_error: Retryable: upstream busy); retrying"), "{said}");
    assert!(said.contains(" (2 of 2)\n"), "{said}");

    let shown = stdout(&local(&["jobs", "show", id]));
    for needle in ["RUN", "ENDED AS", "retried", "guest_error: Retryable: upstream busy", "failed"] {
        assert!(shown.contains(needle), "{needle}: {shown}");
    }
    let attempts = json(&local(&["jobs", "attempts", id, "--json"]));
    let outcomes: Vec<&str> =
        attempts["attempts"].as_array().unwrap().iter().map(|a| a["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["retried", "failed"], "{attempts}");

    // Run again (redrive): queued in place with a fresh set of attempts;
    // a second retry of the queued job is refused, saying why.
    let again = local(&["jobs", "retry", id]);
    assert_eq!(stdout(&again), format!("{id} queued again\n"), "{}", String::from_utf8_lossy(&again.stderr));
    let job = json(&local(&["jobs", "show", id, "--json"]));
    assert_eq!(
        (job["status"].as_str(), job["retries"].as_u64(), &job["error_message"]),
        (Some("queued"), Some(0), &Value::Null)
    );
    let refused = local(&["jobs", "retry", id]);
    assert_eq!(refused.status.code(), Some(7), "refused by the server");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("is queued: only a failed or cancelled job can be retried"), "{said}");
}

/// `plugins add` on a local database compiles what it registers into the
/// compile cache the workers on the machine read: a worker's first job of
/// it loads the compiled code (and says so in its log), never compiles.
#[test]
fn plugins_add_compiles_into_the_cache_the_workers_read() {
    let dir = tempfile::tempdir().unwrap();
    let (db, cache) = (dir.path().join("local.db"), dir.path().join("cache"));
    let local =
        |args: &[&str]| leash_bin().args(args).arg("--db").arg(&db).env("LEASH_CACHE_DIR", &cache).output().unwrap();
    let hello = leash_tests::plugin_path("hello");
    assert!(local(&["plugins", "add", hello.to_str().unwrap(), "--name", "greeter"]).status.success());
    let entries: Vec<_> = walkdir(&cache).into_iter().filter(|p| p.extension().is_some_and(|e| e == "cwasm")).collect();
    assert_eq!(entries.len(), 1, "{entries:?}");

    let done = json(&local(&["submit", "greeter", "--work", "--wait", "30s", "--json"]));
    assert_eq!(done["job"]["status"], "succeeded");
    let id = done["job"]["id"].as_str().unwrap();
    let logs = json(&local(&["jobs", "logs", id, "--json"]));
    let first = &logs["records"][0];
    assert!(
        first["message"].as_str().unwrap().contains("while its plugin was loaded from the compile cache"),
        "{logs}"
    );
    assert!(first["fields"].as_array().unwrap().iter().any(|f| f[0] == "leash.compile_cached" && f[1] == "true"));
}

fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { found.extend(walkdir(&path)) } else { found.push(path) }
    }
    found
}

/// The job timeout and attempts are server-side defaults, read
/// from the same variables by `serve`, `worker` and a local submit; and a
/// submit can delay its job.
#[test]
fn server_side_defaults_apply_to_jobs_that_set_none_and_jobs_can_be_delayed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("local.db");
    let hello = leash_tests::plugin_path("hello");
    let local = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = leash_bin();
        command.args(args).arg("--db").arg(&db);
        for (key, value) in env {
            command.env(key, value);
        }
        command.output().expect("run leash")
    };
    let env = [("LEASH_JOB_TIMEOUT", "7s"), ("LEASH_MAX_ATTEMPTS", "3"), ("LEASH_RETRY_BACKOFF", "2s")];
    let queued = local(&["submit", hello.to_str().unwrap(), "--delay", "1h", "--json"], &env);
    assert_eq!(queued.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&queued.stderr));
    let id = json(&queued)["job_id"].as_str().unwrap().to_owned();
    let job = json(&local(&["jobs", "show", &id, "--json"], &[]));
    assert_eq!(job["limits"]["timeout_ms"], 7000, "{job}");
    assert_eq!(job["max_attempts"], 3, "{job}");
    assert_eq!(job["backoff"]["base_ms"], 2000, "{job}");
    let created = leash::clock::Timestamp::parse_rfc3339(job["created_at"].as_str().unwrap()).unwrap();
    let due = leash::clock::Timestamp::parse_rfc3339(job["run_after"].as_str().unwrap()).unwrap();
    assert!((3_599_000..=3_601_000).contains(&(due.unix_ms() - created.unix_ms())), "{job}");
    // A flag beats the default; a bad default is refused by name.
    let explicit =
        local(&["submit", hello.to_str().unwrap(), "--timeout", "9s", "--max-attempts", "1", "--json"], &env);
    let id = json(&explicit)["job_id"].as_str().unwrap().to_owned();
    let job = json(&local(&["jobs", "show", &id, "--json"], &[]));
    assert_eq!((job["limits"]["timeout_ms"].as_u64(), job["max_attempts"].as_u64()), (Some(9000), Some(1)));
    let bad = local(
        &["submit", hello.to_str().unwrap()],
        &[("LEASH_RETRY_BACKOFF", "10s"), ("LEASH_RETRY_BACKOFF_CAP", "1s")],
    );
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("LEASH_RETRY_BACKOFF"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let worker = leash_bin()
        .args(["worker", "--db"])
        .arg(&db)
        .args(["--retry-backoff", "10s", "--retry-backoff-cap", "1s"])
        .output()
        .unwrap();
    assert_eq!(worker.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&worker.stderr).contains("--retry-backoff"));
}

/// `leash serve --log-format json`: every stderr line is one JSON object;
/// job events carry the job id, attempt, worker and plugin; guest records
/// are forwarded at the chosen level (quoted); `LEASH_LOG` filters.
#[tokio::test]
async fn serve_logs_one_json_object_per_line_with_job_ids() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let token_file = dir.path().join("s.token");
    let mut child = leash_bin()
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json", "--guest-logs", "info", "--db"])
        .arg(&db)
        .arg("--token-file")
        .arg(&token_file)
        .env("LEASH_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first: Value = loop {
        let line = rx.recv_timeout(GENEROUS).expect("serve logs its start");
        let event: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if event["message"].as_str().unwrap_or_default().contains("serving ") {
            break event;
        }
    };
    let message = first["message"].as_str().unwrap();
    let url = message.split("serving ").nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    let token = std::fs::read_to_string(&token_file).unwrap().trim().to_owned();
    let http = reqwest::Client::new();
    let upload = http
        .post(format!("{url}/v1/plugins?name=hello"))
        .bearer_auth(&token)
        .body(leash_tests::plugin_bytes("hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status().as_u16(), 201);
    let answer: Value = http
        .post(format!("{url}/v1/jobs"))
        .bearer_auth(&token)
        .json(&serde_json::json!({ "plugin": "hello", "input": { "name": "Log" } }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = answer["job"]["id"].as_str().unwrap().to_owned();
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait().unwrap().success());
    reader.join().unwrap();
    let events: Vec<Value> = rx
        .try_iter()
        .map(|line| serde_json::from_str(&line).unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}")))
        .collect();
    let of_job: Vec<&Value> = events.iter().filter(|e| e["span"]["job_id"] == id.as_str()).collect();
    let finished = of_job.iter().find(|e| e["message"] == "finished").expect("a finished event for the job");
    assert_eq!(finished["status"], "succeeded");
    assert_eq!(finished["span"]["attempt"], 1);
    assert!(finished["span"]["worker_id"].as_str().unwrap().starts_with("worker-"));
    assert!(finished["span"]["plugin"].as_str().unwrap().starts_with("sha256:"));
    let guest = of_job.iter().find(|e| e["target"] == "leash::guest").expect("the guest's record, forwarded");
    assert_eq!(guest["message"], "\"greeting Log\"", "{guest}");
    assert!(events.iter().any(|e| e["message"] == "stopped"), "the shutdown is logged");
    let dashboard = format!("dashboard: {url}/ui (sign in with the API token in {})", token_file.display());
    assert!(events.iter().any(|e| e["message"] == dashboard.as_str()), "the dashboard's address is said: {events:?}");
}

#[test]
fn a_bad_log_filter_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let output = leash_bin()
        .args(["worker", "--db"])
        .arg(dir.path().join("w.db"))
        .env("LEASH_LOG", "leash=notalevel")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("LEASH_LOG"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_secrets_given_at_registration_reach_durable_jobs_and_a_revoke_stops_later_ones() {
    let upstream = crate::support::Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets");
    std::fs::write(&secrets, "TOKEN=from-the-secrets-file\n").unwrap();
    std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--secrets-file", secrets.to_str().unwrap()]);
    let input = dir.path().join("in.json");
    std::fs::write(&input, serde_json::json!({ "url": upstream.url("/hello") }).to_string()).unwrap();
    let input = input.to_str().unwrap();
    let plugin = leash_tests::plugin_path("http-get");
    let rule = format!("GET {}", upstream.url(""));
    // The CLI blocks; the upstream answers on the runtime meanwhile.
    let server = std::sync::Arc::new(server);
    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let call = |args: Vec<String>| {
        let server = server.clone();
        tokio::task::spawn_blocking(move || leash(&server, &args.iter().map(String::as_str).collect::<Vec<_>>()))
    };

    let added = call(owned(&[
        "plugins",
        "add",
        plugin.to_str().unwrap(),
        "--name",
        "http-get",
        "--version",
        "1",
        "--allow-host",
        &rule,
        "--http-requests",
        "3",
        "--json",
    ]))
    .await
    .unwrap();
    let added = json(&added);
    assert_eq!(added["grants"]["http"]["hosts"], serde_json::json!([rule]), "{added}");
    assert_eq!(added["grants"]["http"]["limits"]["requests"], 3);

    let done = call(owned(&["submit", "http-get@1", "--input", input, "--wait", "30s", "--json"])).await.unwrap();
    let done = json(&done);
    assert_eq!(done["job"]["status"], "succeeded", "{done}");
    assert_eq!(done["output"]["body_start"], "hello");
    assert_eq!(done["job"]["grants"]["http"]["hosts"], serde_json::json!([rule]), "the job shows its grants");
    assert_eq!(upstream.received(), vec!["GET /hello".to_owned()]);

    let revoked = call(owned(&["plugins", "grant", "http-get@1"])).await.unwrap();
    assert_eq!(revoked.status.code(), Some(0));
    assert!(stdout(&revoked).contains("grants nothing"), "{}", stdout(&revoked));
    let denied = call(owned(&["submit", "http-get@1", "--input", input, "--wait", "30s", "--json"])).await.unwrap();
    let denied = json(&denied);
    assert_eq!(denied["job"]["status"], "failed", "{denied}");
    assert!(denied["job"]["error_message"].as_str().unwrap().contains("HttpRequestDenied"), "{denied}");
    assert!(denied["job"].get("grants").is_none(), "nothing granted, nothing shown: {denied}");
    assert_eq!(upstream.received().len(), 1, "the later job sent nothing");
    let metrics = server.request(reqwest::Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    for line in ["leash_http_requests_total{result=\"sent\"} 1", "leash_http_requests_total{result=\"denied\"} 1"] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in the metrics");
    }

    // A secret, set on the server from a file, bound to the upstream.
    let secret_input = dir.path().join("secret.json");
    let echo =
        serde_json::json!({ "url": upstream.url("/echo-auth"), "headers": { "authorization": "{secret:TOKEN}" } });
    std::fs::write(&secret_input, echo.to_string()).unwrap();
    let bind = format!("TOKEN={}", upstream.url(""));
    let granted =
        call(owned(&["plugins", "grant", "http-get@1", "--allow-host", &rule, "--secret", &bind])).await.unwrap();
    assert!(stdout(&granted).contains(&format!("secret TOKEN to {}", upstream.url(""))), "{}", stdout(&granted));
    let done =
        call(owned(&["submit", "http-get@1", "--input", secret_input.to_str().unwrap(), "--wait", "30s", "--json"]))
            .await
            .unwrap();
    let done = json(&done);
    assert_eq!(done["job"]["status"], "succeeded", "{done}");
    assert_eq!(upstream.received().last().unwrap(), "GET /echo-auth authorization=from-the-secrets-file");
    assert_eq!(done["output"]["body_start"], "{secret:TOKEN}", "the stored output names the secret: {done}");

    // An effect: recorded in the ledger before it was sent, with its key.
    let post_input = dir.path().join("post.json");
    let post = serde_json::json!({ "url": upstream.url("/hello?q=secret-query"), "method": "POST", "body": "x" });
    std::fs::write(&post_input, post.to_string()).unwrap();
    call(owned(&["plugins", "grant", "http-get@1", "--allow-host", &upstream.url("")])).await.unwrap();
    let done =
        call(owned(&["submit", "http-get@1", "--input", post_input.to_str().unwrap(), "--wait", "30s", "--json"]))
            .await
            .unwrap();
    let done = json(&done);
    let id = done["job"]["id"].as_str().unwrap().to_owned();
    assert_eq!(done["job"]["status"], "succeeded", "{done}");
    let key = format!("{id}/1");
    assert_eq!(upstream.received().last().unwrap(), &format!("POST /hello?q=secret-query idempotency-key={key}"));
    let effects = json(&call(owned(&["jobs", "effects", &id, "--json"])).await.unwrap());
    let effect = &effects["effects"][0];
    assert_eq!(effects["effects"].as_array().unwrap().len(), 1, "{effects}");
    assert_eq!((effect["method"].as_str(), effect["status"].as_u64()), (Some("POST"), Some(200)));
    assert_eq!((effect["attempt"].as_u64(), effect["idempotency_key"].as_str()), (Some(1), Some(key.as_str())));
    assert_eq!(effect["url"], upstream.url("/hello"), "the query is not recorded");
    let table = call(owned(&["jobs", "effects", &id])).await.unwrap();
    assert!(stdout(&table).contains("POST") && stdout(&table).contains(&key), "{}", stdout(&table));

    // Configuration, granted at registration, pinned on the job.
    let config_read = leash_tests::plugin_path("config-read");
    let added = call(owned(&[
        "plugins",
        "add",
        config_read.to_str().unwrap(),
        "--name",
        "config-read",
        "--version",
        "1",
        "--config-var",
        "region=eu-west",
        "--json",
    ]))
    .await
    .unwrap();
    assert_eq!(json(&added)["grants"]["config"], serde_json::json!({ "region": "eu-west" }));
    let done = call(owned(&["submit", "config-read@1", "--wait", "30s", "--json"])).await.unwrap();
    let done = json(&done);
    assert_eq!(done["output"]["all"], serde_json::json!({ "region": "eu-west" }), "{done}");
    assert_eq!(done["job"]["grants"]["config"], serde_json::json!({ "region": "eu-west" }));

    let unknown = call(owned(&["plugins", "grant", "nobody@1", "--allow-host", &rule])).await.unwrap();
    assert_eq!(unknown.status.code(), Some(2), "an unknown registration is refused (404)");
    let unversioned = call(owned(&["plugins", "grant", "http-get", "--allow-host", &rule])).await.unwrap();
    assert_eq!(unversioned.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unversioned.stderr).contains("name the version"));
}

/// `leash submit --batch`: JSON lines sent a thousand to a request; a bad
/// line is named, and what was queued before it is said.
#[test]
fn submit_batch_queues_json_lines_in_requests_of_a_thousand() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("local.db");
    let local = |args: &[&str]| leash_bin().args(args).arg("--db").arg(&db).output().unwrap();
    let hello = leash_tests::plugin_path("hello");
    assert_eq!(local(&["plugins", "add", hello.to_str().unwrap(), "--name", "greeter"]).status.code(), Some(0));

    // 1,500 jobs (two requests), with a blank line in between.
    let mut lines: Vec<String> =
        (0..1500).map(|i| format!(r#"{{"plugin":"greeter","input":{{"name":"n{i}"}}}}"#)).collect();
    lines.insert(700, String::new());
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let output = local(&["submit", "--batch", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    let ids: Vec<String> = stdout(&output).lines().map(str::to_owned).collect();
    assert_eq!(ids.len(), 1500, "one id per job");
    assert_eq!(ids.iter().collect::<std::collections::HashSet<_>>().len(), 1500);
    let shown = json(&local(&["jobs", "show", &ids[1499], "--json"]));
    assert_eq!(shown["status"], "queued");

    // A line that is not JSON: refused before anything is sent.
    std::fs::write(&file, "{\"plugin\":\"greeter\"}\n{not json\n").unwrap();
    let output = local(&["submit", "--batch", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");

    // A job the server refuses on line 1,003: the first request's 1,000
    // jobs stay queued, the second request queues nothing, and the line
    // is named.
    let mut lines: Vec<String> = (0..1010).map(|_| r#"{"plugin":"greeter"}"#.to_owned()).collect();
    lines[1002] = r#"{"plugin":"greeter","memory_bytes":1099511627776}"#.to_owned();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let output = local(&["submit", "--batch", file.to_str().unwrap()]);
    assert_ne!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("lines 1001–1010 were refused (the job on line 1003)"), "{stderr}");
    assert!(stderr.contains("the 1000 jobs of the lines before were queued"), "{stderr}");
    assert_eq!(stdout(&output).lines().count(), 1000, "the queued jobs' ids are printed");
    let health = json(&local(&["diagnostics", "--json"]));
    assert_eq!(health["health"]["counts"]["queued"], 2500, "1,500 + 1,000 queued: {health}");

    // --batch with a job's own flag is a usage error.
    let output = local(&["submit", "--batch", file.to_str().unwrap(), "--fuel", "10"]);
    assert_eq!(output.status.code(), Some(2));
}

/// `leash diagnostics` counts the jobs waiting for an approval in its
/// queue line, beside the queued ones.
#[test]
fn diagnostics_counts_jobs_waiting_for_approval_in_the_queue_line() {
    use crate::cli::audit::{leash, ok};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("d.db");
    let db = db.to_str().unwrap();
    let hello = leash_tests::plugin_path("hello");
    ok(leash(db, None, &["plugins", "add", hello.to_str().unwrap(), "--name", "hello", "--version", "1"]));
    ok(leash(db, None, &["plugins", "approval", "hello@1", "--require", "execute"]));
    ok(leash(db, None, &["submit", "hello@1"]));
    let said = ok(leash(db, None, &["diagnostics"]));
    assert!(said.contains("waiting for approval 1, approved (waiting for a run) 0, queued 0"), "{said}");
}

/// A plugin's grants print one to a line in `plugins add` and `plugins
/// show`, never joined by a literal `\n`.
#[test]
fn grants_print_one_to_a_line() {
    use crate::cli::audit::{leash, ok};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("g.db");
    let db = db.to_str().unwrap();
    let hello = leash_tests::plugin_path("hello");
    let hosts = ["--allow-host", "https://api.example.com", "--allow-host", "POST http://127.0.0.1:8080"];
    let added =
        ok(leash(db, None, &[&["plugins", "add", hello.to_str().unwrap(), "--name", "hello"][..], &hosts].concat()));
    let shown = ok(leash(db, None, &["plugins", "show", "hello"]));
    for said in [&added, &shown] {
        assert!(!said.contains("\\n"), "{said}");
        assert!(said.lines().any(|l| l.contains("http") && l.contains("https://api.example.com")), "{said}");
        assert!(said.lines().any(|l| l.contains("POST http://127.0.0.1:8080")), "{said}");
    }
}
