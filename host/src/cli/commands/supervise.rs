//! `leash serve`'s supervised pool: the worker pool and the sweeps run in
//! a child process (`leash worker --supervised-by PID`, the same binary on
//! the same store), so a crash anywhere in a guest's run — a wasmtime bug a
//! hostile component found, an abort, an out-of-memory kill — ends that
//! child, never the API, its event streams or the dashboard.
//!
//! The two processes speak JSON lines over the child's stdin and stdout:
//! first the settings (the server's own worker settings and the worker id
//! the supervisor chose, so it knows whose jobs to reclaim however early
//! the child dies), then wakes, cancels and report requests one way, and
//! readiness, completions and reports the other. The child's stderr is
//! copied to the server's, and its last lines are kept.
//!
//! When the child dies, the supervisor reclaims its jobs at once
//! ([`Sweeps::worker_died`](crate::store::Sweeps::worker_died)): each
//! counts a process death, and the second quarantines the job
//! (`host_crash`, with how the process ended and its stderr's last lines).
//! Then it starts another, pausing (doubling up to 10 s) only while
//! children keep dying within seconds of their start. The child dies with
//! the server (`PR_SET_PDEATHSIG`), and stops when its stdin closes.

use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::worker::{build_runtime, worker_builder};
use crate::cli::process::{init_logging, stop_signal};
use crate::cli::{CliError, ExitStatus, WorkerArgs, load_secrets};
use crate::job::JobId;
use crate::runtime::{PoolReport, RemotePool, Runtime, Supervision};
use crate::sandbox::Redactor;
use crate::store::WorkerDiedParams;
use crate::worker::{Completion, new_worker_id};

/// Lines of a dead pool process's stderr its jobs' errors keep.
const STDERR_TAIL_LINES: usize = 20;
/// The longest stderr line kept (a line is cut at a character boundary).
const STDERR_LINE_BYTES: usize = 512;
/// How long a report may take before the pool counts as not answering.
const REPORT_WAIT: Duration = Duration::from_secs(2);
/// The first pause before starting a pool that died soon after its start.
const RESTART_PAUSE_MIN: Duration = Duration::from_millis(100);
/// The longest such pause.
const RESTART_PAUSE_MAX: Duration = Duration::from_secs(10);
/// A pool that lived this long was healthy: its successor starts at once.
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
/// Tries at reclaiming a dead pool's jobs while the store is unreachable
/// (after them, the lease sweep reclaims them when their leases run out).
const RECLAIM_TRIES: u32 = 20;

/// The first line the supervisor writes to its pool process.
#[derive(Debug, Serialize, Deserialize)]
struct Settings {
    worker_id: String,
    worker: WorkerArgs,
}

/// Supervisor to pool, one JSON object per line after the settings.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ToPool {
    /// Jobs may have become claimable.
    Wake,
    /// A cancel was requested for this job.
    Cancel(JobId),
    /// Send report number `n`.
    Report(u64),
    /// The supervisor quarantined this many jobs when the pool's
    /// predecessor died: count them with the pool's finished jobs.
    Quarantined(u64),
}

/// Pool to supervisor.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FromPool {
    /// The pool is built and claiming.
    Ready,
    /// A job the pool finished.
    Done(Completion),
    /// The answer to report request `n`.
    Report { n: u64, report: Box<PoolReport> },
}

/// The API runtime's line to its pool process (whichever is alive).
#[derive(Debug, Default)]
pub(super) struct PoolLink {
    sender: Mutex<Option<mpsc::UnboundedSender<ToPool>>>,
    /// A wake is queued and not yet written: wakes coalesce.
    wake_pending: Arc<AtomicBool>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<PoolReport>>>,
    next_report: AtomicU64,
    supervision: Mutex<Supervision>,
}

impl PoolLink {
    fn send(&self, message: ToPool) -> bool {
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        sender.as_ref().is_some_and(|s| s.send(message).is_ok())
    }

