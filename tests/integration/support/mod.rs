//! Helpers shared by the integration tests: the bounded wait
//! ([`eventually`]), the sandbox and its plugins, a `leash serve` child
//! (`server`), a private PostgreSQL (`pg`), a WebDriver client
//! (`webdriver`).

pub mod pg;
pub mod server;
pub mod webdriver;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leash::job::{JobId, JobStatus, Target};
use leash::runtime::Runtime;
use leash::sandbox::{
    Allocator, Compiler, NoObserver, Outcome, Plugin, Progress, RunLimits, RunObserver, RunRequest, Sandbox,
    SandboxConfig, StopHandle,
};
use tokio::sync::mpsc;

/// A bound no healthy run in these tests comes near; only a hang reaches it.
pub const GENEROUS: Duration = Duration::from_secs(60);

/// How often [`eventually`] asks again.
const POLL: Duration = Duration::from_millis(20);

/// Ask `check` until it answers `Some`, every 20 ms, for at most
/// [`GENEROUS`]; past that, panic saying what never happened. For a state
/// another task or process writes with no event to wait on (a job row, a
/// health report): where an event exists, a test waits on the event.
pub async fn eventually<T>(what: impl std::fmt::Display, check: impl AsyncFnMut() -> Option<T>) -> T {
    eventually_within(GENEROUS, what, check).await
}

/// [`eventually`] with its own bound.
pub async fn eventually_within<T>(
    within: Duration,
    what: impl std::fmt::Display,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(answer) = check().await {
            return answer;
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(POLL).await;
    }
}

/// Wait until the job reaches `status`, polling the store (the state is
/// written by another task or process; there is no event to wait on).
pub async fn wait_for_status(runtime: &Runtime, id: JobId, status: JobStatus) {
    eventually(format!("job {id} reaches {status}"), async || {
        (runtime.get(id).await.unwrap().status == status).then_some(())
    })
    .await;
}

/// [`eventually`] for a test on a plain thread.
pub fn eventually_blocking<T>(what: impl std::fmt::Display, mut check: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(answer) = check() {
            return answer;
        }
        assert!(start.elapsed() < GENEROUS, "{what}: not within {GENEROUS:?}");
        std::thread::sleep(POLL);
    }
}

/// The compiled-component cache shared by every test run.
pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("component-cache")
}

/// The settings of [`sandbox`]. With `LEASH_TEST_TIER=baseline`, every
/// component is compiled by the compiler a tiered sandbox runs a large
/// plugin's first jobs with (Winch), so the sandbox suites can be run on
/// either tier.
pub fn sandbox_config() -> SandboxConfig {
    let baseline = std::env::var("LEASH_TEST_TIER").as_deref() == Ok("baseline");
    SandboxConfig {
        allocator: Allocator::Pooling { slots: 16 },
        compiler: if baseline { Compiler::Winch } else { Compiler::default() },
        cache_dir: Some(cache_dir()),
        ..SandboxConfig::default()
    }
}

/// A sandbox like the one a process would build.
pub fn sandbox() -> Sandbox {
    Sandbox::new(sandbox_config()).expect("sandbox")
}

