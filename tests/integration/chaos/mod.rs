//! The chaos run: thousands of jobs of mixed plugins through one `leash
//! serve` and two `leash worker` processes sharing one SQLite file, while
//! the processes are SIGKILLed and restarted at random moments, stopped
//! with SIGTERM and restarted, and one is paused (SIGSTOP, then SIGCONT)
//! past its lease. Then a checker reads the store and the processes'
//! shared start log (`--start-log`) and proves: every submitted job exists
//! once and is terminal, with an ending its plugin can have; no job with
//! `max_attempts = 1` started more often than once plus its shutdown
//! releases and its free re-runs (a lost lease before any effect: these
//! plugins issue none); every re-run is counted in `lost_leases`,
//! `free_reruns`, `releases` or `retries`; no attempt started twice; every SIGTERM ended its process with exit 0 in
//! its budget; no process died on its own or panicked (SQLITE_BUSY between
//! the processes is transient, never a crash). It reports how many
//! `max_attempts = 1` jobs a SIGTERM release ran twice.
//!
//! An outside writer also holds the write lock past the busy timeout, so
//! every process sees SQLITE_BUSY.
//!
//! The same run on PostgreSQL (`chaos::postgres_five_thousand_jobs`) uses
//! a private cluster of its own, two `leash serve` replicas and one
//! `leash worker`; instead of the lock hold it terminates every leash
//! connection at once (twice) and crashes and restarts the cluster once.
//!
//! `chaos::ten_thousand_jobs` (10,000 jobs, 24 kills, 8 SIGTERMs, 2
//! pauses, 1 lock hold) and `chaos::postgres_five_thousand_jobs` (5,000
//! jobs, 20 kills, 4 SIGTERMs, 1 pause, 2 connection storms, 1 restart)
//! take minutes, so `cargo test` leaves them out (ignored) and CI runs
//! them in its long step, with the other ignored tests:
//!
//! ```sh
//! cargo test -p leash --test integration -- --ignored --skip chaos::long
//! ```
//!
//! The long run (100,000 jobs, 200 kills):
//!
//! ```sh
//! cargo test -p leash --test integration chaos::long -- --ignored --nocapture
//! ```
//!
//! `LEASH_CHAOS_SEED` replays the same random choices; `LEASH_CHAOS_JOBS`
//! and `LEASH_CHAOS_KILLS` change the long run's size.

mod approvals;
pub(crate) mod crash;
mod decisions;
mod effects;
mod supervised;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leash::job::{ErrorKind, Job, JobId, JobStatus};
use leash::store::{Database, Durability, JobListParams, JobStore};
use serde_json::{Value, json};

use crate::support::server::leash_bin;

const TOKEN: &str = "chaos-token-0123456789abcdef";
const LEASE_TTL: Duration = Duration::from_secs(1);
const SLOTS_PER_PROCESS: &str = "4";
/// How long start-up (the servers answering, the plugins registering) may
/// take: CI runs this beside a release build on two cores.
const STARTUP_PATIENCE: Duration = Duration::from_secs(120);

/// Which store the processes share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// One SQLite file: one `serve`, two `worker`s.
    Sqlite,
    /// A private PostgreSQL cluster: two `serve` replicas, one `worker`.
    Postgres,
}

/// How big a run is.
#[derive(Debug, Clone, Copy)]
struct Plan {
    backend: Backend,
    jobs: u64,
    kills: u32,
    /// SIGTERMs (a clean stop, then a restart), spread over the kills.
    terms: u32,
    pauses: u32,
    /// Times an outside writer holds the write lock past the busy timeout
    /// (SQLite).
    lock_holds: u32,
    /// Times every leash connection is terminated at once (PostgreSQL).
    storms: u32,
    /// Times the cluster is crashed and restarted (PostgreSQL).
    restarts: u32,
    seed: u64,
    /// The whole run, drain included, must end within this.
    deadline: Duration,
}