    fn connect(&self, sender: mpsc::UnboundedSender<ToPool>) {
        self.wake_pending.store(false, Ordering::SeqCst);
        *self.sender.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender);
    }

    fn disconnect(&self) {
        *self.sender.lock().unwrap_or_else(|e| e.into_inner()) = None;
        // Waiting reporters hear `None` at once.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn answer(&self, n: u64, report: PoolReport) {
        if let Some(waiter) = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&n) {
            let _ = waiter.send(report);
        }
    }

    fn supervise(&self, change: impl FnOnce(&mut Supervision)) {
        change(&mut self.supervision.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

#[async_trait::async_trait]
impl RemotePool for PoolLink {
    fn wake(&self) {
        if !self.wake_pending.swap(true, Ordering::SeqCst) && !self.send(ToPool::Wake) {
            self.wake_pending.store(false, Ordering::SeqCst);
        }
    }

    fn cancel(&self, id: JobId) {
        self.send(ToPool::Cancel(id));
    }

    async fn report(&self) -> Option<PoolReport> {
        let n = self.next_report.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(n, tx);
        let answer = if self.send(ToPool::Report(n)) {
            tokio::time::timeout(REPORT_WAIT, rx).await.ok().and_then(Result::ok)
        } else {
            None
        };
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&n);
        answer
    }

    fn supervision(&self) -> Supervision {
        self.supervision.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One pool process and the tasks that speak with it.
struct PoolProcess {
    child: Child,
    pid: Option<u32>,
    worker_id: String,
    started: Instant,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_copy: JoinHandle<()>,
    ready: Option<oneshot::Receiver<()>>,
}

impl PoolProcess {
    /// Start `leash worker --supervised-by <this pid>` with `args`.
    fn spawn(
        link: &Arc<PoolLink>,
        runtime: &Runtime,
        args: &WorkerArgs,
        redactor: &Arc<Redactor>,
    ) -> Result<PoolProcess, CliError> {
        let exe = std::env::current_exe()
            .map_err(|e| CliError::internal(format!("cannot find leash's own binary to start the pool: {e}")))?;
        let mut child = Command::new(exe)
            .arg("worker")
            .arg("--supervised-by")
            .arg(std::process::id().to_string())
            // The settings come over stdin, whole: a config file of the
            // server's (with keys `worker` does not take) stays its own.
            .env_remove("LEASH_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::internal(format!("cannot start the pool process: {e}")))?;
        let pid = child.id();
        let worker_id = new_worker_id();
        let settings = Settings { worker_id: worker_id.clone(), worker: args.clone() };
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(CliError::internal("the pool process's pipes were not opened"));
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_to_pool(stdin, settings, rx, link.wake_pending.clone()));
        link.connect(tx);
        let (ready_tx, ready_rx) = oneshot::channel();
        tokio::spawn(read_from_pool(stdout, link.clone(), runtime.clone(), ready_tx));
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_copy = tokio::spawn(copy_stderr(stderr, stderr_tail.clone(), redactor.clone()));
        link.supervise(|s| s.pid = pid);
        Ok(PoolProcess {
            child,
            pid,
            worker_id,
            started: Instant::now(),
            stderr_tail,
            stderr_copy,
            ready: Some(ready_rx),
        })
    }

    /// The last lines it wrote to stderr, once its stderr has closed (or
    /// a second has passed).
    async fn stderr_tail(&mut self) -> String {
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.stderr_copy).await;
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }
}

async fn write_to_pool(
    mut stdin: ChildStdin,
    settings: Settings,
    mut messages: mpsc::UnboundedReceiver<ToPool>,
    wake_pending: Arc<AtomicBool>,
) {
    let Ok(first) = serde_json::to_string(&settings) else { return };
    if stdin.write_all(format!("{first}\n").as_bytes()).await.is_err() {
        return;
    }
    while let Some(message) = messages.recv().await {
        if matches!(message, ToPool::Wake) {
            wake_pending.store(false, Ordering::SeqCst);
        }
        let Ok(line) = serde_json::to_string(&message) else { continue };
        if stdin.write_all(format!("{line}\n").as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn read_from_pool(
    stdout: tokio::process::ChildStdout,
    link: Arc<PoolLink>,
    runtime: Runtime,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match serde_json::from_str::<FromPool>(&line) {
            Ok(FromPool::Ready) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
            }
            Ok(FromPool::Done(completion)) => runtime.completed_elsewhere(completion),
            Ok(FromPool::Report { n, report }) => link.answer(n, *report),
            Err(e) => tracing::warn!(error = %e, "the pool process wrote a line that is not a message"),
        }
    }
}

/// Copy the child's stderr to ours, line by line, keeping the last lines.
/// Copy a pool process's stderr to ours, each line cleaned of every
/// secret first (a quarantined job's error keeps the last lines, and the
/// API shows it), then cut, so no value survives in part.
async fn copy_stderr(stderr: impl AsyncRead + Unpin, tail: Arc<Mutex<VecDeque<String>>>, redactor: Arc<Redactor>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(mut line)) = lines.next_line().await {
        redactor.clean(&mut line);
        // A closed stderr of ours must not stop the copy (nor the server).
        let _ = writeln!(std::io::stderr(), "{line}");
        let mut kept = line;
        if kept.len() > STDERR_LINE_BYTES {
            let cut = (0..=STDERR_LINE_BYTES).rev().find(|&i| kept.is_char_boundary(i)).unwrap_or(0);
            kept.truncate(cut);
        }
        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(kept);
    }
}

/// How a process ended, in words: `killed by signal 9 (SIGKILL)`,
/// `exited with status 70`.
fn describe(status: std::process::ExitStatus) -> String {
    if let Some(signal) = status.signal() {
        let name = match signal {
            libc::SIGKILL => "SIGKILL",
            libc::SIGABRT => "SIGABRT",
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGBUS => "SIGBUS",
            libc::SIGILL => "SIGILL",
            libc::SIGFPE => "SIGFPE",
            libc::SIGTERM => "SIGTERM",
            libc::SIGINT => "SIGINT",
            libc::SIGTRAP => "SIGTRAP",
            _ => "",
        };
        let core = if status.core_dumped() { ", core dumped" } else { "" };
        return match name {
            "" => format!("killed by signal {signal}{core}"),
            name => format!("killed by signal {signal} ({name}){core}"),
        };
    }
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => "ended".to_owned(),
    }
}

/// `leash serve`'s pool supervisor, running.
pub(super) struct Supervisor {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// The first pool process's worker id.
    pub(super) worker_id: String,
}

impl Supervisor {
    /// Start the pool process and wait until it is claiming. A first
    /// process that dies before then is the server's error, with its
    /// stderr (bad settings are found before any job is at stake).
    pub(super) async fn start(link: Arc<PoolLink>, runtime: Runtime, args: WorkerArgs) -> Result<Supervisor, CliError> {
        let redactor = Arc::new(load_secrets(args.secrets_file.as_deref())?.redactor_every());
        let mut pool = PoolProcess::spawn(&link, &runtime, &args, &redactor)?;
        let ready = pool.ready.take().expect("a new pool process has its ready signal");
        tokio::select! {
            answer = ready => {
                if answer.is_err() {
                    // Its stdout closed before it said it was ready.
                    let status = pool.child.wait().await.map(describe).unwrap_or_else(|e| e.to_string());
                    let stderr = pool.stderr_tail().await;
                    return Err(CliError::internal(format!(
                        "the pool process {status} before it was ready; its stderr ended:\n{stderr}"
                    )));
                }
            }
            status = pool.child.wait() => {
                let status = status.map(describe).unwrap_or_else(|e| e.to_string());
                let stderr = pool.stderr_tail().await;
                return Err(CliError::internal(format!(
                    "the pool process {status} before it was ready; its stderr ended:\n{stderr}"
                )));
            }
        }
        let worker_id = pool.worker_id.clone();
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(supervise(pool, link, runtime, args, redactor, stop_rx));
        Ok(Supervisor { stop, task, worker_id })
    }

    /// Stop the pool process (SIGTERM: it shuts down within its budget)
    /// and wait for it; past the budget and a margin, kill it.
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn supervise(
    mut pool: PoolProcess,
    link: Arc<PoolLink>,
    runtime: Runtime,
    args: WorkerArgs,
    redactor: Arc<Redactor>,
    mut stop: watch::Receiver<bool>,
) {
    let mut pause = Duration::ZERO;
    loop {
        tokio::select! {
            status = pool.child.wait() => {
                let how = status.map(describe).unwrap_or_else(|e| format!("was lost ({e})"));
                link.disconnect();
                link.supervise(|s| {
                    s.pid = None;
                    s.restarts += 1;
                    s.last_exit = Some(how.clone());
                });
                runtime.metrics().pool_restarts.inc();
                tracing::error!(
                    pid = pool.pid,
                    worker_id = pool.worker_id,
                    "the pool process {how}; its jobs are reclaimed and another starts"
                );
                let stderr = pool.stderr_tail().await;
                let quarantined = reclaim(&runtime, &pool.worker_id, &how, &stderr, args.queue_ttl).await;
                pause = if pool.started.elapsed() >= HEALTHY_AFTER {
                    Duration::ZERO
                } else {
                    (pause * 2).clamp(RESTART_PAUSE_MIN, RESTART_PAUSE_MAX)
                };
                pool = loop {
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stop.changed() => return,
                    }
                    match PoolProcess::spawn(&link, &runtime, &args, &redactor) {
                        Ok(pool) => break pool,
                        Err(e) => {
                            tracing::error!("{e}");
                            pause = (pause * 2).clamp(RESTART_PAUSE_MIN, RESTART_PAUSE_MAX);
                        }
                    }
                };
                // Jobs it reclaimed are due now: the new pool claims them
                // as soon as it is up (it claims on start anyway).
                link.wake();
                if quarantined > 0 {
                    link.send(ToPool::Quarantined(quarantined));
                }
            }
            _ = stop.changed() => {
                // Its stdin closes (it stops at the end of it) and it is
                // sent SIGTERM, whichever it hears first.
                link.disconnect();
                if let Some(pid) = pool.pid.and_then(|pid| i32::try_from(pid).ok()) {
                    // SAFETY: kill only sends a signal to our own child.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
                let margin = args.shutdown_budget + Duration::from_secs(5);
                if tokio::time::timeout(margin, pool.child.wait()).await.is_err() {
                    tracing::error!("the pool process did not stop within its shutdown budget; killing it");
                    let _ = pool.child.kill().await;
                    let stderr = pool.stderr_tail().await;
                    reclaim(&runtime, &pool.worker_id, "was killed at shutdown", &stderr, args.queue_ttl).await;
                }
                return;
            }
        }
    }
}

/// Reclaim a dead pool's jobs, retrying while the store is unreachable;
/// how many it quarantined.
async fn reclaim(runtime: &Runtime, worker_id: &str, how: &str, stderr: &str, queue_ttl: Duration) -> u64 {
    for attempt in 1..=RECLAIM_TRIES {
        let params = WorkerDiedParams {
            worker_id: worker_id.to_owned(),
            how: how.to_owned(),
            stderr: stderr.to_owned(),
            now: runtime.now(),
            queue_ttl,
        };
        match runtime.store().worker_died(params).await {
            Ok(report) => {
                tracing::info!(
                    worker_id,
                    requeued = report.requeued,
                    ended = report.failed,
                    quarantined = report.quarantined,
                    "reclaimed the dead pool's jobs"
                );
                return report.quarantined;
            }
            Err(e) if attempt < RECLAIM_TRIES => {
                tracing::warn!(error = %e, "cannot reclaim the dead pool's jobs yet");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => tracing::error!(
                error = %e,
                "cannot reclaim the dead pool's jobs; the lease sweep will when their leases run out"
            ),
        }
    }
    0
}

/// `leash worker --supervised-by PID`: the pool process. Dies with its
/// supervisor; reads its settings, then messages, from stdin; stops on
/// SIGINT, SIGTERM or the end of stdin.
pub(in crate::cli) async fn run_pool_process(supervisor: u32) -> Result<ExitStatus, CliError> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) reads only its integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    // Set after the fork: a supervisor that died before it was set has
    // left this process to another parent.
    if std::os::unix::process::parent_id() != supervisor {
        return Err(CliError::internal(format!("the supervising process {supervisor} is gone")));
    }
    // Read on a thread of its own: a read blocked on stdin must not hold
    // the process at exit (tokio's stdin would, until the next line).
    let (lines, mut stdin) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let first = stdin.recv().await.ok_or_else(|| CliError::internal("the supervisor sent no settings"))?;
    let Settings { worker_id, worker: args } = serde_json::from_str(&first)
        .map_err(|e| CliError::internal(format!("the pool's settings do not parse: {e}")))?;
    init_logging(&args.log_format)?;
    // `None` ends the writer (the runtime's completion subscriber keeps a
    // sender to the end).
    let (out, mut out_rx) = mpsc::unbounded_channel::<Option<FromPool>>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(Some(message)) = out_rx.recv().await {
            let Ok(line) = serde_json::to_string(&message) else { continue };
            if stdout.write_all(format!("{line}\n").as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    let done = out.clone();
    let builder = worker_builder(&args)?.worker_id(worker_id).on_complete(move |completion| {
        let _ = done.send(Some(FromPool::Done(completion.clone())));
    });
    let runtime = build_runtime(builder).await?;
    let stop = stop_signal()?;
    let _ = out.send(Some(FromPool::Ready));
    tracing::info!(
        worker_id = runtime.worker_id(),
        "{} running {} slots on {} as the pool of leash serve (pid {supervisor})",
        runtime.worker_id(),
        args.max_workers,
        args.store.database()
    );
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            line = stdin.recv() => match line {
                Some(line) => match serde_json::from_str::<ToPool>(&line) {
                    Ok(ToPool::Wake) => runtime.wake_pool(),
                    Ok(ToPool::Cancel(id)) => {
                        runtime.stop_here(id);
                    }
                    Ok(ToPool::Quarantined(n)) => runtime.metrics().jobs_quarantined(n),
                    Ok(ToPool::Report(n)) => {
                        let report = Box::new(runtime.pool_report());
                        let _ = out.send(Some(FromPool::Report { n, report }));
                    }
                    Err(e) => tracing::warn!(error = %e, "the supervisor wrote a line that is not a message"),
                },
                // The supervisor is gone (or closed our stdin): stop.
                None => break,
            },
        }
    }
    tracing::info!(budget = ?args.shutdown_budget, "shutting down");
    runtime.shutdown().await;
    let _ = out.send(None);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    tracing::info!("stopped");
    Ok(ExitStatus::Success)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::http::SecretStore;

    #[tokio::test]
    async fn a_pool_process_s_stderr_is_kept_cleaned_of_every_secret_before_it_is_cut() {
        let secrets = SecretStore::from_pairs([
            ("PW".to_owned(), "hunter2".to_owned()),
            ("KEY".to_owned(), "k3y-v4l".to_owned()),
        ])
        .unwrap();
        // One value past where a long line is cut, straddling the cut.
        let long = format!("{}hunter2", "x".repeat(STDERR_LINE_BYTES - 3));
        let stderr = format!("GET https://up.example/?t=k3y-v4l failed\n{{\"pw\":\"hunter2\"}}\n{long}\n");
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        copy_stderr(stderr.as_bytes(), tail.clone(), Arc::new(secrets.redactor_every())).await;
        let kept: Vec<String> = tail.lock().unwrap().iter().cloned().collect();
        assert_eq!(kept[0], "GET https://up.example/?t={secret:KEY} failed");
        assert_eq!(kept[1], r#"{"pw":"{secret:PW}"}"#);
        assert!(kept[2].starts_with("xxx") && !kept[2].contains("hun"), "{}", kept[2]);
        assert!(kept.iter().all(|l| !l.contains("hunter2") && !l.contains("k3y")));
    }
}
