//! The dashboard as an operator triaging failures uses it, in a real
//! headless Chromium: the error in the list, rows that open, search by id
//! and error text, a time window, bulk cancel, focus kept through live
//! updates, why a job waits, a guest language's traceback first, a banner
//! when the server goes away, and a phone's width.

use leash_tests::polyglot::{self, Lang};
use serde_json::{Value, json};

use crate::support::server::Server;
use crate::support::webdriver::Browser;

async fn submit(server: &Server, body: Value) -> String {
    let (status, answer) = server.call(reqwest::Method::POST, "/v1/jobs", Some(body)).await;
    assert!(status == 202, "{status}: {answer}");
    answer["job_id"].as_str().unwrap().to_owned()
}

/// Sign `browser` in to `server`'s dashboard as a principal that may
/// operate and approve.
async fn sign_in(browser: &Browser, server: &Server) {
    browser.goto(&format!("{}/ui", server.url)).await;
    let token = server.principal("olive", &["operate", "approve", "submit"]).await;
    browser.type_into("input[name=token]", &token).await;
    browser.click("button[type=submit]").await;
    browser.wait_for("table.jobs").await;
}

fn shots(scratch: &std::path::Path) -> std::path::PathBuf {
    let dir = if std::env::var_os("LEASH_UI_SCREENSHOTS").is_some() {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ui")
    } else {
        scratch.to_owned()
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_triages_failures_from_the_jobs_list() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("jobs.db"), &["--max-workers", "4"]);
    for plugin in ["hello", "coop", "fail"] {
        server.add_plugin(plugin).await;
    }
    let ui = format!("{}/ui", server.url);
    sign_in(&browser, &server).await;

    // A failure's error is in its row: kind and first line.
    let input = json!({ "kind": "failed", "message": "database timeout on shard 7\nsecond line" });
    let failed = submit(&server, json!({ "plugin": "fail", "input": input, "execution": "async" })).await;
    let hello = submit(&server, json!({ "plugin": "hello", "input": { "name": "Ada" }, "execution": "async" })).await;
    let error_cell = format!("tr[data-job='{failed}'] td.error");
    browser.wait_for_text(&error_cell, |t| t == "guest_error Failed: database timeout on shard 7").await;
    browser.wait_for_text(&format!("tr[data-job='{hello}'] .badge"), |t| t == "succeeded").await;
    browser.wait_until("the empty list's hint is gone", "document.querySelector('main p.hint').hidden").await;
    std::fs::write(shots(dir.path()).join("jobs.png"), browser.screenshot().await).unwrap();

    // The whole row opens the job, not only its id.
    browser.click(&format!("tr[data-job='{failed}'] td.error")).await;
    browser.wait_for_text("h1", |t| t.contains(&failed)).await;
    browser.wait_for_text("section.problem", |t| t.contains("database timeout on shard 7")).await;
    // Retry (redrive) from its page: it runs again, fails again, and both
    // attempts are listed.
    browser.click(".actions button").await;
    assert!(browser.accept_dialog().await.starts_with(&format!("Run job {failed} again?")));
    browser.wait_for_text("pre.answer", |t| t.starts_with("200")).await;
    browser.wait_until("two attempts listed", "document.querySelectorAll('tr.attempt.failed').length === 2").await;
    browser.wait_for_text("h1 .badge", |t| t == "failed").await;

    // Search: error text (any case) keeps only what matches; an id opens it.
    browser.goto(&format!("{ui}#/jobs")).await;
    browser.type_into("input[name=q]", "SHARD 7").await;
    browser.click(".filters button[type=submit]").await;
    browser.wait_until("the search applied", "location.hash.includes('error=SHARD')").await;
    browser.wait_for(&format!("tr[data-job='{failed}']")).await;
    browser.wait_until("only the match listed", "document.querySelectorAll('table.jobs tbody tr').length === 1").await;
    browser.goto(&format!("{ui}#/jobs")).await;
    // The unfiltered list's own search box (the searched list's holds the
    // text it searched for).
    browser.wait_until("the list redrawn", "document.querySelector('input[name=q]')?.value === ''").await;
    browser.type_into("input[name=q]", &hello).await;
    browser.click(".filters button[type=submit]").await;
    browser.wait_for_text("section.output pre.data", |t| t.contains("Hello, Ada!")).await;
    // A time window: the list asks for jobs created since then (the store's
    // filter is a conformance case), and the last 15 minutes hold both.
    browser.goto(&format!("{ui}#/jobs?since=15")).await;
    browser.wait_for(&format!("tr[data-job='{failed}']")).await;
    browser.wait_for(&format!("tr[data-job='{hello}']")).await;
    let asked = "performance.getEntriesByType('resource').some((e) => e.name.includes('/v1/jobs?created_after='))";
    browser.wait_until("the list asked for a creation window", asked).await;

    // Two running jobs ticked and cancelled together; the keyboard stays on
    // a row while live updates redraw it. They are submitted as the list
    // loads: those the first read misses, the stream's opening catches.
    browser.goto(&format!("{ui}#/jobs")).await;
    let steps = json!({ "plugin": "coop", "input": { "steps": 1_000_000_000u64 }, "execution": "async" });
    let (a, b) = (submit(&server, steps.clone()).await, submit(&server, steps).await);
    for id in [&a, &b] {
        browser.wait_for_text(&format!("tr[data-job='{id}'] .badge"), |t| t == "running").await;
    }
    browser.run(&format!("document.querySelector(\"tr[data-job='{a}'] a\").focus(); arguments[0](true)")).await;
    browser.click(&format!("tr[data-job='{a}'] input[type=checkbox]")).await;
    browser.click(&format!("tr[data-job='{b}'] input[type=checkbox]")).await;
    browser.wait_for_text(".bulkbar button", |t| t == "Cancel selected (2)").await;
    browser.run(&format!("document.querySelector(\"tr[data-job='{a}'] a\").focus(); arguments[0](true)")).await;
    browser.click(".bulkbar button").await;
    let asked = browser.accept_dialog().await;
    assert!(asked.starts_with("Cancel 2 jobs?") && asked.contains(&a) && asked.contains(&b), "{asked}");
    browser.wait_for_text(".bulkbar .answer", |t| t.starts_with("2 of 2 cancelled")).await;
    for id in [&a, &b] {
        browser.wait_for_text(&format!("tr[data-job='{id}'] .badge"), |t| t == "cancelled").await;
    }
    // The click on the bulk button moved the focus there; put it back on a
    // row and let a live update redraw that row.
    let c = submit(&server, json!({ "plugin": "coop", "input": { "steps": 1_000_000_000u64 }, "execution": "async" }))
        .await;
    browser.wait_for_text(&format!("tr[data-job='{c}'] .badge"), |t| t == "running").await;
    browser.run(&format!("document.querySelector(\"tr[data-job='{c}'] a\").focus(); arguments[0](true)")).await;
    let (status, _) = server.call(reqwest::Method::POST, &format!("/v1/jobs/{c}/cancel"), None).await;
    assert_eq!(status, 202);
    browser.wait_for_text(&format!("tr[data-job='{c}'] .badge"), |t| t == "cancelled").await;
    browser
        .wait_until(
            "the focus stays on the redrawn row",
            &format!("document.activeElement && document.activeElement.closest(\"tr[data-job='{c}']\")"),
        )
        .await;

    // Why a job is not running: delayed, or waiting for approval.
    let later = submit(&server, json!({ "plugin": "hello", "delay_ms": 3_600_000, "execution": "async" })).await;
    browser.goto(&format!("{ui}#/jobs/{later}")).await;
    browser.wait_for_text("p.why", |t| t.starts_with("Not before ") && t.ends_with("as it was submitted.")).await;
    let gated = submit(&server, json!({ "plugin": "hello", "gate": "approval", "execution": "async" })).await;
    browser.goto(&format!("{ui}#/jobs/{gated}")).await;
    browser.wait_for_text("p.why", |t| t.starts_with("Waiting ") && t.contains("for approval (0 of 1)")).await;

    // A Python or JavaScript guest's own traceback comes first; the
    // interpreter's frames fold.
    for (lang, first, last) in [
        (Lang::Python, "Traceback (most recent call last):", "ValueError: a crash the input asked for"),
        (Lang::Js, "uncaught TypeError: a crash the input asked for", "run@leash.js"),
    ] {
        let Some(bytes) = tokio::task::spawn_blocking(move || polyglot::guest_bytes(lang, "loop")).await.unwrap()
        else {
            assert!(!polyglot::required(), "the {lang:?} traceback case must not be skipped");
            polyglot::say_skipped(&format!("the {lang:?} traceback case: its guest toolchain is not installed"));
            continue;
        };
        let name = format!("{}loop", lang.name());
        let answer =
            server.request(reqwest::Method::POST, &format!("/v1/plugins?name={name}")).body(bytes).send().await;
        assert_eq!(answer.unwrap().status().as_u16(), 201);
        let crashed =
            submit(&server, json!({ "plugin": name, "input": { "crash": true }, "execution": "async" })).await;
        browser.goto(&format!("{ui}#/jobs/{crashed}")).await;
        let traceback = browser.wait_for_text("section.problem pre.traceback", |t| !t.is_empty()).await;
        assert!(traceback.starts_with(first), "{lang:?}: {traceback}");
        assert!(traceback.lines().any(|l| l.starts_with(last) || l.ends_with(last)), "{lang:?}: {traceback}");
        browser.wait_for_text("section.problem details.frames summary", |t| t.starts_with("Interpreter frames")).await;
        let open = browser.run("arguments[0](document.querySelector('details.frames').open)").await;
        assert_eq!(open, false, "folded");
        if lang == Lang::Python {
            std::fs::write(shots(dir.path()).join("job.png"), browser.screenshot().await).unwrap();
        }
    }

    // A phone: nothing is wider than its 390 px, the list and a job alike.
    browser.emulate_phone(true).await;
    for page in ["#/jobs".to_owned(), format!("#/jobs/{failed}")] {
        browser.goto(&format!("{ui}{page}")).await;
        browser.wait_for("main h1").await;
        browser
            .wait_until(
                &format!("{page} fits 390 px"),
                "window.innerWidth === 390 && document.documentElement.scrollWidth <= 390 \
                 && [...document.querySelectorAll('.scroll')].every((s) => s.scrollWidth <= s.clientWidth)",
            )
            .await;
    }
    browser.goto(&format!("{ui}#/jobs")).await;
    browser.wait_for(&format!("tr[data-job='{failed}']")).await;
    std::fs::write(shots(dir.path()).join("jobs-phone.png"), browser.screenshot().await).unwrap();
    browser.goto(&format!("{ui}#/jobs/{failed}")).await;
    browser.wait_for("section.problem").await;
    std::fs::write(shots(dir.path()).join("job-phone.png"), browser.screenshot().await).unwrap();
    browser.emulate_phone(false).await;

    // The server goes away: a banner says the page is out of date.
    browser.goto(&format!("{ui}#/jobs")).await;
    browser.wait_for("table.jobs").await;
    server.kill();
    browser.wait_for_text("#stale", |t| t.starts_with("The server has not answered since ")).await;
    browser.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_decides_plans_and_jobs_from_the_inbox() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &[]);
    server.add_plugin("hello").await;
    sign_in(&browser, &server).await;
    browser.goto(&format!("{}/ui#/approvals", server.url)).await;
    browser.wait_for_text("main", |t| t.contains("Nothing waits for approval.")).await;

    // A plan whose apply waits: its card shows what execute computed, as a
    // table; a gated job's card shows its input.
    let (status, plan) = server
        .call(reqwest::Method::POST, "/v1/plans", Some(json!({ "plugin": "hello", "input": { "name": "Ada" } })))
        .await;
    assert_eq!(status, 201, "{plan}");
    let plan_id = plan["plan_id"].as_str().unwrap().to_owned();
    let gated = submit(&server, json!({ "plugin": "hello", "input": { "name": "Bob" }, "gate": "approval" })).await;
    let plan_card = format!("article.card:not([data-job='{gated}'])");
    browser.wait_for_text(&format!("{plan_card} h2"), |t| t == format!("Plan {plan_id} · apply")).await;
    let output = |t: &str| t.contains("greeting") && t.contains("Hello, Ada!");
    browser.wait_for_text(&format!("{plan_card} table.json"), output).await;
    browser.wait_for_text(&format!("article.card[data-job='{gated}'] table.json"), |t| t.contains("Bob")).await;
    std::fs::write(shots(dir.path()).join("approvals.png"), browser.screenshot().await).unwrap();

    // A comment typed for the job, then one click on the plan and a
    // confirmation that says what it does.
    let comment = format!("article.card[data-job='{gated}'] input[name=comment]");
    // Set as one input event: typed key by key, a redraw between two keys
    // would hand the rest to a replaced element.
    let typing = format!(
        "const e = document.querySelector(\"{comment}\"); e.value = 'not today'; \
         e.dispatchEvent(new Event('input')); arguments[0](true)"
    );
    browser.run(&typing).await;
    browser.click(&format!("{plan_card} button.approve")).await;
    let asked = browser.accept_dialog().await;
    assert_eq!(
        asked,
        format!("Approve the apply phase of plan {plan_id} (hello@0.0.0)?\nIt makes exactly the writes shown above.")
    );
    // The decided card leaves the inbox; what was typed in another stays.
    browser.wait_until("the plan's card leaves", &format!("!document.querySelector(\"{plan_card}\")")).await;
    let typed = browser.run(&format!("arguments[0](document.querySelector(\"{comment}\").value)")).await;
    assert_eq!(typed, "not today", "a redraw kept the comment");
    // Approved as the session's principal; its apply phase is under way
    // (hello is no plan plugin: how apply ends is not this test's).
    let (_, approved) = server.call(reqwest::Method::GET, &format!("/v1/plans/{plan_id}"), None).await;
    assert_eq!(approved["approved_by"], "olive", "{approved}");
    assert_ne!(approved["apply"]["job"]["status"], "pending_approval", "{approved}");
    browser.click(&format!("article.card[data-job='{gated}'] button.reject")).await;
    let asked = browser.accept_dialog().await;
    assert_eq!(asked, format!("Reject job {gated} (hello@0.0.0, execute)?\nIt will never run."));
    let rejected = server.poll_job(&gated, |j| j["status"] == "cancelled").await;
    assert_eq!(
        (&rejected["error_kind"], &rejected["approval"]["decision"]["by"]),
        (&json!("rejected"), &json!("olive"))
    );
    browser.wait_for_text("main", |t| t.contains("Nothing waits for approval.")).await;
    browser.quit().await;
}

