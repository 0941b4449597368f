//! The commands. `run` runs one component with no store; `worker` and
//! `serve` run a pool until a signal. The operator commands — `submit`,
//! `jobs`, `plugins`, `plan` and `diagnostics` — each speak the HTTP API, to a
//! server (`--server`) or to an in-process router on a local database, so
//! both behave alike. `new` writes a plugin project and touches nothing
//! else.

mod connect;
mod diagnostics;
mod jobs;
mod new;
mod plan;
mod plugins;
mod run;
mod serve;
mod submit;
mod supervise;
mod watch;
mod worker;

pub(super) use diagnostics::diagnostics;
pub(super) use jobs::jobs;
pub(super) use new::{NewArgs, new_plugin};
pub(super) use plan::plan;
pub(super) use plugins::plugins;
pub(super) use run::run_once;
pub(super) use serve::serve;
pub(super) use submit::submit;
pub(super) use supervise::run_pool_process;
pub(super) use worker::{WorkerCommandArgs, run_worker};

use std::path::PathBuf;
use std::time::Duration;

use axum::http::StatusCode;
use clap::{Args, Subcommand};

use super::{CliError, ExitStatus, JobArgs, StoreArgs, WorkerArgs, parse_duration, parse_size};
use crate::api::requests::DecisionRequest;
use crate::client::ClientError;

/// Where a command sends its requests.
#[derive(Debug, Args)]
pub(super) struct ConnArgs {
    /// A `leash serve` to talk to, e.g. http://127.0.0.1:7070. Without it,
    /// commands work on the local database (`--db`). The token comes from
    /// LEASH_API_TOKEN or `--token-file`.
    #[arg(long, env = "LEASH_SERVER", value_name = "URL")]
    server: Option<String>,
    /// The server's token file (default: `<db>.token`, as `leash serve`
    /// writes it).
    #[arg(long, env = "LEASH_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    #[command(flatten)]
    store: StoreArgs,
    /// Print JSON instead of tables and text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(super) struct ServeArgs {
    #[command(flatten)]
    worker: WorkerArgs,
    /// Address to listen on. Loopback unless told otherwise.
    #[arg(long, env = "LEASH_LISTEN", default_value = "127.0.0.1:7070")]
    listen: String,
    /// Where the API token is kept (created, mode 0600, on first start)
    /// when LEASH_API_TOKEN is not set. Default: `<db>.token`.
    #[arg(long, env = "LEASH_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The sync ceiling: the longest timeout an `"execution": "sync"`
    /// request may ask for (refused with 400 `sync_ceiling` above it), and
    /// the timeout of one that sets none when below `--job-timeout`. A sync
    /// job's timeout covers its queue wait and its run.
    #[arg(long, env = "LEASH_SYNC_TIMEOUT", value_parser = parse_duration, default_value = "60s")]
    sync_timeout: Duration,
    /// Largest request body (plugin uploads included); 413 above it.
    #[arg(long, env = "LEASH_MAX_BODY", value_parser = parse_size, default_value = "32MiB")]
    max_body: u64,
    /// Time a connection has to send a request's headers; an idle
    /// keep-alive connection is closed after the same time.
    #[arg(long, env = "LEASH_HEADER_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    header_timeout: Duration,
    /// Time an answer (or an event stream) may wait for its client to read
    /// before the connection is closed: a client that stops reading is
    /// dropped.
    #[arg(long, env = "LEASH_WRITE_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    write_timeout: Duration,
    /// Connections open at once; more are answered 503 and closed.
    #[arg(long, env = "LEASH_MAX_CONNECTIONS", default_value_t = crate::api::listen::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Where jobs run: `supervised` (a child process this server starts
    /// again when it dies, so a crash in a guest's run never takes the API
    /// down) or `in-process` (one process, as when embedding).
    #[arg(long, env = "LEASH_POOL", default_value = "supervised", value_parser = ["supervised", "in-process"])]
    pool: String,
}

