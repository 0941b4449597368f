//! `GET /v1/jobs/{id}/why` and `leash jobs why` against a real `leash
//! serve`: the answer of a job waiting its turn behind a busy slot, the
//! pool's figures to the `operate` role only, and an unknown job refused.

use reqwest::Method;
use serde_json::json;

use crate::cli::ops::{leash, leash_as};
use crate::support::eventually;
use crate::support::server::Server;

#[tokio::test]
async fn why_answers_over_http_and_the_cli_and_shows_the_pool_to_operators_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("s.db"), &["--max-workers", "1"]);
    server.add_plugin("hello").await;
    server.add_plugin("sleep").await;
    let submitter = server.principal("sam", &["submit"]).await;

    let (status, sleeper) =
        server.call(Method::POST, "/v1/jobs", Some(json!({ "plugin": "sleep", "execution": "async" }))).await;
    assert_eq!(status, 202, "{sleeper}");
    let sleeper = sleeper["job_id"].as_str().unwrap().to_owned();
    let (status, waiting) = server
        .call_as(&submitter, Method::POST, "/v1/jobs", Some(json!({ "plugin": "hello", "execution": "async" })))
        .await;
    assert_eq!(status, 202, "{waiting}");
    let waiting = waiting["job_id"].as_str().unwrap().to_owned();
    let path = format!("/v1/jobs/{waiting}/why");

    let why = eventually("the sleeper holds the one slot", async || {
        let (status, why) = server.call(Method::GET, &path, None).await;
        assert_eq!(status, 200, "{why}");
        Some(why).filter(|w| w["reason"] == "waiting_turn" && w["evidence"]["slots_busy"] == 1)
    })
    .await;
    assert!(why["sentence"].as_str().unwrap().ends_with("1 of 1 slots busy on 1 worker"), "{why}");
    assert_eq!(why["evidence"]["ahead"], 0, "{why}");

    let (status, own) = server.call_as(&submitter, Method::GET, &path, None).await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(own["reason"], "waiting_turn");
    assert!(own["sentence"].as_str().unwrap().contains("shown to the `operate` role"), "{own}");
    assert!(own["evidence"].get("ahead").is_none() && own["evidence"].get("slots").is_none(), "{own}");

    let said = leash(&server, &["jobs", "why", &waiting]);
    assert_eq!(said.status.code(), Some(0), "{}", String::from_utf8_lossy(&said.stderr));
    let text = String::from_utf8_lossy(&said.stdout);
    let mut lines = text.lines();
    assert!(lines.next().is_some_and(|l| l.starts_with("due ") && l.contains("1 of 1 slots busy")), "{text}");
    assert!(lines.any(|l| l == "  ahead: 0"), "the evidence follows, one fact a line: {text}");
    let as_json = leash_as(&server, &submitter, &["jobs", "why", &waiting, "--json"]);
    let value: serde_json::Value = serde_json::from_slice(&as_json.stdout).unwrap();
    assert_eq!(value["reason"], "waiting_turn");

    let (status, _) = server.call(Method::GET, "/v1/jobs/01M8NXTW9W53S6M6JQYFF54HBH/why", None).await;
    assert_eq!(status, 404);
    let (status, _) = server.call(Method::POST, &format!("/v1/jobs/{sleeper}/cancel"), None).await;
    assert_eq!(status, 202);
}