/// A plan's page lists the writes its execute phase proposed, each as a
/// reviewer reads a diff, with the binding digest; approving from the page
/// approves that digest, and apply makes exactly those writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_reads_a_plans_proposed_writes_on_its_page_and_approves_them() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &[]);
    let records = crate::api::plans::Records::start(&[("c", "old")]).await;
    server.add_plugin("plan-probe").await;
    let grants = json!({ "http": { "hosts": [format!("GET,PUT,DELETE http://{}", records.addr)],
                                   "private_ranges": ["127.0.0.0/8"] } });
    let (status, answer) = server.call(reqwest::Method::PUT, "/v1/plugins/plan_probe@0.0.0/grants", Some(grants)).await;
    assert_eq!(status, 200, "{answer}");
    let write = |method: &str, key: &str, body: &str| json!({ "method": method, "url": format!("{}/{key}", records.url()), "body": body });
    let writes = [write("PUT", "a", "line one\nline two"), write("PUT", "b", "2"), write("DELETE", "c", "")];
    let (status, plan) = server
        .call(
            reqwest::Method::POST,
            "/v1/plans",
            Some(json!({ "plugin": "plan_probe", "input": { "writes": writes } })),
        )
        .await;
    assert_eq!(status, 201, "{plan}");
    let id = plan["plan_id"].as_str().unwrap().to_owned();
    crate::api::plans::poll_plan(&server, &id, |s| s == "awaiting_approval").await;

    sign_in(&browser, &server).await;
    browser.goto(&format!("{}/ui#/plans/{id}", server.url)).await;
    browser.wait_until("three proposals listed", "document.querySelectorAll('li.proposal').length === 3").await;
    let first = browser.wait_for_text("li.proposal[data-n='1']", |t| t.contains("PUT")).await;
    assert!(first.contains(&format!("{}/a", records.url())), "{first}");
    assert!(first.contains("+ line one") && first.contains("+ line two"), "the body as added lines: {first}");
    let third = browser.wait_for_text("li.proposal[data-n='3']", |t| t.contains("DELETE")).await;
    assert!(third.contains("not sent"), "{third}");
    let digest = browser.wait_for_text("code[data-digest]", |t| t.starts_with("sha256:")).await;
    std::fs::write(shots(dir.path()).join("plan.png"), browser.screenshot().await).unwrap();
    assert!(records.changes().is_empty(), "nothing changes before the approval");

    browser.click(".actions button.approve").await;
    assert_eq!(browser.accept_dialog().await, "Approve exactly the 3 writes shown?");
    browser.wait_for_text("p.answer", |t| t == "Approved.").await;
    let applied = crate::api::plans::poll_plan(&server, &id, |s| s == "applied").await;
    assert_eq!(applied["approved_digest"], digest.as_str(), "the approval bound what the page showed");
    assert_eq!(applied["approved_by"], "olive");
    assert_eq!(records.changes(), ["PUT a=line one\nline two", "PUT b=2", "DELETE c"]);
    browser.wait_until("the page shows them sent", "document.querySelectorAll('span.state.sent').length === 3").await;
    browser.quit().await;
}