/// Load the built plugin `name`.
pub fn load(sandbox: &Sandbox, name: &str) -> Plugin {
    sandbox.load(&leash_tests::plugin_bytes(name)).unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

/// Limits with a generous timeout unless the test sets one.
pub fn limits() -> RunLimits {
    RunLimits { timeout: GENEROUS, ..RunLimits::default() }
}

/// A request to run the execute phase on `input`.
pub fn request(input: &[u8], limits: RunLimits) -> RunRequest {
    RunRequest {
        job_id: "01JTEST0000000000000000000".into(),
        ..RunRequest::new(Target::Execute, input.to_vec(), limits)
    }
}

/// Run plugin `name` once on `input` with `limits`.
pub async fn run(sandbox: &Sandbox, name: &str, input: &[u8], limits: RunLimits) -> Outcome {
    let plugin = load(sandbox, name);
    sandbox.run(&plugin, request(input, limits), &StopHandle::new(), Arc::new(NoObserver)).await
}

/// The output as JSON, or a panic naming the failure.
pub fn output_json(outcome: &Outcome) -> serde_json::Value {
    match &outcome.result {
        Ok(output) => serde_json::from_slice(output).expect("output is JSON"),
        Err(failure) => panic!("expected success, got {failure:?}"),
    }
}

/// After whatever ran before, the same sandbox still runs `hello` correctly.
pub async fn assert_hello_still_runs(sandbox: &Sandbox) {
    let outcome = run(sandbox, "hello", br#"{"name":"again"}"#, limits()).await;
    assert_eq!(output_json(&outcome)["greeting"], "Hello, again!");
}

/// Run `command` to completion, returning its output and its peak resident
/// set size in bytes (`VmHWM`, sampled from `/proc` every few milliseconds
/// while it runs: growth in its last moments could be missed, so run the
/// behaviour being measured for a while). Not `wait4`'s `ru_maxrss`: that
/// also counts this big test process, which the child was spawned from.
pub fn output_with_peak_rss(command: &mut std::process::Command) -> (std::process::Output, u64) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawns");
    let readers = [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .map(|pipe| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.expect("piped").read_to_end(&mut bytes).unwrap();
            bytes
        })
    });
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let status = loop {
        let hwm = std::fs::read_to_string(&status_file).ok().and_then(|text| {
            text.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse::<u64>().ok()
        });
        peak = peak.max(hwm.unwrap_or(0) * 1024);
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let [stdout, stderr] = readers.map(|r| r.join().unwrap());
    (std::process::Output { status, stdout, stderr }, peak)
}

/// Sends every progress report on a channel, so a test can wait for a
/// guest to be running before it acts.
pub struct ProgressTap(pub mpsc::UnboundedSender<Progress>);

impl ProgressTap {
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<Progress>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Arc::new(ProgressTap(tx)), rx)
    }
}

impl RunObserver for ProgressTap {
    fn on_progress(&self, progress: &Progress) {
        let _ = self.0.send(progress.clone());
    }
}

/// An HTTP server of the tests' own on loopback that records every request
/// it receives, as `METHOD /path?query` (with ` authorization=VALUE` and
/// ` idempotency-key=VALUE` when the request has those headers). Routes: `/hello` answers `hello`;
/// `/echo-auth` answers with the request's `Authorization` header;
/// `/big/N` streams N zero bytes (made as they are sent); `/slow` never
/// answers (and records `closed /slow` when its client goes away);
/// `/redirect?to=URL` answers 302 to URL; `/json` answers
/// `{"hello":"world"}`; `/echo` answers the request's body with its
/// content type; `/flaky` answers 503 the first time, then as `/json`;
/// anything else 404.
pub struct Upstream {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    received: UpstreamLog,
    task: tokio::task::JoinHandle<()>,
}

/// What an [`Upstream`] received, and a signal on every new entry.
#[derive(Clone)]
struct UpstreamLog {
    entries: Arc<std::sync::Mutex<Vec<String>>>,
    changed: Arc<tokio::sync::watch::Sender<usize>>,
}