#[derive(Debug, Args)]
pub(super) struct SubmitArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// A component file (.wasm), or a registered plugin: `name`,
    /// `name@version` or a digest.
    #[arg(required_unless_present = "batch")]
    plugin: Option<String>,
    /// Queue many jobs from a file of JSON lines (`-` for stdin), one job
    /// per line as `POST /v1/jobs` takes it, e.g.
    /// `{"plugin":"hello@1.0.0","input":{"name":"a"}}`. Sent 1,000 lines
    /// to a request, each request all or nothing; prints one job id per
    /// line. The job's own flags do not apply: put them in the lines
    /// (`--queue-ttl` is the default of lines without `queue_ttl_ms`).
    #[arg(long, value_name = "FILE|-", conflicts_with_all = BATCH_CONFLICTS)]
    batch: Option<String>,
    #[command(flatten)]
    job: JobArgs,
    /// Wall-clock limit per attempt (default: the server's `--job-timeout`,
    /// 3600 s).
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Fuel budget per attempt.
    #[arg(long)]
    fuel: Option<u64>,
    /// Memory limit per attempt, e.g. `64MiB`.
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Attempts the job may use: a lost lease or a `retryable` failure with
    /// attempts left runs it again after its backoff (default: the
    /// server's `--max-attempts`, 1).
    #[arg(long)]
    max_attempts: Option<u32>,
    /// The pause before the first retry, doubling after each failure, with
    /// jitter (default: the server's `--retry-backoff`, 1 s).
    #[arg(long, value_parser = parse_duration)]
    retry_backoff: Option<Duration>,
    /// The longest pause before a retry (default: the server's, 300 s).
    #[arg(long, value_parser = parse_duration)]
    retry_backoff_cap: Option<Duration>,
    /// Do not start the job before this time (RFC 3339 UTC, e.g.
    /// 2026-12-01T09:00:00Z); its queue TTL counts from then.
    #[arg(long, value_name = "TIME", conflicts_with = "delay")]
    run_after: Option<String>,
    /// Do not start the job before this long from now, e.g. `10m`.
    #[arg(long, value_parser = parse_duration)]
    delay: Option<Duration>,
    /// How long the job may wait in the queue before it fails as `expired`.
    #[arg(long, env = "LEASH_QUEUE_TTL", value_parser = parse_duration)]
    queue_ttl: Option<Duration>,
    /// At most one running job per key.
    #[arg(long)]
    concurrency_key: Option<String>,
    /// A plan id to group jobs by.
    #[arg(long)]
    plan: Option<String>,
    /// `approval`: the job waits for `leash jobs approve` before it runs.
    /// `none` is refused where the plugin's approval policy gates the
    /// target. Default: the policy decides.
    #[arg(long, value_parser = ["approval", "none"])]
    gate: Option<String>,
    /// With `--gate approval`: leave the approved job waiting for
    /// `leash jobs run` instead of queueing it at once.
    #[arg(long, requires = "gate")]
    hold_after_approval: bool,
    /// Wait for the job to end (up to this long), showing its progress, and
    /// print its output. Ctrl-C asks whether to cancel it or stop waiting.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    wait: Option<Duration>,
    /// Local database only: also run a worker pool in this process while
    /// waiting (no separate `leash worker` needed). It may run other queued
    /// jobs too, and releases them when the wait ends.
    #[arg(long, requires = "wait", conflicts_with = "server")]
    work: bool,
}

/// The flags of `leash submit` that describe one job, which `--batch`
/// lines carry themselves.
const BATCH_CONFLICTS: [&str; 17] = [
    "plugin",
    "action",
    "input",
    "timeout",
    "fuel",
    "memory",
    "max_attempts",
    "retry_backoff",
    "retry_backoff_cap",
    "run_after",
    "delay",
    "concurrency_key",
    "plan",
    "gate",
    "hold_after_approval",
    "wait",
    "work",
];