/// The failed-jobs view retries what its filters match, after saying how
/// many a dry run found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_the_failed_jobs_a_filter_matches() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &["--max-workers", "4"]);
    for plugin in ["fail", "hello"] {
        server.add_plugin(plugin).await;
    }
    let mut failed = Vec::new();
    for n in 0..2 {
        let input = json!({ "message": format!("quota exceeded ({n})") });
        failed.push(submit(&server, json!({ "plugin": "fail", "input": input, "execution": "async" })).await);
    }
    let hello = submit(&server, json!({ "plugin": "hello", "input": {}, "execution": "async" })).await;
    for id in failed.iter().chain([&hello]) {
        server.poll_job(id, crate::support::server::is_terminal).await;
    }
    sign_in(&browser, &server).await;
    browser.goto(&format!("{}/ui#/jobs?status=failed&plugin=fail", server.url)).await;
    browser.wait_until("both failures listed", "document.querySelectorAll('table.jobs tbody tr').length === 2").await;
    browser.click("button.retry").await;
    assert_eq!(browser.accept_dialog().await, "Retry 2 failed jobs matching these filters?");
    browser.wait_for_text("p.answer", |t| t == "2 queued again.").await;
    for id in &failed {
        let job = server.poll_job(id, |j| crate::support::server::is_terminal(j) && j["attempt"] == 2).await;
        assert_eq!(job["status"], "failed", "it ran again: {job}");
    }
    let (_, job) = server.call(reqwest::Method::GET, &format!("/v1/jobs/{hello}"), None).await;
    assert_eq!(job["attempt"], 1, "a job the filter did not match is left alone");
    browser.quit().await;
}

