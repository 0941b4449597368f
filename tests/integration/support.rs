//! Helpers shared by the integration tests.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leash::job::Target;
use leash::sandbox::{
    Allocator, NoObserver, Outcome, Plugin, Progress, RunLimits, RunObserver, RunRequest, Sandbox, SandboxConfig,
    StopHandle,
};
use tokio::sync::mpsc;

/// A bound no healthy run in these tests comes near; only a hang reaches it.
pub const GENEROUS: Duration = Duration::from_secs(60);

/// The compiled-component cache shared by every test run.
pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("component-cache")
}

/// A sandbox like the one a process would build.
pub fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        allocator: Allocator::Pooling { slots: 16 },
        cache_dir: Some(cache_dir()),
        ..SandboxConfig::default()
    })
    .expect("sandbox")
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
        target: Target::Execute,
        attempt: 1,
        input: input.to_vec(),
        limits,
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
