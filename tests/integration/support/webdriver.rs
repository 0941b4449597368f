//! A headless Chromium driven through chromedriver, for the dashboard's
//! browser tests.
//!
//! The W3C WebDriver protocol is JSON over HTTP; the dozen commands these
//! tests use are spoken here with the `reqwest` client the tests already
//! have. (The WebDriver client crates bring a TLS stack of their own —
//! fantoccini's needs cmake and a C build — for a driver on loopback.)
//!
//! They need Debian's `chromium` and `chromium-driver`. Without them each
//! browser test says it was skipped and why; with `CI` or
//! `LEASH_TEST_BROWSER` set it fails instead (`.ci/run` installs them).

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::support::GENEROUS;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The key W3C WebDriver names an element reference by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One browser session; the driver (and its browser) end when dropped.
pub(crate) struct Browser {
    http: reqwest::Client,
    base: String,
    driver: Child,
    /// The browser's profile: its processes are found by it.
    profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A browser outlives a killed driver: end it by its profile, which
        // names this one alone, then the driver.
        let _ = Command::new("pkill").args(["-KILL", "-f", &self.profile.path().display().to_string()]).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// A fresh headless Chromium, or `None` after saying why the test is
    /// skipped (never in CI).
    pub(crate) async fn start() -> Option<Browser> {
        let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER].into_iter().filter(|p| !Path::new(p).exists()).collect();
        if !missing.is_empty() {
            let mandatory = std::env::var_os("CI").is_some() || std::env::var_os("LEASH_TEST_BROWSER").is_some();
            assert!(
                !mandatory,
                "CI or LEASH_TEST_BROWSER is set but {missing:?} is missing: install chromium chromium-driver"
            );
            let test = std::thread::current().name().unwrap_or("a browser test").to_owned();
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: it needs {missing:?} (Debian: apt-get install chromium chromium-driver)"
            );
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::builder().timeout(GENEROUS).build().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while !http.get(format!("{base}/status")).send().await.is_ok_and(|r| r.status().is_success()) {
            assert!(start.elapsed() < GENEROUS, "chromedriver never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::Builder::new().prefix("leash-browser-").tempdir().unwrap();
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,900",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
            "unhandledPromptBehavior": "ignore",
        }}});
        let answer: Value =
            http.post(format!("{base}/session")).json(&capabilities).send().await.unwrap().json().await.unwrap();
        let session = answer["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {answer}"));
        Some(Browser { http, base: format!("{base}/session/{session}"), driver, profile })
    }

    /// A command: its `value`, or the driver's error as `Err`.
    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, Value> {
        let mut request = self.http.request(method.clone(), format!("{}{path}", self.base));
        if method == reqwest::Method::POST {
            request = request.json(&body.unwrap_or_else(|| json!({})));
        }
        let response = request.send().await.expect("chromedriver answers");
        let ok = response.status().is_success();
        let answer: Value = response.json().await.expect("chromedriver speaks JSON");
        if ok { Ok(answer["value"].clone()) } else { Err(answer["value"].clone()) }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.command(reqwest::Method::POST, path, Some(body)).await.unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    pub(crate) async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    /// The first element `css` selects, if any now.
    pub(crate) async fn find(&self, css: &str) -> Option<String> {
        let found =
            self.command(reqwest::Method::POST, "/element", Some(json!({"using": "css selector", "value": css})));
        found.await.ok().and_then(|v| v[ELEMENT].as_str().map(str::to_owned))
    }

    /// Wait for an element `css` selects whose text satisfies `ok`.
    pub(crate) async fn wait_for_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            if let Some(element) = self.find(css).await
                && let Ok(text) = self.command(reqwest::Method::GET, &format!("/element/{element}/text"), None).await
            {
                last = text.as_str().unwrap_or_default().to_owned();
                if ok(&last) {
                    return last;
                }
            }
            assert!(start.elapsed() < GENEROUS, "{css} never showed the text wanted (last: {last:?})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait for `css` to select something.
    pub(crate) async fn wait_for(&self, css: &str) -> String {
        let start = Instant::now();
        loop {
            if let Some(element) = self.find(css).await {
                return element;
            }
            assert!(start.elapsed() < GENEROUS, "nothing matched {css}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Click the element `css` selects. A live page may redraw it between
    /// finding and clicking ("stale element reference"): then it is found
    /// again, within the same bound.
    pub(crate) async fn click(&self, css: &str) {
        let start = Instant::now();
        loop {
            let element = self.wait_for(css).await;
            match self.command(reqwest::Method::POST, &format!("/element/{element}/click"), Some(json!({}))).await {
                Ok(_) => return,
                Err(e) if e["error"] == "stale element reference" && start.elapsed() < GENEROUS => {}
                Err(e) => panic!("click {css}: {e}"),
            }
        }
    }

    /// Type `text` into the element `css` selects. Like [`Browser::click`],
    /// an element redrawn between finding and typing is found again.
    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        let start = Instant::now();
        loop {
            let element = self.wait_for(css).await;
            let path = format!("/element/{element}/value");
            match self.command(reqwest::Method::POST, &path, Some(json!({ "text": text }))).await {
                Ok(_) => return,
                Err(e) if e["error"] == "stale element reference" && start.elapsed() < GENEROUS => {}
                Err(e) => panic!("type into {css}: {e}"),
            }
        }
    }

    /// Run `script` in the page as an async script: it hands its result
    /// to the callback WebDriver passes last (`arguments[arguments.length - 1]`).
    pub(crate) async fn run(&self, script: &str) -> Value {
        self.post("/execute/async", json!({ "script": script, "args": [] })).await
    }

    /// The text of the alert or confirm dialog open now, if any.
    pub(crate) async fn dialog(&self) -> Option<String> {
        let text = self.command(reqwest::Method::GET, "/alert/text", None).await.ok()?;
        Some(text.as_str().unwrap_or_default().to_owned())
    }

    /// Wait for a prompt dialog, type `answer` into it and accept it;
    /// answers the prompt's text.
    pub(crate) async fn answer_prompt(&self, answer: &str) -> String {
        let start = Instant::now();
        loop {
            if let Some(text) = self.dialog().await {
                self.post("/alert/text", json!({ "text": answer })).await;
                self.post("/alert/accept", json!({})).await;
                return text;
            }
            assert!(start.elapsed() < GENEROUS, "no prompt opened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait for a dialog and accept it.
    pub(crate) async fn accept_dialog(&self) -> String {
        let start = Instant::now();
        loop {
            if let Some(text) = self.dialog().await {
                self.post("/alert/accept", json!({})).await;
                return text;
            }
            assert!(start.elapsed() < GENEROUS, "no dialog opened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait until the JavaScript expression `condition` is true in the page.
    pub(crate) async fn wait_until(&self, what: &str, condition: &str) {
        let start = Instant::now();
        let script = format!("arguments[arguments.length - 1](Boolean({condition}))");
        while self.run(&script).await != Value::Bool(true) {
            assert!(start.elapsed() < GENEROUS, "{what}: never true: {condition}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Lay the page out as a phone does (390 × 844 CSS pixels, a 3×
    /// screen), through Chromium's device emulation, or undo that.
    pub(crate) async fn emulate_phone(&self, on: bool) {
        let (cmd, params) = if on {
            let metrics = json!({ "width": 390, "height": 844, "deviceScaleFactor": 3, "mobile": true });
            ("Emulation.setDeviceMetricsOverride", metrics)
        } else {
            ("Emulation.clearDeviceMetricsOverride", json!({}))
        };
        self.post("/goog/cdp/execute", json!({ "cmd": cmd, "params": params })).await;
    }

    /// A PNG of the window.
    pub(crate) async fn screenshot(&self) -> Vec<u8> {
        let shot = self.command(reqwest::Method::GET, "/screenshot", None).await.expect("a screenshot");
        base64::engine::general_purpose::STANDARD.decode(shot.as_str().unwrap()).unwrap()
    }

    /// End the session (and with it the browser); what is left of it is
    /// ended when the browser is dropped.
    pub(crate) async fn quit(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.http.delete(&self.base).send()).await;
    }
}