/// An operator pauses a plugin from a queued job's page (a prompt asks
/// why), the page says why the job waits, the jobs list shows the pause,
/// and its Resume button lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_a_plugin_from_a_job_and_resumes_it_from_the_jobs_list() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &["--max-workers", "1"]);
    server.add_plugin("hello").await;
    // Delayed, so it is still queued when the page opens.
    let job = submit(&server, json!({ "plugin": "hello", "execution": "async", "delay_ms": 3_600_000 })).await;
    sign_in(&browser, &server).await;
    browser.goto(&format!("{}/ui#/jobs/{job}", server.url)).await;
    browser.wait_for_text("h1 .badge", |t| t == "queued").await;
    browser.click(".actions button.pause").await;
    assert!(browser.answer_prompt("upstream quota").await.starts_with("Pause plugin hello?"));
    assert_eq!(browser.accept_dialog().await, "Pause plugin hello now?");
    browser.wait_for_text("pre.answer", |t| t.starts_with("200")).await;
    let (_, pauses) = server.call(reqwest::Method::GET, "/v1/pauses", None).await;
    assert_eq!(pauses["pauses"][0]["reason"], "upstream quota", "{pauses}");
    browser
        .wait_for_text("p.why", |t| t.starts_with("Its plugin `hello` was paused") && t.contains(": upstream quota"))
        .await;

    browser.goto(&format!("{}/ui#/jobs", server.url)).await;
    browser
        .wait_for_text(".paused .pause", |t| t.starts_with("hello is paused since") && t.contains("upstream quota"))
        .await;
    browser.click(".paused .pause button").await;
    assert_eq!(browser.accept_dialog().await, "Resume plugin hello? Its queued jobs run again.");
    browser.wait_for_text("p.answer", |t| t == "hello resumed.").await;
    browser.wait_until("the pause is gone", "document.querySelectorAll('.paused .pause').length === 0").await;
    let (_, pauses) = server.call(reqwest::Method::GET, "/v1/pauses", None).await;
    assert_eq!(pauses["pauses"], json!([]));
    browser.quit().await;
}