/// A number from the environment, if set.
fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `LEASH_CHAOS_SEED` if set (a replay), else a fresh one.
pub(crate) fn seed() -> u64 {
    env_u64("LEASH_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    })
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn ten_thousand_jobs() {
    run(Plan {
        backend: Backend::Sqlite,
        jobs: 10_000,
        kills: 24,
        terms: 8,
        pauses: 2,
        lock_holds: 1,
        storms: 0,
        restarts: 0,
        seed: seed(),
        deadline: Duration::from_secs(600),
    });
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn postgres_five_thousand_jobs() {
    run(Plan {
        backend: Backend::Postgres,
        jobs: 5_000,
        kills: 20,
        terms: 4,
        pauses: 1,
        lock_holds: 0,
        storms: 2,
        restarts: 1,
        seed: seed(),
        deadline: Duration::from_secs(600),
    });
}

#[test]
#[ignore = "the long chaos run takes several minutes; see the module docs"]
fn long() {
    run(Plan {
        backend: Backend::Sqlite,
        jobs: env_u64("LEASH_CHAOS_JOBS").unwrap_or(100_000),
        kills: env_u64("LEASH_CHAOS_KILLS").map_or(200, |k| k as u32),
        terms: env_u64("LEASH_CHAOS_TERMS").map_or(60, |k| k as u32),
        pauses: 10,
        lock_holds: 3,
        storms: 0,
        restarts: 0,
        seed: seed(),
        deadline: Duration::from_secs(3_600),
    });
}

/// splitmix64: a schedule that replays from its seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(crate) fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

/// The plugins in the mix, and what each may end as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    /// Fast: `hello`.
    Fast,
    /// Slow, reporting progress and checking for cancellation: `coop`.
    Coop,
    /// Slow without progress: `sleep`.
    Slow,
    /// Fails on purpose: `fail`.
    Failing,
}

/// One submission: what was asked, and the job it became.
#[derive(Debug, Clone)]
struct Submitted {
    kind: Kind,
    name: String,
    max_attempts: u32,
    id: JobId,
}

fn job_body(n: u64, rng: &mut Rng) -> (Kind, u32, Value) {
    let max_attempts = if rng.below(2) == 0 { 1 } else { 3 };
    let (kind, plugin, input) = match rng.below(100) {
        0..60 => (Kind::Fast, "hello", json!({ "name": format!("n{n}") })),
        60..75 => (Kind::Coop, "coop", json!({ "steps": 100 + rng.below(900) })),
        75..88 => (Kind::Slow, "sleep", json!({ "ms": 20 + rng.below(100) })),
        _ => (Kind::Failing, "fail", json!({ "kind": "failed", "message": format!("n{n} fails") })),
    };
    let body = json!({
        "plugin": plugin,
        "input": input,
        "execution": "async",
        "max_attempts": max_attempts,
        "plan_id": format!("chaos-{n}"),
        "timeout_ms": 60_000,
    });
    (kind, max_attempts, body)
}

/// `leash COMMAND` on `db` with the chaos runs' settings: short leases,
/// quick polls and grace, a shared start log.
pub(crate) fn chaos_args(command: &str, db: &str, lease: Duration, start_log: &Path) -> Vec<String> {
    let lease = format!("{}ms", lease.as_millis());
    let args = [
        command,
        "--db",
        db,
        "--max-workers",
        SLOTS_PER_PROCESS,
        "--poll-interval",
        "50ms",
        "--lease-ttl",
        &lease,
        "--cancel-grace",
        "300ms",
        "--shutdown-budget",
        "2s",
        "--start-log",
        &start_log.display().to_string(),
    ];
    args.iter().map(|s| s.to_string()).collect()
}

/// One of the processes under test, restarted after each kill.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) args: Vec<String>,
    pub(crate) stderr: PathBuf,
    pub(crate) child: Option<Child>,
    /// What the process prints on stderr once it is up.
    pub(crate) ready_line: &'static str,
    /// Ready lines printed by earlier starts (all of them dead).
    pub(crate) ready_before: usize,
}

impl Proc {
    pub(crate) fn spawn(&mut self) {
        // Counted before the start: a loaded machine can delay this thread
        // past the new process's own ready line, which must not count as
        // an earlier one.
        self.ready_before = self.ready_lines();
        let log = File::options().create(true).append(true).open(&self.stderr).expect("stderr file");
        let child = leash_bin()
            .args(&self.args)
            .env("LEASH_API_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start a leash process");
        self.child = Some(child);
    }

    /// The last `n` lines the process (all its starts) wrote to stderr.
    pub(crate) fn stderr_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn ready_lines(&self) -> usize {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        text.lines().filter(|l| l.contains(self.ready_line)).count()
    }

    /// Wait until the latest start has printed its ready line (a signal
    /// before the handlers are installed would end it by default action).
    pub(crate) fn wait_ready(&self, deadline: Instant) {
        while self.ready_lines() <= self.ready_before {
            assert!(
                Instant::now() < deadline,
                "{} never became ready; its stderr ends:\n{}",
                self.name,
                self.stderr_tail(20)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> String {
        self.child.as_ref().expect("running").id().to_string()
    }

    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.pid()]).status().expect("kill runs");
        assert!(status.success(), "kill {signal} {}", self.name);
    }

    pub(crate) fn kill_and_reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `Some(status)` if it ended without being told to.
    pub(crate) fn exited_on_its_own(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }
}

struct Harness {
    dir: tempfile::TempDir,
    /// The store: an SQLite path or a PostgreSQL URL.
    db: String,
    /// The PostgreSQL cluster, when the run uses one.
    cluster: Option<crate::support::pg::Cluster>,
    start_log: PathBuf,
    /// One base URL per `serve` process.
    urls: Vec<String>,
    http: reqwest::Client,
}

impl Harness {
    /// `None`: the backend is not available here (and the test said so).
    fn new(backend: Backend) -> Option<Harness> {
        let dir = tempfile::tempdir().unwrap();
        let (db, cluster, serves) = match backend {
            Backend::Sqlite => (dir.path().join("chaos.db").display().to_string(), None, 1),
            Backend::Postgres => {
                let cluster = crate::support::pg::Cluster::start()?;
                (cluster.url(), Some(cluster), 2)
            }
        };
        let start_log = dir.path().join("starts.log");
        let urls = (0..serves)
            .map(|_| {
                let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                format!("http://127.0.0.1:{port}")
            })
            .collect();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(15)).build().unwrap();
        Some(Harness { dir, db, cluster, start_log, urls, http })
    }

    /// The processes under test: `serve` processes first (one per URL),
    /// then workers.
    fn processes(&self) -> Vec<Proc> {
        let mut procs: Vec<Proc> = self
            .urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let name = if self.urls.len() == 1 { "serve".to_owned() } else { format!("serve-{}", i + 1) };
                self.process(&name, "serve", &["--listen", url.trim_start_matches("http://")])
            })
            .collect();
        let workers: &[&str] = if self.urls.len() == 1 { &["worker-a", "worker-b"] } else { &["worker"] };
        procs.extend(workers.iter().map(|name| self.process(name, "worker", &[])));
        procs
    }

    fn process(&self, name: &str, command: &str, extra: &[&str]) -> Proc {
        let mut args = chaos_args(command, &self.db, LEASE_TTL, &self.start_log);
        args.extend(extra.iter().map(|s| s.to_string()));
        let ready_line = if command == "serve" { "serving " } else { " running " };
        let stderr = self.dir.path().join(format!("{name}.stderr"));
        Proc { name: name.into(), args, stderr, child: None, ready_line, ready_before: 0 }
    }

    /// A request to the `serve` process `n` picks (any of them will do).
    fn request_to(&self, n: u64, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = &self.urls[(n % self.urls.len() as u64) as usize];
        self.http.request(method, format!("{url}{path}")).bearer_auth(TOKEN)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_to(0, method, path)
    }

    /// Wait for every `serve` to answer; a loaded machine (CI builds
    /// beside the tests) may take a while to start debug binaries.
    async fn wait_up(&self, serves: &[Proc]) {
        let start = Instant::now();
        for (url, serve) in self.urls.iter().zip(serves) {
            while !self.http.get(format!("{url}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
                assert!(
                    start.elapsed() < STARTUP_PATIENCE,
                    "{} never came up at {url}; its stderr ends:\n{}",
                    serve.name,
                    serve.stderr_tail(20)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Register `name`, sending the upload again after a transport error
    /// or a busy answer (an upload is idempotent: stored by digest).
    async fn add_plugin(&self, name: &str, serve: &Proc) {
        let start = Instant::now();
        loop {
            let sent = self
                .request(reqwest::Method::POST, &format!("/v1/plugins?name={name}"))
                .timeout(STARTUP_PATIENCE)
                .body(leash_tests::plugin_bytes(name))
                .send()
                .await;
            let problem = match sent {
                Ok(response) if response.status().as_u16() == 201 => return,
                Ok(response) if matches!(response.status().as_u16(), 429 | 503) => {
                    format!("answered {}", response.status())
                }
                Ok(response) => {
                    let status = response.status();
                    panic!("upload {name}: {status}: {}", response.text().await.unwrap_or_default())
                }
                Err(e) => format!("failed: {e}"),
            };
            assert!(
                start.elapsed() < STARTUP_PATIENCE,
                "upload {name} {problem}; {}'s stderr ends:\n{}",
                serve.name,
                serve.stderr_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Submit until the job exists exactly once. A request that may have
    /// reached the server (anything but a refused connection) is settled by
    /// looking its plan id up before it is sent again.
    async fn submit(&self, n: u64, body: &Value, seen: &Seen) -> JobId {
        let plan = format!("chaos-{n}");
        // Each try goes to the next replica: one that is down is skipped.
        for attempt in n.. {
            // The plan id is also the request's idempotency key: a retry of
            // a request that landed (or is still landing on the other
            // replica) returns that job instead of queueing a second.
            let request = self.request_to(attempt, reqwest::Method::POST, "/v1/jobs").header("idempotency-key", &plan);
            match request.json(body).send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let answer = response.json::<Value>().await;
                    match (status, answer) {
                        (202, Ok(answer)) => {
                            return answer["job_id"].as_str().expect("job id").parse().expect("a job id");
                        }
                        (429 | 503, _) => {
                            seen.refused.fetch_add(1, Ordering::Relaxed);
                        }
                        (202, Err(_)) => {
                            seen.ambiguous.fetch_add(1, Ordering::Relaxed);
                            if let Some(id) = self.find_plan(&plan).await {
                                return id;
                            }
                        }
                        (other, answer) => panic!("submit {plan}: unexpected {other}: {answer:?}"),
                    }
                }
                Err(e) if e.is_connect() => {
                    seen.unreachable.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    seen.ambiguous.fetch_add(1, Ordering::Relaxed);
                    if let Some(id) = self.find_plan(&plan).await {
                        return id;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!("the attempts never run out")
    }

    /// The job submitted under `plan`, once a server answers.
    async fn find_plan(&self, plan: &str) -> Option<JobId> {
        for attempt in 0.. {
            let answer = self.request_to(attempt, reqwest::Method::GET, &format!("/v1/jobs?plan={plan}")).send().await;
            if let Ok(response) = answer
                && response.status().is_success()
                && let Ok(list) = response.json::<Value>().await
            {
                let jobs = list["jobs"].as_array().expect("a job list");
                assert!(jobs.len() <= 1, "{plan} was queued twice: {list}");
                return jobs.first().map(|j| j["id"].as_str().expect("id").parse().expect("a job id"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!("the attempts never run out")
    }

    /// Ask for a cancel until some process answers it.
    async fn cancel(&self, id: JobId) {
        for attempt in 0.. {
            let answer = self.request_to(attempt, reqwest::Method::POST, &format!("/v1/jobs/{id}/cancel")).send().await;
            if let Ok(response) = answer {
                match response.status().as_u16() {
                    200 | 202 | 409 => return,
                    429 | 503 => {}
                    other => panic!("cancel {id}: unexpected {other}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What the submitters saw.
#[derive(Debug, Default)]
struct Seen {
    /// Connections refused (the server was down): sent again.
    unreachable: AtomicU64,
    /// 429 or 503 (busy database) answers: sent again.
    refused: AtomicU64,
    /// Requests cut off after they may have landed: settled by plan id.
    ambiguous: AtomicU64,
}

/// What the chaos loop did.
#[derive(Debug, Default)]
struct Chaos {
    kills: u32,
    kills_by_process: BTreeMap<String, u32>,
    terms: u32,
    /// The longest a SIGTERMed process took to exit.
    slowest_term: Duration,
    pauses: u32,
    lock_holds: u32,
    storms: u32,
    /// Connections the storms terminated.
    terminated: u64,
    restarts: u32,
    /// Processes that ended without being told to, with their status.
    crashes: Vec<String>,
}

fn run(plan: Plan) {
    eprintln!("chaos: {plan:?} (LEASH_CHAOS_SEED={} replays the same random choices)", plan.seed);
    let started = Instant::now();
    let Some(harness) = Harness::new(plan.backend) else { return };
    let harness = Arc::new(harness);
    let mut procs = harness.processes();
    let serves = harness.urls.len();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    for p in &mut procs[..serves] {
        p.spawn();
    }
    rt.block_on(async {
        harness.wait_up(&procs[..serves]).await;
        for plugin in ["hello", "coop", "sleep", "fail"] {
            harness.add_plugin(plugin, &procs[0]).await;
        }
    });
    for p in &mut procs[serves..] {
        p.spawn();
    }

    // Submit from four tasks; cancel about a third of the coop jobs a
    // moment after they are submitted.
    let submitted: Arc<Mutex<BTreeMap<u64, Submitted>>> = Arc::default();
    let cancel_asked: Arc<Mutex<HashSet<JobId>>> = Arc::default();
    let seen = Arc::new(Seen::default());
    let next = Arc::new(AtomicU64::new(0));
    // When the last submit landed, in ms since the start; 0 while submitting.
    let submitted_at_ms = Arc::new(AtomicU64::new(0));
    let (cancel_tx, mut cancel_rx) = tokio::sync::mpsc::unbounded_channel::<(JobId, Instant)>();
    let mut submitters = Vec::new();
    for task in 0..4u64 {
        let (harness, submitted, seen, next, cancel_tx) =
            (harness.clone(), submitted.clone(), seen.clone(), next.clone(), cancel_tx.clone());
        let mut rng = Rng(plan.seed ^ (task + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
        submitters.push(rt.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= plan.jobs {
                    return;
                }
                let (kind, max_attempts, body) = job_body(n, &mut rng);
                let id = harness.submit(n, &body, &seen).await;
                if kind == Kind::Coop && rng.below(3) == 0 {
                    let _ = cancel_tx.send((id, Instant::now() + Duration::from_millis(rng.below(300))));
                }
                let name = format!("n{n}");
                submitted.lock().unwrap().insert(n, Submitted { kind, name, max_attempts, id });
            }
        }));
    }
    drop(cancel_tx);
    let canceller = {
        let (harness, cancel_asked) = (harness.clone(), cancel_asked.clone());
        rt.spawn(async move {
            while let Some((id, at)) = cancel_rx.recv().await {
                tokio::time::sleep_until(at.into()).await;
                cancel_asked.lock().unwrap().insert(id);
                harness.cancel(id).await;
            }
        })
    };
    {
        let done_at = submitted_at_ms.clone();
        let waiting: Vec<_> = std::mem::take(&mut submitters);
        rt.spawn(async move {
            for task in waiting {
                task.await.expect("a submitter panicked");
            }
            done_at.store((started.elapsed().as_millis() as u64).max(1), Ordering::SeqCst);
        });
    }

    // Kill a random process at a random moment, restart it after a random
    // delay; pause a worker past its lease along the way.
    let mut rng = Rng(plan.seed);
    let mut chaos = Chaos::default();
    let pause_at: Vec<u32> = (1..=plan.pauses).map(|i| plan.kills * i / (plan.pauses + 1)).collect();
    let term_at: Vec<u32> = (1..=plan.terms).map(|i| (plan.kills * i / (plan.terms + 1)).max(1)).collect();
    // The first lock hold comes early, while jobs are still being submitted.
    let hold_at: Vec<u32> = (0..plan.lock_holds).map(|i| 2 + plan.kills * i / plan.lock_holds).collect();
    let storm_at: Vec<u32> = (1..=plan.storms).map(|i| plan.kills * i / (plan.storms + 1) + 1).collect();
    let restart_at: Vec<u32> = (1..=plan.restarts).map(|i| plan.kills * i / (plan.restarts + 1) + 2).collect();
    while chaos.kills < plan.kills || submitted_at_ms.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < plan.deadline, "chaos did not finish in {:?}: {chaos:?}", plan.deadline);
        std::thread::sleep(rng.millis(150, 700));
        check_alive(&mut procs, &mut chaos);
        if chaos.kills >= plan.kills {
            continue;
        }
        let victim = if hold_at.contains(&(chaos.kills + 1)) {
            1 + rng.below(procs.len() as u64 - 1) as usize
        } else {
            rng.below(procs.len() as u64) as usize
        };
        procs[victim].kill_and_reap();
        std::thread::sleep(rng.millis(0, 300));
        procs[victim].spawn();
        chaos.kills += 1;
        *chaos.kills_by_process.entry(procs[victim].name.clone()).or_default() += 1;
        for _ in term_at.iter().filter(|&&at| at == chaos.kills) {
            // A clean stop while jobs run: stop claiming, stop the guests,
            // release their jobs (or keep what returned in the grace), exit 0.
            let victim = rng.below(procs.len() as u64) as usize;
            procs[victim].wait_ready(Instant::now() + STARTUP_PATIENCE);
            procs[victim].signal("-TERM");
            let asked = Instant::now();
            let status = procs[victim].child.take().expect("running").wait().expect("wait");
            chaos.slowest_term = chaos.slowest_term.max(asked.elapsed());
            if !status.success() {
                chaos.crashes.push(format!("{} exited {status} after a SIGTERM", procs[victim].name));
            }
            std::thread::sleep(rng.millis(0, 300));
            procs[victim].spawn();
            chaos.terms += 1;
        }
        if pause_at.contains(&chaos.kills) {
            let paused = 1 + rng.below(2) as usize;
            procs[paused].signal("-STOP");
            std::thread::sleep(LEASE_TTL * 5 / 2);
            procs[paused].signal("-CONT");
            chaos.pauses += 1;
        }
        if hold_at.contains(&chaos.kills) {
            // A worker was just restarted: it opens the database while the
            // lock is held. The server is up: its submits answer 503. (Held
            // for two busy timeouts: a submit queued behind a write already
            // waiting for the lock fails in the second.)
            procs[0].wait_ready(Instant::now() + STARTUP_PATIENCE);
            hold_write_lock(Path::new(&harness.db), Duration::from_secs(11));
            chaos.lock_holds += 1;
        }
        if let Some(cluster) = &harness.cluster {
            if storm_at.contains(&chaos.kills) {
                // Every connection of every process at once, as a failover
                // or an operator's pg_terminate_backend would.
                chaos.terminated += rt.block_on(cluster.terminate_leash_backends());
                chaos.storms += 1;
            }
            if restart_at.contains(&chaos.kills) {
                cluster.crash_and_restart();
                chaos.restarts += 1;
            }
        }
    }
    let chaos_over = started.elapsed();

    // Drain: every job must end.
    let store = rt.block_on(async {
        leash::store::open(&Database::parse(&harness.db), Durability::Normal).await.expect("open the store")
    });
    let submitted: Vec<Submitted> = submitted.lock().unwrap().values().cloned().collect();
    assert_eq!(submitted.len() as u64, plan.jobs, "every submission got a job id");
    rt.block_on(async {
        loop {
            check_alive(&mut procs, &mut chaos);
            let counts = store.counts_snapshot().await.expect("counts");
            if counts.queued + counts.running == 0 {
                break;
            }
            assert!(
                started.elapsed() < plan.deadline,
                "jobs still open after {:?}: {counts:?}; {chaos:?}",
                plan.deadline
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    rt.block_on(canceller).expect("the canceller panicked");
    let drained = started.elapsed();

    // A clean stop: SIGTERM, exit 0.
    for p in &mut procs {
        p.wait_ready(Instant::now() + STARTUP_PATIENCE);
        p.signal("-TERM");
        let status = p.child.take().expect("running").wait().expect("wait");
        if !status.success() {
            chaos.crashes.push(format!("{} exited {status} after SIGTERM", p.name));
        }
    }

    let jobs = rt.block_on(all_jobs(&*store));
    let starts = read_start_log(&harness.start_log);
    let cancel_asked = cancel_asked.lock().unwrap().clone();
    let mut report = check(&submitted, &jobs, &starts, &cancel_asked);
    report.violations.extend(panics(&procs));
    // Outputs: every succeeded `hello` greets its own input, as the attempt
    // that finished.
    rt.block_on(async {
        for s in submitted.iter().filter(|s| s.kind == Kind::Fast) {
            let job = store.job_get(s.id).await.expect("get").expect("exists");
            if job.status == JobStatus::Succeeded {
                let output: Value = serde_json::from_slice(job.output.as_deref().unwrap_or_default()).expect("JSON");
                if output["greeting"] != format!("Hello, {}!", s.name) || output["attempt"] != job.attempt {
                    report
                        .violations
                        .push(format!("{}: output {output} does not belong to attempt {}", s.id, job.attempt));
                }
            }
        }
    });

    let summary = json!({
        "seed": plan.seed,
        "backend": format!("{:?}", plan.backend),
        "jobs": plan.jobs,
        "processes": procs.len(),
        "kills": chaos.kills,
        "kills_by_process": chaos.kills_by_process,
        "sigterms": chaos.terms,
        "slowest_sigterm_exit_seconds": chaos.slowest_term.as_secs_f64(),
        "pauses": chaos.pauses,
        "lock_holds": chaos.lock_holds,
        "connection_storms": chaos.storms,
        "connections_terminated": chaos.terminated,
        "database_restarts": chaos.restarts,
        "releases": report.releases,
        "free_reruns": report.free_reruns,
        "jobs_released": report.jobs_released,
        "max_attempts_1_jobs_run_twice_after_a_release": report.max1_rerun_after_release,
        "submits_unreachable": seen.unreachable.load(Ordering::Relaxed),
        "submits_refused_busy_or_full": seen.refused.load(Ordering::Relaxed),
        "submits_settled_by_lookup": seen.ambiguous.load(Ordering::Relaxed),
        "cancels_asked": cancel_asked.len(),
        "endings": report.endings,
        "starts": report.starts,
        "jobs_with_lost_leases": report.jobs_with_lost_leases,
        "reruns": report.reruns,
        "lost": report.lost,
        "duplicate_starts": report.duplicate_starts,
        "submitting_seconds": submitted_at_ms.load(Ordering::SeqCst) as f64 / 1000.0,
        "chaos_seconds": chaos_over.as_secs_f64(),
        "total_seconds": drained.as_secs_f64(),
    });

    let mut problems = report.violations;
    problems.extend(chaos.crashes.iter().cloned());
    // Printed before the summary: a long log may be cut at its end.
    for problem in problems.iter().take(20) {
        eprintln!("chaos problem: {problem}");
    }
    eprintln!("chaos: {}", serde_json::to_string_pretty(&summary).unwrap());
    assert!(
        problems.is_empty(),
        "{} problems (seed {}), first ones:\n{}",
        problems.len(),
        plan.seed,
        problems.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    assert_eq!(chaos.kills, plan.kills);
    assert_eq!(chaos.terms, plan.terms);
    assert_eq!(chaos.pauses, plan.pauses);
    assert_eq!(chaos.lock_holds, plan.lock_holds);
    assert_eq!((chaos.storms, chaos.restarts), (plan.storms, plan.restarts));
    if plan.storms > 0 {
        assert!(chaos.terminated > 0, "the storms terminated no connection");
    }
    if plan.lock_holds > 0 {
        assert!(seen.refused.load(Ordering::Relaxed) > 0, "the held lock never reached a submit as a 503");
    }
    assert!(
        report.jobs_with_lost_leases > 0,
        "no kill landed on a running job: the run proved nothing about lost leases"
    );
}

/// Hold the database's write lock from outside for `hold` (past the
/// store's 5 s busy timeout): the processes' writes fail as busy.
fn hold_write_lock(db: &Path, hold: Duration) {
    let conn = rusqlite::Connection::open(db).expect("open the database");
    conn.busy_timeout(Duration::from_secs(30)).expect("busy timeout");
    conn.execute_batch("BEGIN IMMEDIATE").expect("take the write lock");
    std::thread::sleep(hold);
    conn.execute_batch("COMMIT").expect("release the write lock");
}

/// A process that ended without being killed is a crash: recorded and
/// restarted so the run goes on and the report shows all of them.
fn check_alive(procs: &mut [Proc], chaos: &mut Chaos) {
    for p in procs {
        if let Some(status) = p.exited_on_its_own() {
            chaos.crashes.push(format!("{} exited on its own: {status}; stderr ends:\n{}", p.name, p.stderr_tail(5)));
            p.spawn();
        }
    }
}

pub(crate) async fn all_jobs(store: &dyn JobStore) -> HashMap<JobId, Job> {
    let mut jobs = HashMap::new();
    let mut before = None;
    loop {
        let page =
            store.job_list(JobListParams { before, limit: 1_000, ..JobListParams::default() }).await.expect("list");
        let Some(last) = page.last() else { return jobs };
        before = Some(last.id);
        jobs.extend(page.into_iter().map(|j| (j.id, j)));
    }
}

/// `(job, attempt)` per start, in log order; a line that does not parse
/// is kept as a violation.
pub(crate) fn read_start_log(path: &Path) -> Result<Vec<(JobId, u32)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("start log: {e}"))?;
    text.lines()
        .map(|line| {
            let mut fields = line.split(' ');
            let id = fields.next().and_then(|f| f.parse().ok());
            let attempt = fields.next().and_then(|f| f.parse().ok());
            let pid = fields.next().and_then(|f| f.parse::<u32>().ok());
            match (id, attempt, pid, fields.next()) {
                (Some(id), Some(attempt), Some(_), None) => Ok((id, attempt)),
                _ => Err(format!("start log line does not parse: {line:?}")),
            }
        })
        .collect()
}

#[derive(Debug, Default)]
struct Report {
    endings: BTreeMap<String, u64>,
    starts: u64,
    jobs_with_lost_leases: u64,
    reruns: u64,
    lost: u64,
    duplicate_starts: u64,
    /// Shutdown releases, summed over the jobs.
    releases: u64,
    /// Lost leases re-run without spending an attempt, summed.
    free_reruns: u64,
    /// Jobs released at least once.
    jobs_released: u64,
    /// `max_attempts = 1` jobs that started twice because of a release:
    /// the documented cost of a clean shutdown.
    max1_rerun_after_release: u64,
    violations: Vec<String>,
}

fn ending(job: &Job) -> String {
    match job.error_kind {
        Some(kind) => format!("{}/{kind}", job.status),
        None => job.status.to_string(),
    }
}

fn check(
    submitted: &[Submitted],
    jobs: &HashMap<JobId, Job>,
    starts: &Result<Vec<(JobId, u32)>, String>,
    cancel_asked: &HashSet<JobId>,
) -> Report {
    let mut report = Report::default();
    let starts = match starts {
        Ok(starts) => starts.as_slice(),
        Err(e) => {
            report.violations.push(e.clone());
            &[]
        }
    };
    report.starts = starts.len() as u64;
    let mut starts_by_job: HashMap<JobId, Vec<u32>> = HashMap::new();
    for (id, attempt) in starts {
        starts_by_job.entry(*id).or_default().push(*attempt);
    }

    let ids: HashSet<JobId> = submitted.iter().map(|s| s.id).collect();
    if ids.len() != submitted.len() {
        report.violations.push("two submissions share a job id".into());
    }
    for id in jobs.keys().filter(|id| !ids.contains(id)) {
        report.violations.push(format!("{id}: in the store but never submitted (a duplicate submit?)"));
    }
    for id in starts_by_job.keys().filter(|id| !ids.contains(id)) {
        report.violations.push(format!("{id}: started but never submitted"));
    }

    for s in submitted {
        let Some(job) = jobs.get(&s.id) else {
            report.lost += 1;
            report.violations.push(format!("{}: submitted as {} but not in the store", s.id, s.name));
            continue;
        };
        let ending = ending(job);
        *report.endings.entry(format!("{:?} {ending}", s.kind)).or_default() += 1;
        let mut bad = |why: String| report.violations.push(format!("{} ({:?}, {ending}): {why}", s.id, s.kind));
        if !job.status.is_terminal() {
            bad("not terminal".into());
        }
        if job.max_attempts != s.max_attempts {
            bad(format!("max_attempts {} but {} was asked", job.max_attempts, s.max_attempts));
        }
        // Releases and free re-runs start the job again without spending
        // an attempt.
        if job.attempt > job.max_attempts + job.releases + job.free_reruns {
            bad(format!(
                "attempt {} over the maximum, {} releases and {} free re-runs",
                job.attempt, job.releases, job.free_reruns
            ));
        }
        if job.free_reruns > job.free_rerun_limit {
            bad(format!("{} free re-runs, over the limit of {}", job.free_reruns, job.free_rerun_limit));
        }

        let job_starts = starts_by_job.get(&s.id).map(Vec::as_slice).unwrap_or_default();
        let distinct: HashSet<u32> = job_starts.iter().copied().collect();
        if distinct.len() != job_starts.len() {
            report.duplicate_starts += (job_starts.len() - distinct.len()) as u64;
            bad(format!("one attempt started twice: {job_starts:?}"));
        }
        let free = job.releases + job.free_reruns;
        if s.max_attempts == 1 && job_starts.len() > 1 + free as usize {
            report.duplicate_starts += job_starts.len() as u64 - 1 - u64::from(free);
            bad(format!(
                "max_attempts 1 but started {} times with {} releases and {} free re-runs",
                job_starts.len(),
                job.releases,
                job.free_reruns
            ));
        } else if s.max_attempts == 1 && job_starts.len() > 1 && job.releases > 0 {
            report.max1_rerun_after_release += 1;
        }
        report.releases += u64::from(job.releases);
        report.free_reruns += u64::from(job.free_reruns);
        if job.releases > 0 {
            report.jobs_released += 1;
        }
        if job_starts.iter().any(|a| *a > job.attempt || *a == 0) {
            bad(format!("started as attempts {job_starts:?} but the store counts {}", job.attempt));
        }
        let reruns = job_starts.len().saturating_sub(1) as u32;
        if reruns > job.lost_leases + job.free_reruns + job.releases + job.retries {
            bad(format!(
                "{reruns} re-runs but {} lost leases, {} free re-runs, {} releases, {} retries",
                job.lost_leases, job.free_reruns, job.releases, job.retries
            ));
        }
        report.reruns += u64::from(reruns);
        if job.lost_leases + job.free_reruns > 0 {
            report.jobs_with_lost_leases += 1;
        }

        // Endings each plugin can have. A guest's own ending needs a start.
        let guest_ended = match (job.status, job.error_kind) {
            (JobStatus::Failed, Some(ErrorKind::LeaseLost)) => false,
            // Two processes killed under it: quarantined, as a crash would.
            (JobStatus::Failed, Some(ErrorKind::HostCrash)) => {
                if job.process_deaths < leash::store::QUARANTINE_AFTER_DEATHS {
                    bad(format!("host_crash after {} process deaths", job.process_deaths));
                }
                false
            }
            (JobStatus::Succeeded, None) => true,
            (JobStatus::Failed, Some(ErrorKind::GuestError)) if s.kind == Kind::Failing => true,
            (JobStatus::Cancelled, _) if s.kind == Kind::Coop && cancel_asked.contains(&s.id) => false,
            _ => {
                bad(format!("an ending this plugin cannot have: {:?}", job.error_message));
                false
            }
        };
        if s.kind == Kind::Failing && job.status == JobStatus::Succeeded {
            bad("the failing plugin succeeded".into());
        }
        if guest_ended && job_starts.is_empty() {
            bad("ended by its guest but no start was logged".into());
        }
    }
    report
}

/// Stop every process with SIGTERM at the end of a run; each that does not
/// exit 0, and every panic any process printed, is a violation.
pub(crate) fn stop_all(procs: &mut [Proc]) -> Vec<String> {
    let mut problems = Vec::new();
    for p in procs.iter_mut() {
        // One restarted just before the end may not handle signals yet: a
        // SIGTERM then would kill it rather than stop it.
        p.wait_ready(Instant::now() + STARTUP_PATIENCE);
        p.signal("-TERM");
        let status = p.child.take().expect("running").wait().expect("wait");
        if !status.success() {
            problems.push(format!("{} exited {status} at the end", p.name));
        }
    }
    problems.extend(panics(procs));
    problems
}

/// Panics printed by any process: each is a violation.
pub(crate) fn panics(procs: &[Proc]) -> Vec<String> {
    let mut panics = Vec::new();
    for p in procs {
        let text = std::fs::read_to_string(&p.stderr).unwrap_or_default();
        panics.extend(text.lines().filter(|l| l.contains("panicked")).map(|l| format!("{}: {l}", p.name)));
    }
    panics
}