#[derive(Debug, Subcommand)]
pub(super) enum JobsCommand {
    /// List jobs, newest first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// Only jobs in this state (pending_approval, approved, queued, running,
        /// succeeded, failed, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// Only jobs of this plugin: name, name@version or digest.
        #[arg(long)]
        plugin: Option<String>,
        /// Only jobs of this plan.
        #[arg(long)]
        plan: Option<String>,
        /// Only jobs with this concurrency key.
        #[arg(long)]
        concurrency_key: Option<String>,
        /// Jobs per page (1-500).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Jobs older than this id (the previous page's last).
        #[arg(long, value_name = "JOB_ID")]
        before: Option<String>,
    },
    /// Show one job.
    Show {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
    },
    /// Cancel a job: queued jobs at once, running jobs by asking their worker.
    Cancel {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
    },
    /// Print a job's effect ledger: every effectful request (by default any
    /// method but GET and HEAD) its attempts made, and how each ended.
    Effects {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
    },
    /// Print what a finished job logged (records, stdout, stderr).
    Logs {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
    },
    /// Approve a job waiting for approval: it is queued (or, submitted
    /// with `--hold-after-approval`, waits for `leash jobs run`).
    Approve {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Reject a job waiting for approval: it is cancelled (kind
    /// `rejected`) and never runs.
    Reject {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Trigger the run of an approved job that waits for it.
    Run {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
    },
    /// Print job and worker events as they happen (every process sharing
    /// the database), one line each; with `--json`, each event's JSON.
    /// Runs until interrupted, or with `--job` until that job ends.
    Watch(watch::WatchArgs),
    /// Wait for a job to end, showing its progress, and print its output.
    Wait {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
        /// Longest wait.
        #[arg(long, value_parser = parse_duration, default_value = "1h")]
        timeout: Duration,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum PlanCommand {
    /// Create a plan: its execute phase runs at once; when it succeeds, its
    /// apply phase gets the execute output (and the plan's input) and waits
    /// for approval (or, with `--apply auto`, runs at once).
    Submit {
        #[command(flatten)]
        conn: ConnArgs,
        /// A registered plugin: `name`, `name@version` or a digest.
        plugin: String,
        /// The plan's input: a file, or `-` for stdin (default: none).
        #[arg(long)]
        input: Option<String>,
        /// `approval`: apply waits for `leash plan approve`; `auto`: it runs
        /// once execute succeeds.
        #[arg(long, default_value = "approval", value_parser = ["approval", "auto"])]
        apply: String,
        /// Wait (up to this long) until the plan needs a decision or ends,
        /// showing its phase, then print what execute produced: the change
        /// to approve. On a local database a worker must be running.
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        wait: Option<Duration>,
    },
    /// Show a plan: its status, both phases and their outputs.
    Show {
        #[command(flatten)]
        conn: ConnArgs,
        /// The plan id.
        id: String,
    },
    /// List plans, newest first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// Plans per page (1-500).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Plans older than this id (the previous page's last).
        #[arg(long, value_name = "PLAN_ID")]
        before: Option<String>,
    },
    /// Approve the phase of a plan that waits for approval.
    Approve {
        #[command(flatten)]
        conn: ConnArgs,
        /// The plan id.
        id: String,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Reject the phase of a plan that waits for approval: apply never runs.
    Reject {
        #[command(flatten)]
        conn: ConnArgs,
        /// The plan id.
        id: String,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Cancel a plan: the phase that waits or runs is cancelled.
    Cancel {
        #[command(flatten)]
        conn: ConnArgs,
        /// The plan id.
        id: String,
    },
}

/// Who decides on a gated job, and why.
#[derive(Debug, Args)]
pub(super) struct DecisionArgs {
    /// Who decides, recorded with the decision (default: $USER).
    #[arg(long)]
    by: Option<String>,
    /// Why, recorded with the decision.
    #[arg(long)]
    comment: Option<String>,
}

impl DecisionArgs {
    /// The body of an approve or reject request.
    pub(super) fn body(&self) -> DecisionRequest {
        let by = self
            .by
            .clone()
            .or_else(|| std::env::var("USER").ok().filter(|u| !u.trim().is_empty()))
            .unwrap_or_else(|| "operator".to_owned());
        DecisionRequest { by, comment: self.comment.clone() }
    }
}

#[derive(Debug, Subcommand)]
pub(super) enum PluginsCommand {
    /// Validate, precompile and register a component.
    Add {
        #[command(flatten)]
        conn: ConnArgs,
        /// The component file (.wasm).
        file: PathBuf,
        /// Registry name (default: the file name without `.wasm`).
        #[arg(long)]
        name: Option<String>,
        /// Version (default 0.0.0). Adding a name@version again replaces it
        /// and keeps its grants; jobs already queued keep the bytes they were
        /// given.
        #[arg(long)]
        version: Option<String>,
        /// Grant jobs of this name@version what the flags say (replacing
        /// what it had). Without any grant flag, grants are left as they
        /// are (none, for a new name@version).
        #[command(flatten)]
        grants: super::GrantArgs,
        /// Jobs of this target wait for approval: `*`, `execute`, `apply`,
        /// `action:*` or `action:NAME` (repeat for more), set with the name
        /// in one step. Without it, a replaced name@version keeps its
        /// policy.
        #[arg(long, value_name = "TARGET")]
        require_approval: Vec<String>,
    },
    /// Replace which targets of a registered name@version wait for
    /// approval. Jobs submitted afterwards follow it; a submit can add a
    /// gate but never remove one the policy sets.
    Approval {
        #[command(flatten)]
        conn: ConnArgs,
        /// The registration: name@version.
        reference: String,
        /// A gated target: `*`, `execute`, `apply`, `action:*` or
        /// `action:NAME` (repeat for more; none gates nothing).
        #[arg(long, value_name = "TARGET")]
        require: Vec<String>,
    },
    /// Replace what jobs of a registered name@version may use outside
    /// their sandbox. Jobs submitted afterwards get the new grants; jobs
    /// already submitted keep theirs. With no `--allow-host`, every
    /// request of later jobs is denied.
    Grant {
        #[command(flatten)]
        conn: ConnArgs,
        /// The registration: name@version.
        reference: String,
        #[command(flatten)]
        grants: super::GrantArgs,
    },
    /// List registered plugins.
    List {
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Show one plugin: name, name@version or digest.
    Show {
        #[command(flatten)]
        conn: ConnArgs,
        /// The reference.
        reference: String,
    },
}

#[derive(Debug, Args)]
pub(super) struct DiagnosticsArgs {
    #[command(flatten)]
    conn: ConnArgs,
}

impl From<ClientError> for CliError {
    fn from(e: ClientError) -> Self {
        let status = match &e {
            ClientError::Api { status, .. } => match *status {
                StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::PAYLOAD_TOO_LARGE => ExitStatus::Usage,
                StatusCode::UNAUTHORIZED
                | StatusCode::FORBIDDEN
                | StatusCode::CONFLICT
                | StatusCode::TOO_MANY_REQUESTS => ExitStatus::Refused,
                _ => ExitStatus::Internal,
            },
            ClientError::Unreachable { .. } => ExitStatus::Unreachable,
            ClientError::Protocol(_) => ExitStatus::Internal,
        };
        CliError { message: e.to_string(), status }
    }
}