impl UpstreamLog {
    fn push(&self, entry: String) {
        let mut entries = self.entries.lock().unwrap();
        entries.push(entry);
        self.changed.send_replace(entries.len());
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// Listen on a free loopback port.
    pub async fn start() -> Upstream {
        use axum::extract::{Request, State};
        use axum::response::{IntoResponse, Response};
        use futures_util::StreamExt as _;

        /// Records `closed /slow` when the server drops the handler.
        struct Closed(UpstreamLog);
        impl Drop for Closed {
            fn drop(&mut self) {
                self.0.push("closed /slow".to_owned());
            }
        }

        async fn answer(State(log): State<UpstreamLog>, request: Request) -> Response {
            let uri = request.uri().clone();
            let (entry, authorization, host) = {
                let header = |name: &str| request.headers().get(name).map(|v| v.to_str().unwrap_or("?").to_owned());
                let authorization = header("authorization");
                let host = header("host");
                let mut entry = format!("{} {uri}", request.method());
                for (name, value) in
                    [("authorization", &authorization), ("idempotency-key", &header("idempotency-key"))]
                {
                    if let Some(value) = value {
                        entry.push_str(&format!(" {name}={value}"));
                    }
                }
                (entry, authorization, host)
            };
            // Read the body before answering, as servers do: one that
            // answers and closes with the body unread makes the kernel reset
            // the connection, which can cut the answer off in flight (seen
            // as `HttpResponseIncomplete` under load).
            let content_type = request.headers().get("content-type").cloned();
            let body = axum::body::to_bytes(request.into_body(), usize::MAX).await.unwrap_or_default();
            log.push(entry);
            let path = uri.path();
            let json = || ([(axum::http::header::CONTENT_TYPE, "application/json")], r#"{"hello":"world"}"#);
            if path == "/json" {
                json().into_response()
            } else if path == "/flaky" {
                let hits = log.entries.lock().unwrap().iter().filter(|e| e.contains(" /flaky")).count();
                if hits == 1 {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response()
                } else {
                    json().into_response()
                }
            } else if path == "/echo" {
                let mut response = body.into_response();
                if let Some(content_type) = content_type {
                    response.headers_mut().insert(axum::http::header::CONTENT_TYPE, content_type);
                }
                response
            } else if path == "/hello" {
                "hello".into_response()
            } else if path == "/echo-auth" {
                authorization.unwrap_or_default().into_response()
            } else if path == "/echo-host" {
                host.unwrap_or_default().into_response()
            } else if path == "/slow-body" {
                // The head and a first chunk, then nothing.
                let stream = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(bytes::Bytes::from("x"))])
                    .chain(futures_util::stream::pending());
                axum::body::Body::from_stream(stream).into_response()
            } else if let Some(n) = path.strip_prefix("/big/").and_then(|n| n.parse::<u64>().ok()) {
                const CHUNK: usize = 64 << 10;
                let chunks = n.div_ceil(CHUNK as u64);
                let stream = futures_util::stream::iter((0..chunks).map(move |i| {
                    let len = if i + 1 == chunks { n - i * CHUNK as u64 } else { CHUNK as u64 };
                    Ok::<_, std::convert::Infallible>(bytes::Bytes::from(vec![0u8; len as usize]))
                }));
                axum::body::Body::from_stream(stream).into_response()
            } else if path == "/slow" {
                let _closed = Closed(log);
                std::future::pending::<()>().await;
                unreachable!()
            } else if path == "/redirect" {
                let to = uri.query().and_then(|q| q.strip_prefix("to=")).unwrap_or("/").to_owned();
                (axum::http::StatusCode::FOUND, [(axum::http::header::LOCATION, to)]).into_response()
            } else {
                axum::http::StatusCode::NOT_FOUND.into_response()
            }
        }

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the upstream");
        let addr = listener.local_addr().expect("its address");
        let received = UpstreamLog { entries: Arc::default(), changed: Arc::new(tokio::sync::watch::channel(0).0) };
        let app = axum::Router::new().fallback(answer).with_state(received.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Upstream { addr, received, task }
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<String> {
        self.received.entries.lock().unwrap().clone()
    }

    /// Wait (up to [`GENEROUS`]) until the log holds `entry`.
    pub async fn wait_for(&self, entry: &str) {
        let mut changed = self.received.changed.subscribe();
        let seen = changed.wait_for(|_| self.received().iter().any(|e| e == entry));
        tokio::time::timeout(GENEROUS, seen)
            .await
            .unwrap_or_else(|_| panic!("the upstream never logged {entry:?}: {:?}", self.received()))
            .expect("the upstream is running");
    }
}
