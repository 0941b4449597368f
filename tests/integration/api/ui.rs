//! The dashboard (`/ui`): its session and headers over plain HTTP, and what
//! an operator does with it in a real headless Chromium.

use serde_json::{Value, json};

use crate::support::server::Server;
use crate::support::webdriver::Browser;

/// Sign in with `token`: the answer's status and session cookie, if any.
async fn sign_in(server: &Server, token: &str, origin: Option<&str>) -> (u16, Option<String>) {
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    // The tokens here are hex and dashes: nothing to percent-encode.
    let mut request = client
        .post(format!("{}/ui/login", server.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"));
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    let response = request.send().await.unwrap();
    let cookie = response.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_owned());
    (response.status().as_u16(), cookie)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_comes_only_from_the_token_and_changes_need_this_servers_origin() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &[]);
    server.add_plugin("hello").await;
    let origin = server.url.clone();
    let http = reqwest::Client::new();

    // Without a session: the sign-in form and nothing else.
    let page = http.get(format!("{}/ui", server.url)).send().await.unwrap();
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    for rule in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(rule), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline") && !csp.contains("http"), "no inline script, no other origin: {csp}");
    let text = page.text().await.unwrap();
    assert!(text.contains(r#"name="token""#) && !text.contains("<script"), "{text}");
    for path in ["/ui/app.js", "/ui/common.js", "/ui/jobs.js", "/v1/jobs", "/v1/events", "/v1/workers"] {
        let status = http.get(format!("{}{path}", server.url)).send().await.unwrap().status().as_u16();
        assert_eq!(status, 401, "{path} without a session");
    }

    // A wrong token, or a sign-in posted from another site, gets no cookie.
    assert_eq!(sign_in(&server, "not-the-token", Some(&origin)).await, (401, None));
    assert_eq!(sign_in(&server, &server.token, Some("http://evil.example")).await, (403, None));
    assert_eq!(sign_in(&server, &server.token, None).await, (403, None));
    let (status, cookie) = sign_in(&server, &server.token, Some(&origin)).await;
    assert_eq!(status, 303);
    let cookie = cookie.expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(!cookie.contains(&server.token), "the cookie is not the token: {cookie}");
    let session = cookie.split(';').next().unwrap().to_owned();

    // With it: the API reads; a change needs this server's Origin.
    let with_session = |method: reqwest::Method, path: &str| {
        http.request(method, format!("{}{path}", server.url)).header("cookie", &session)
    };
    assert_eq!(with_session(reqwest::Method::GET, "/v1/jobs").send().await.unwrap().status().as_u16(), 200);
    let script = with_session(reqwest::Method::GET, "/ui/app.js").send().await.unwrap();
    assert_eq!(script.headers()["content-type"], "text/javascript; charset=utf-8");
    let body = json!({ "plugin": "hello", "execution": "async", "gate": "approval" });
    let submit = |origin: Option<&str>| {
        let mut request = with_session(reqwest::Method::POST, "/v1/jobs").json(&body);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    assert_eq!(submit(None).await.unwrap().status().as_u16(), 403, "no Origin");
    assert_eq!(submit(Some("http://evil.example")).await.unwrap().status().as_u16(), 403, "another site");
    let answer = submit(Some(&origin)).await.unwrap();
    assert_eq!(answer.status().as_u16(), 202);
    let job: Value = answer.json().await.unwrap();
    let (status, _) =
        server.call(reqwest::Method::GET, &format!("/v1/jobs/{}", job["job_id"].as_str().unwrap()), None).await;
    assert_eq!(status, 200, "the job exists");

    // A forged or altered cookie is no session.
    let forged = format!("{}0", session);
    let status = http.get(format!("{}/v1/jobs", server.url)).header("cookie", forged).send().await.unwrap().status();
    assert_eq!(status.as_u16(), 401);
    // Signing out clears the cookie.
    let out = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let answer = out
        .post(format!("{}/ui/logout", server.url))
        .header("cookie", &session)
        .header("origin", &origin)
        .send()
        .await
        .unwrap();
    assert!(answer.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    // And ends the session: the cookie, kept by hand, is refused from now
    // on, here and by any server sharing the database.
    let after = http.get(format!("{}/v1/jobs", server.url)).header("cookie", &session).send().await.unwrap();
    assert_eq!(after.status().as_u16(), 401, "a signed-out cookie");
    let page = http.get(format!("{}/ui", server.url)).header("cookie", &session).send().await.unwrap();
    assert!(page.text().await.unwrap().contains(r#"name="token""#), "the sign-in form again");
}

/// A session signed in with a principal's token is that principal: it is
/// who `whoami` names, whose roles gate what the page may do, and whom a
/// submit or a decision records; revoking the token ends the session at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_the_principal_whose_token_signed_in_and_ends_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &[]);
    server.add_plugin("hello").await;
    let origin = server.url.clone();
    let http = reqwest::Client::new();
    let olive = server.principal("olive", &["submit", "approve"]).await;
    let (status, cookie) = sign_in(&server, &olive, Some(&origin)).await;
    assert_eq!(status, 303);
    let session = cookie.expect("a session cookie").split(';').next().unwrap().to_owned();
    let with_session = |method: reqwest::Method, path: &str| {
        http.request(method, format!("{}{path}", server.url)).header("cookie", &session).header("origin", &origin)
    };
    let me: Value = with_session(reqwest::Method::GET, "/v1/whoami").send().await.unwrap().json().await.unwrap();
    assert_eq!((me["name"].as_str(), &me["roles"]), (Some("olive"), &json!(["submit", "approve"])), "{me}");
    let body = json!({ "plugin": "hello", "execution": "async", "gate": "approval" });
    let answer: Value =
        with_session(reqwest::Method::POST, "/v1/jobs").json(&body).send().await.unwrap().json().await.unwrap();
    let id = answer["job_id"].as_str().unwrap().to_owned();
    let (_, job) = server.call(reqwest::Method::GET, &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(job["submitted_by"], "olive", "{job}");
    // Its own job: separation of duties holds in the dashboard too.
    let own = with_session(reqwest::Method::POST, &format!("/v1/jobs/{id}/approve")).json(&json!({})).send().await;
    let own = own.unwrap();
    assert_eq!(own.status().as_u16(), 403);
    assert_eq!(own.json::<Value>().await.unwrap()["error"]["kind"], "separation_of_duties");
    // Roles it lacks are refused as for its token.
    let workers = with_session(reqwest::Method::GET, "/v1/workers").send().await.unwrap();
    assert_eq!(workers.status().as_u16(), 403, "olive does not hold `operate`");
    // The token revoked: the session ends at once.
    let (_, tokens) = server.call(reqwest::Method::GET, "/v1/tokens?principal=olive", None).await;
    let token_id = tokens["tokens"][0]["id"].as_str().unwrap().to_owned();
    let (status, _) = server.call(reqwest::Method::POST, &format!("/v1/tokens/{token_id}/revoke"), None).await;
    assert_eq!(status, 204);
    let after = with_session(reqwest::Method::GET, "/v1/jobs").send().await.unwrap();
    assert_eq!(after.status().as_u16(), 401, "a session whose token was revoked");
    assert_eq!(sign_in(&server, &olive, Some(&origin)).await, (401, None), "nor may the revoked token sign in");
}

/// Submit a job over the API (bearer token); its id.
async fn submit(server: &Server, body: Value) -> String {
    let (status, answer) = server.call(reqwest::Method::POST, "/v1/jobs", Some(body)).await;
    assert!(status == 202, "{status}: {answer}");
    answer["job_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_signs_in_watches_jobs_live_reads_one_cancels_and_approves() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &[]);
    for plugin in ["hello", "coop", "fail"] {
        server.add_plugin(plugin).await;
    }
    let ui = format!("{}/ui", server.url);

    // Signed out, the page's own requests get no data.
    browser.goto(&ui).await;
    browser.wait_for("input[name=token]").await;
    let status =
        browser.run("const done = arguments[arguments.length - 1]; fetch('/v1/jobs').then(r => done(r.status));").await;
    assert_eq!(status, 401);
    browser.type_into("input[name=token]", "wrong").await;
    browser.click("button[type=submit]").await;
    browser.wait_for_text("p.error", |t| t.contains("not this server's API token")).await;
    // An operator signs in with a principal's token, and the page says who.
    let olive = server.principal("olive", &["operate", "approve"]).await;
    browser.type_into("input[name=token]", &olive).await;
    browser.click("button[type=submit]").await;
    browser.wait_for("table.jobs").await;
    browser.wait_for_text("#who", |t| t == "olive (approve, operate)").await;
    let cookie = browser.run("arguments[arguments.length - 1](document.cookie)").await;
    assert_eq!(cookie, "", "the session cookie is out of the script's reach");

    // A job submitted elsewhere appears and finishes without a reload.
    browser.run("window.stillTheSamePage = true; arguments[arguments.length - 1](true)").await;
    let hello = submit(&server, json!({ "plugin": "hello", "input": { "name": "Ada" }, "execution": "async" })).await;
    browser.wait_for_text(&format!("tr[data-job='{hello}'] .badge"), |t| t == "succeeded").await;
    assert_eq!(browser.run("arguments[arguments.length - 1](window.stillTheSamePage === true)").await, true);

    // Its page: the output and the log.
    browser.click(&format!("tr[data-job='{hello}'] a")).await;
    browser.wait_for_text("section.output pre.data", |t| t.contains("Hello, Ada!")).await;
    browser.wait_for_text("table.logs", |t| t.contains("greeting Ada")).await;

    // A running coop job, cancelled from its page.
    let coop =
        submit(&server, json!({ "plugin": "coop", "input": { "steps": 1_000_000 }, "execution": "async" })).await;
    browser.goto(&format!("{ui}#/jobs/{coop}")).await;
    browser.wait_for_text("h1 .badge", |t| t == "running").await;
    browser.click(".actions button").await;
    let asked = browser.accept_dialog().await;
    assert!(asked.contains(&coop), "{asked}");
    browser.wait_for_text("pre.answer", |t| t.starts_with("202")).await;
    browser.wait_for_text("h1 .badge", |t| t == "cancelled").await;

    // A gated job (the server's token submitted it), approved from its
    // page, runs; the decision is olive's, the session's principal. Its
    // page shows its priority.
    let gated =
        submit(&server, json!({ "plugin": "hello", "execution": "async", "gate": "approval", "priority": 2 })).await;
    browser.goto(&format!("{ui}#/jobs/{gated}")).await;
    browser.wait_for_text("h1 .badge", |t| t == "pending approval").await;
    browser
        .wait_for_text("dl.fields", |t| {
            t.contains("Submitted by")
                && t.contains("0 of 1")
                && t.contains("Priority")
                && t.contains("2 (0 is claimed first)")
        })
        .await;
    browser.click(".actions button:nth-child(2)").await;
    assert!(browser.accept_dialog().await.starts_with("Approve"));
    browser.wait_for_text("h1 .badge", |t| t == "succeeded").await;
    let (_, job) = server.call(reqwest::Method::GET, &format!("/v1/jobs/{gated}"), None).await;
    assert_eq!(job["approval"]["decision"]["by"], "olive", "{job}");

    // A log line of markup is shown as text and runs nothing.
    let name = "<script>alert(1)</script><img src=x onerror=alert(2)>";
    let hostile = submit(&server, json!({ "plugin": "hello", "input": { "name": name }, "execution": "async" })).await;
    browser.goto(&format!("{ui}#/jobs/{hostile}")).await;
    browser.wait_for_text("table.logs", |t| t.contains(&format!("greeting {name}"))).await;
    let injected =
        browser.run("arguments[arguments.length - 1](document.querySelectorAll('main script, main img').length)").await;
    assert_eq!(injected, 0, "the guest's markup made no element");
    assert_eq!(browser.dialog().await, None, "no alert ran");

    // A retried job's page lists its attempts: the retried one with its
    // error, then the last.
    let input = json!({ "kind": "retryable", "message": "upstream busy" });
    let body = json!({ "plugin": "fail", "input": input, "max_attempts": 2, "backoff_ms": 10, "execution": "async" });
    let retried = submit(&server, body).await;
    browser.goto(&format!("{ui}#/jobs/{retried}")).await;
    browser.wait_for_text("h1 .badge", |t| t == "failed").await;
    browser.wait_for_text("tr.attempt.retried", |t| t.contains("guest_error: Retryable: upstream busy")).await;
    browser.wait_for_text("tr.attempt.failed", |t| t.contains("upstream busy")).await;

    // The other pages: plugins, workers (this server's pool), plans.
    browser.goto(&format!("{ui}#/plugins")).await;
    browser.wait_for_text("main table", |t| t.contains("hello") && t.contains("coop")).await;
    browser.goto(&format!("{ui}#/workers")).await;
    browser.wait_for_text("main table", |t| t.contains("worker-") && t.contains("running")).await;
    let plan = server.call(reqwest::Method::POST, "/v1/plans", Some(json!({ "plugin": "hello" }))).await;
    assert_eq!(plan.0, 201, "{}", plan.1);
    browser.goto(&format!("{ui}#/audit")).await;
    browser.wait_for_text("main table", |t| t.contains("job.approve") && t.contains("olive")).await;
    browser.goto(&format!("{ui}#/plans")).await;
    browser.wait_for_text("main table", |t| t.contains(plan.1["plan_id"].as_str().unwrap())).await;
    browser.quit().await;
}