/// An operator reads the schedules page (next firing, last runs), pauses
/// a schedule there, runs it now, and resumes it from its own page, which
/// lists its next firings and its latest jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_runs_and_resumes_a_schedule_from_the_schedules_pages() {
    let Some(browser) = Browser::start().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &[]);
    server.add_plugin("hello").await;
    let body = json!({ "name": "hourly", "cron": "@hourly", "overlap": "allow", "job": { "plugin": "hello" } });
    assert_eq!(server.call(reqwest::Method::POST, "/v1/schedules", Some(body)).await.0, 201);
    sign_in(&browser, &server).await;
    browser.goto(&format!("{}/ui#/schedules", server.url)).await;
    let row = "tr[data-name=hourly]";
    browser.wait_for_text(&format!("{row} td.next"), |t| t.ends_with(":00:00.000Z")).await;
    browser.click(&format!("{row} button.pause")).await;
    assert_eq!(browser.accept_dialog().await, "Pause schedule hourly? It fires nothing until resumed.");
    browser.wait_for_text("p.answer", |t| t == "Pause: done.").await;
    browser.wait_for_text(&format!("{row} .badge"), |t| t == "paused").await;
    let (_, shown) = server.call(reqwest::Method::GET, "/v1/schedules/hourly", None).await;
    assert_eq!(shown["paused"]["by"], "olive", "{shown}");

    browser.click(&format!("{row} button.trigger")).await;
    assert_eq!(browser.accept_dialog().await, "Submit hourly's job now, outside its times?");
    browser.wait_for_text("p.answer", |t| t == "Run now: done.").await;
    let (_, page) = server.call(reqwest::Method::GET, "/v1/jobs?schedule=hourly", None).await;
    let job = page["jobs"][0]["id"].as_str().expect("the trigger's job").to_owned();

    browser.goto(&format!("{}/ui#/schedules/hourly", server.url)).await;
    browser.wait_for_text("p.pause", |t| t.contains("by olive") && t.contains("fires nothing until resumed")).await;
    browser.wait_for(&format!("table.runs a[href='#/jobs/{job}']")).await;
    browser.click("button.resume").await;
    assert_eq!(browser.accept_dialog().await, "Resume schedule hourly? It fires next at its first time after now.");
    browser.wait_until("its next five firings", "document.querySelectorAll('ol.upcoming li').length === 5").await;
    let (_, shown) = server.call(reqwest::Method::GET, "/v1/schedules/hourly", None).await;
    assert!(shown.get("paused").is_none(), "{shown}");
    browser.quit().await;
}
