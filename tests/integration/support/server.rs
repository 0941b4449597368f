//! A real `leash serve` process on loopback, for the HTTP and CLI tests.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::support::{GENEROUS, cache_dir, eventually};

/// A running server; killed when dropped.
pub struct Server {
    pub url: String,
    pub token: String,
    pub token_file: PathBuf,
    pub child: Child,
    pub http: reqwest::Client,
}

/// The `leash` binary under test.
pub fn leash_bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leash"));
    for var in ["LEASH_SERVER", "LEASH_API_TOKEN", "LEASH_TOKEN_FILE", "LEASH_CONFIG", "LEASH_DATABASE_PATH"] {
        cmd.env_remove(var);
    }
    cmd.env("LEASH_CACHE_DIR", cache_dir());
    cmd
}

/// Fast timings for tests, unless `extra` sets the flag itself.
fn with_defaults(extra: &[&str]) -> Vec<String> {
    flags_with_defaults(
        extra,
        &[
            ("--listen", "127.0.0.1:0"),
            ("--poll-interval", "50ms"),
            ("--lease-ttl", "3s"),
            ("--cancel-grace", "1s"),
            ("--shutdown-budget", "3s"),
        ],
    )
}

/// `extra`, then each default flag `extra` does not set.
pub fn flags_with_defaults(extra: &[&str], defaults: &[(&str, &str)]) -> Vec<String> {
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    for (flag, value) in defaults {
        if !extra.contains(flag) {
            args.extend([flag.to_string(), value.to_string()]);
        }
    }
    args
}

impl Server {
    /// Start `leash serve` on `db` with fast timings and `extra` flags.
    pub fn start(db: &Path, extra: &[&str]) -> Server {
        Server::start_with(db, extra, |_| {})
    }

    /// Like [`Server::start`], with `configure` applied to the command.
    pub fn start_with(db: &Path, extra: &[&str], configure: impl FnOnce(&mut Command)) -> Server {
        Server::start_on(db.as_os_str(), &db.with_extension("token"), extra, configure)
    }

    /// `leash serve --db DB` (a path or a URL) with its token in `token_file`.
    pub fn start_on(
        db: &std::ffi::OsStr,
        token_file: &Path,
        extra: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Server {
        let token_file = token_file.to_owned();
        let mut command = leash_bin();
        command
            .arg("serve")
            .arg("--db")
            .arg(db)
            .arg("--token-file")
            .arg(&token_file)
            .args(with_defaults(extra))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        configure(&mut command);
        let mut child = command.spawn().expect("start leash serve");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !sent && let Some(rest) = line.split("serving ").nth(1) {
                    let url = rest.split_whitespace().next().unwrap_or_default().to_owned();
                    let _ = tx.send(url);
                    sent = true;
                }
            }
        });
        let url = rx.recv_timeout(GENEROUS).expect("the server reports its address");
        let token = std::fs::read_to_string(&token_file).expect("token file").trim().to_owned();
        Server { url, token, token_file, child, http: reqwest::Client::new() }
    }

    /// A request with the token.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.url)).bearer_auth(&self.token)
    }

    /// Send a JSON body (or none) and read the status and JSON answer.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.token, method, path, body).await
    }

    /// [`Server::call`] with another principal's token. A body that is
    /// not JSON (`/metrics`) comes back as a JSON string.
    pub async fn call_as(&self, token: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.url)).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("body");
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }

    /// Put principal `name` with `roles` (replacing its roles if it is
    /// there) and create a token for it; the token.
    pub async fn principal(&self, name: &str, roles: &[&str]) -> String {
        let path = format!("/v1/principals/{name}");
        let (status, answer) =
            self.call(reqwest::Method::PUT, &path, Some(serde_json::json!({ "roles": roles }))).await;
        assert_eq!(status, 200, "{answer}");
        self.principal_token(name).await
    }

    /// A new token for the stored principal `name`.
    pub async fn principal_token(&self, name: &str) -> String {
        let body = serde_json::json!({ "principal": name, "label": format!("{name}'s") });
        let (status, created) = self.call(reqwest::Method::POST, "/v1/tokens", Some(body)).await;
        assert_eq!(status, 201, "{created}");
        created["token"].as_str().expect("a token").to_owned()
    }

    /// Register a built test plugin under its own name.
    pub async fn add_plugin(&self, name: &str) -> Value {
        let response = self
            .request(reqwest::Method::POST, &format!("/v1/plugins?name={}", name.replace('-', "_")))
            .body(leash_tests::plugin_bytes(name))
            .send()
            .await
            .expect("upload");
        assert_eq!(response.status().as_u16(), 201, "upload {name}");
        response.json().await.expect("plugin JSON")
    }

    /// Poll a job until `done` holds for it (bounded; a hang fails the test).
    pub async fn poll_job(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        eventually(format!("job {id} reaches the state"), async || {
            let (status, job) = self.call(reqwest::Method::GET, &format!("/v1/jobs/{id}"), None).await;
            assert_eq!(status, 200, "{job}");
            done(&job).then_some(job)
        })
        .await
    }

    /// Send SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Two `leash serve` replicas on one new PostgreSQL schema, sharing a
/// token file in `dir`; `None` (said why) without PostgreSQL. Drop the
/// servers before the schema.
pub async fn two_postgres_replicas(dir: &Path) -> Option<(crate::support::pg::Schema, Server, Server)> {
    let url = crate::support::pg::url()?;
    let schema = crate::support::pg::Schema::create(&url).await;
    let token_file = dir.join("token");
    let a = Server::start_on(schema.url.as_ref(), &token_file, &[], |_| {});
    let b = Server::start_on(schema.url.as_ref(), &token_file, &[], |_| {});
    Some((schema, a, b))
}

/// A job's terminal check.
pub fn is_terminal(job: &Value) -> bool {
    job["status"].as_str().and_then(|s| s.parse::<leash::job::JobStatus>().ok()).is_some_and(|s| s.is_terminal())
}
