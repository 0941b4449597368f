//! The operator commands: `serve`, `submit`, `jobs`, `plugins` and
//! `diagnostics`. Each speaks the HTTP API, to a server (`--server`) or to
//! an in-process router on a local database, so both behave alike.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use base64::Engine as _;
use clap::{Args, Subcommand};
use comfy_table::{Table, presets};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use super::{CliError, ExitStatus, JobArgs, StoreArgs, WorkerArgs, parse_duration, parse_size, read_input};
use crate::api::listen::ListenLimits;
use crate::api::{ApiConfig, router};
use crate::client::{Client, ClientError, ensure_token_file, read_token_file};
use crate::job::{ErrorKind, JobStatus};
use crate::runtime::Runtime;
use crate::sandbox::{Allocator, SandboxConfig};

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
    /// Connections open at once; more are answered 503 and closed.
    #[arg(long, env = "LEASH_MAX_CONNECTIONS", default_value_t = crate::api::listen::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
}

#[derive(Debug, Args)]
pub(super) struct SubmitArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// A component file (.wasm), or a registered plugin: `name`,
    /// `name@version` or a digest.
    plugin: String,
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

#[derive(Debug, Subcommand)]
pub(super) enum JobsCommand {
    /// List jobs, newest first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// Only jobs in this state (queued, running, succeeded, failed, cancelled).
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
    /// Print what a finished job logged (records, stdout, stderr).
    Logs {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
    },
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
        /// Version (default 0.0.0). Adding a name@version again replaces it;
        /// jobs already queued keep the bytes they were given.
        #[arg(long)]
        version: Option<String>,
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
                StatusCode::UNAUTHORIZED | StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS => ExitStatus::Refused,
                _ => ExitStatus::Internal,
            },
            ClientError::Unreachable { .. } => ExitStatus::Unreachable,
            ClientError::Protocol(_) => ExitStatus::Internal,
        };
        CliError { message: e.to_string(), status }
    }
}

// ---- serve ----

pub(super) async fn serve(args: ServeArgs) -> Result<ExitStatus, CliError> {
    super::init_logging(&args.worker.log_format)?;
    let token_file = args.token_file.clone().unwrap_or_else(|| args.worker.store.database().default_token_file());
    let token = match std::env::var("LEASH_API_TOKEN") {
        Ok(token) if !token.trim().is_empty() => token.trim().to_owned(),
        _ => {
            let (token, created) = ensure_token_file(&token_file).map_err(CliError::usage)?;
            if created {
                tracing::info!("wrote a new API token to {}", token_file.display());
            }
            token
        }
    };
    raise_open_files_limit();
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| CliError::usage(format!("cannot listen on {}: {e}", args.listen)))?;
    let address = listener.local_addr().map_err(|e| CliError::internal(e.to_string()))?;
    let runtime = super::worker_runtime(&args.worker).await?;
    let config = ApiConfig {
        token,
        sync_ceiling: args.sync_timeout,
        max_body_bytes: usize::try_from(args.max_body).unwrap_or(usize::MAX),
    };
    let app = router(runtime.clone(), config);
    let mut interrupt = super::interrupt_signal()?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::internal(format!("cannot listen for SIGTERM: {e}")))?;
    tracing::info!(
        worker_id = runtime.worker_id(),
        "{} serving http://{address} with {} slots on {}",
        runtime.worker_id(),
        args.worker.max_workers,
        args.worker.store.database()
    );
    // On a signal: stop accepting connections, shut the runtime down within
    // its budget, and drop requests still open (a sync wait must not hold
    // the process past the budget).
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let limits = ListenLimits { header_timeout: args.header_timeout, max_connections: args.max_connections };
    let server = tokio::spawn(crate::api::listen::serve(listener, app, limits, async move {
        let _ = stop_rx.await;
    }));
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    let _ = stop_tx.send(());
    tracing::info!(budget = ?args.worker.shutdown_budget, "shutting down");
    runtime.shutdown().await;
    server.abort();
    tracing::info!("stopped");
    Ok(ExitStatus::Success)
}

/// Raise the soft open-files limit to the hard one: each connection is a
/// descriptor, and the common soft default of 1024 is below the
/// connection cap. Best effort: a limit that cannot be raised stays.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write `limit`, a live
    // local of the type they expect.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

// ---- connecting ----

/// The server-side job defaults for a command that queues on the local
/// database itself: the variables `leash worker` and `leash serve` read
/// (`LEASH_JOB_TIMEOUT`, `LEASH_MAX_TIMEOUT`, `LEASH_MAX_ATTEMPTS`,
/// `LEASH_RETRY_BACKOFF`, `LEASH_RETRY_BACKOFF_CAP`), so a job queued
/// either way gets the same defaults.
fn local_job_defaults(mut builder: crate::runtime::RuntimeBuilder) -> Result<crate::runtime::RuntimeBuilder, CliError> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let duration = |name: &str| {
        var(name).map(|v| parse_duration(&v).map_err(|e| CliError::usage(format!("{name}: {e}")))).transpose()
    };
    if let Some(d) = duration("LEASH_JOB_TIMEOUT")? {
        builder = builder.default_timeout(d);
    }
    if let Some(d) = duration("LEASH_MAX_TIMEOUT")? {
        builder = builder.max_timeout(d);
    }
    if let Some(n) = var("LEASH_MAX_ATTEMPTS") {
        let n: u32 =
            n.trim().parse().ok().filter(|n| (1..=crate::job::MAX_ATTEMPTS_CEILING).contains(n)).ok_or_else(|| {
                CliError::usage(format!(
                    "LEASH_MAX_ATTEMPTS: {n:?} is not a number from 1 to {}",
                    crate::job::MAX_ATTEMPTS_CEILING
                ))
            })?;
        builder = builder.default_max_attempts(n);
    }
    let default = crate::job::Backoff::default();
    let base = duration("LEASH_RETRY_BACKOFF")?.map_or(default.base_ms, |d| d.as_millis() as u64);
    let cap = duration("LEASH_RETRY_BACKOFF_CAP")?.map_or(default.cap_ms, |d| d.as_millis() as u64);
    Ok(builder.default_backoff(crate::job::Backoff { base_ms: base, cap_ms: cap }))
}

async fn connect(conn: &ConnArgs, work: bool) -> Result<Client, CliError> {
    if let Some(server) = &conn.server {
        let token = match std::env::var("LEASH_API_TOKEN") {
            Ok(token) if !token.trim().is_empty() => token.trim().to_owned(),
            _ => {
                let file = conn.token_file.clone().unwrap_or_else(|| conn.store.database().default_token_file());
                read_token_file(&file).map_err(|e| {
                    CliError::usage(format!("no API token: set LEASH_API_TOKEN or pass --token-file ({e})"))
                })?
            }
        };
        return Ok(Client::remote(server, token)?);
    }
    let mut builder = Runtime::builder(conn.store.database()).durability(super::durability(&conn.store)?);
    builder = local_job_defaults(builder)?;
    builder = if work {
        builder.sandbox(SandboxConfig {
            allocator: Allocator::Pooling { slots: crate::runtime::DEFAULT_MAX_WORKERS as u32 },
            cache_dir: super::default_cache_dir(),
            ..SandboxConfig::default()
        })
    } else {
        builder.without_workers()
    };
    let runtime = builder.build().await.map_err(|e| match e {
        crate::runtime::RuntimeError::InvalidJob(message) => {
            CliError::usage(format!("LEASH_RETRY_BACKOFF/LEASH_RETRY_BACKOFF_CAP: {message}"))
        }
        other => CliError::internal(other.to_string()),
    })?;
    Ok(Client::local(runtime))
}

/// Run `f` on a connection and close it (shutting down a local runtime)
/// whatever `f` returns.
async fn with_client(
    conn: &ConnArgs,
    work: bool,
    f: impl AsyncFnOnce(&Client) -> Result<ExitStatus, CliError>,
) -> Result<ExitStatus, CliError> {
    let client = connect(conn, work).await?;
    let result = f(&client).await;
    client.close().await;
    result
}

fn print_json(value: &Value) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)
        .map_err(|e| CliError::internal(e.to_string()))
        .and_then(|()| writeln!(stdout).map_err(|e| CliError::internal(e.to_string())))
}

fn print_table(table: Table) {
    let _ = writeln!(std::io::stdout(), "{table}");
}

fn new_table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(presets::NOTHING).set_header(header.iter().copied());
    table
}

/// A JSON value as one line for a table cell or a message. Strings may
/// come from a guest, so they are made safe for a terminal; other values
/// print as JSON, which escapes control characters already.
fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => super::terminal_text(s),
        other => other.to_string(),
    }
}

// ---- submit and wait ----

pub(super) async fn submit(args: SubmitArgs) -> Result<ExitStatus, CliError> {
    let target = args.job.target()?;
    let input = read_input(args.job.input.as_deref())?;
    let file = Path::new(&args.plugin);
    let bytes = if file.is_file() || args.plugin.ends_with(".wasm") {
        Some(std::fs::read(file).map_err(|e| CliError::usage(format!("cannot read {}: {e}", file.display())))?)
    } else {
        None
    };
    let json_out = args.conn.json;
    let wait = args.wait;
    with_client(&args.conn, args.work, async move |client| {
        let plugin = match bytes {
            Some(bytes) => {
                let info = client.upload("/v1/plugins", bytes).await?;
                text(&info["digest"])
            }
            None => args.plugin.clone(),
        };
        let mut body = json!({
            "plugin": plugin,
            "input_base64": base64::engine::general_purpose::STANDARD.encode(&input),
            "execution": "async",
        });
        match &target {
            crate::job::Target::Action(name) => body["action"] = json!(name),
            other => body["phase"] = json!(other.to_string()),
        }
        let optional = [
            ("timeout_ms", args.timeout.map(|d| json!(d.as_millis() as u64))),
            ("fuel", args.fuel.map(|f| json!(f))),
            ("memory_bytes", args.memory.map(|m| json!(m))),
            ("max_attempts", args.max_attempts.map(|n| json!(n))),
            ("queue_ttl_ms", args.queue_ttl.map(|d| json!(d.as_millis() as u64))),
            ("concurrency_key", args.concurrency_key.clone().map(|k| json!(k))),
            ("plan_id", args.plan.clone().map(|p| json!(p))),
            ("backoff_ms", args.retry_backoff.map(|d| json!(d.as_millis() as u64))),
            ("backoff_cap_ms", args.retry_backoff_cap.map(|d| json!(d.as_millis() as u64))),
            ("run_at", args.run_after.clone().map(|t| json!(t))),
            ("delay_ms", args.delay.map(|d| json!(d.as_millis() as u64))),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                body[key] = value;
            }
        }
        let accepted = client.create("/v1/jobs", body).await?;
        let id = text(&accepted["job_id"]);
        let Some(wait) = wait else {
            if json_out {
                print_json(&json!({ "job_id": id, "status": "queued" }))?;
            } else {
                let _ = writeln!(std::io::stdout(), "{id}");
            }
            return Ok(ExitStatus::Success);
        };
        wait_for(client, &id, wait, json_out).await
    })
    .await
}

/// What a Ctrl-C during a wait decided.
enum Interrupted {
    CancelJob,
    StopWaiting,
}

/// Ask on the terminal; without one, stop waiting and leave the job alone.
async fn ask_on_interrupt(id: &str) -> Interrupted {
    if !std::io::stdin().is_terminal() {
        return Interrupted::StopWaiting;
    }
    let prompt = format!("\nleash: cancel job {id}? [y = cancel it, anything else = stop waiting] ");
    let answer = tokio::task::spawn_blocking(move || {
        let _ = write!(std::io::stderr(), "{prompt}");
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        line
    })
    .await
    .unwrap_or_default();
    if answer.trim().eq_ignore_ascii_case("y") { Interrupted::CancelJob } else { Interrupted::StopWaiting }
}

fn progress_bar(json_out: bool) -> ProgressBar {
    if json_out || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Poll a job until it ends, feeding a progress bar from the guest's
/// progress reports; then print its output (or error) and return the exit
/// status its outcome earns.
async fn wait_for(client: &Client, id: &str, wait: Duration, json_out: bool) -> Result<ExitStatus, CliError> {
    let poll = if client.runtime().is_some() { Duration::from_millis(50) } else { Duration::from_millis(200) };
    let bar = progress_bar(json_out);
    let deadline = tokio::time::Instant::now() + wait;
    let mut interrupt = super::interrupt_signal()?;
    let path = format!("/v1/jobs/{id}");
    let job = loop {
        let job = client.json(Method::GET, &path, None).await?;
        let status = text(&job["status"]);
        if status.parse::<JobStatus>().is_ok_and(JobStatus::is_terminal) {
            break job;
        }
        let progress = &job["progress"];
        if let (Some(done), Some(total)) = (progress["done"].as_u64(), progress["total"].as_u64()) {
            if total > 0 {
                bar.set_length(total);
            }
            bar.set_position(done);
            bar.set_message(text(&progress["note"]));
        } else {
            bar.set_message(status);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                bar.finish_and_clear();
                say!("leash: job {id} is still running after {wait:?}; `leash jobs wait {id}` waits again");
                return Ok(ExitStatus::Timeout);
            }
            _ = tokio::time::sleep(poll) => {}
            _ = interrupt.recv() => {
                bar.suspend(|| ());
                match ask_on_interrupt(id).await {
                    Interrupted::CancelJob => {
                        let answer = client.json(Method::POST, &format!("{path}/cancel"), None).await?;
                        say!("leash: {}", text(&answer["status"]).replace('_', " "));
                    }
                    Interrupted::StopWaiting => {
                        bar.finish_and_clear();
                        say!("leash: stopped waiting; job {id} goes on (`leash jobs cancel {id}` cancels it)");
                        return Ok(ExitStatus::Timeout);
                    }
                }
            }
        }
    };
    bar.finish_and_clear();
    let error_kind: Option<ErrorKind> = job["error_kind"].as_str().and_then(|k| k.parse().ok());
    let output = if job["status"] == "succeeded" {
        let answer = client.send(Method::GET, &format!("{path}/output"), None).await?;
        if !answer.status.is_success() {
            crate::client::answer_json(&answer)?;
        }
        Some(answer.body)
    } else {
        None
    };
    if json_out {
        print_json(&crate::api::finished_json(&job, output.as_deref()))?;
    } else if let Some(output) = output {
        super::write_output(&output).map_err(|e| CliError::internal(format!("cannot write to stdout: {e}")))?;
    } else {
        say!("leash: job {id} {}: {}", text(&job["status"]), text(&job["error_message"]));
    }
    Ok(error_kind.map_or(ExitStatus::Success, ExitStatus::for_kind))
}

// ---- jobs ----

pub(super) async fn jobs(command: JobsCommand) -> Result<ExitStatus, CliError> {
    match command {
        JobsCommand::List { conn, status, plugin, plan, concurrency_key, limit, before } => {
            let mut query = vec![format!("limit={limit}")];
            for (key, value) in [
                ("status", status),
                ("plugin", plugin),
                ("plan", plan),
                ("concurrency_key", concurrency_key),
                ("before", before),
            ] {
                if let Some(value) = value {
                    query.push(format!("{key}={}", url_encode(&value)));
                }
            }
            let path = format!("/v1/jobs?{}", query.join("&"));
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let page = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&page).map(|()| ExitStatus::Success);
                }
                let mut table = new_table(&["ID", "STATUS", "PLUGIN", "TARGET", "ATTEMPT", "CREATED", "ERROR"]);
                for job in page["jobs"].as_array().into_iter().flatten() {
                    let named = &job["plugin_name"];
                    let plugin = match (named["name"].as_str(), named["version"].as_str()) {
                        (Some(n), Some(v)) => format!("{n}@{v}"),
                        _ => short_digest(&text(&job["plugin"])),
                    };
                    table.add_row(vec![
                        text(&job["id"]),
                        text(&job["status"]),
                        plugin,
                        text(&job["target"]),
                        format!("{}/{}", text(&job["attempt"]), text(&job["max_attempts"])),
                        text(&job["created_at"]),
                        text(&job["error_kind"]),
                    ]);
                }
                print_table(table);
                if let Some(next) = page["next_before"].as_str() {
                    say!("leash: more jobs: --before {next}");
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        JobsCommand::Show { conn, id } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let job = client.json(Method::GET, &format!("/v1/jobs/{id}"), None).await?;
                if json_out {
                    return print_json(&job).map(|()| ExitStatus::Success);
                }
                let mut table = new_table(&["FIELD", "VALUE"]);
                if let Some(fields) = job.as_object() {
                    for (key, value) in fields {
                        table.add_row(vec![key.clone(), text(value)]);
                    }
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        JobsCommand::Cancel { conn, id } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let answer = client.json(Method::POST, &format!("/v1/jobs/{id}/cancel"), None).await?;
                if json_out {
                    print_json(&answer)?;
                } else {
                    let _ = writeln!(std::io::stdout(), "{id} {}", text(&answer["status"]).replace('_', " "));
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        JobsCommand::Logs { conn, id } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let logs = client.json(Method::GET, &format!("/v1/jobs/{id}/logs"), None).await?;
                if json_out {
                    return print_json(&logs).map(|()| ExitStatus::Success);
                }
                let mut out = std::io::stdout().lock();
                for record in logs["records"].as_array().into_iter().flatten() {
                    let fields: String = record["fields"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|pair| format!(" {}={}", text(&pair[0]), text(&pair[1])))
                        .collect();
                    let _ = writeln!(
                        out,
                        "{:>6}ms [{}] {}{fields}",
                        text(&record["elapsed_ms"]),
                        text(&record["level"]),
                        text(&record["message"])
                    );
                }
                for stream in ["stdout", "stderr"] {
                    for line in super::terminal_lines(logs[stream].as_str().unwrap_or_default()) {
                        let _ = writeln!(out, "[guest {stream}] {line}");
                    }
                }
                for (what, key) in [
                    ("log records", "records_dropped"),
                    ("stdout bytes", "stdout_dropped"),
                    ("stderr bytes", "stderr_dropped"),
                ] {
                    if logs[key].as_u64().unwrap_or(0) > 0 {
                        let _ = writeln!(out, "({} {what} dropped past the caps)", text(&logs[key]));
                    }
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        JobsCommand::Wait { conn, id, timeout } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| wait_for(client, &id, timeout, json_out).await).await
        }
    }
}

fn short_digest(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

/// Percent-encode a query value.
fn url_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

// ---- plugins ----

pub(super) async fn plugins(command: PluginsCommand) -> Result<ExitStatus, CliError> {
    match command {
        PluginsCommand::Add { conn, file, name, version } => {
            let bytes =
                std::fs::read(&file).map_err(|e| CliError::usage(format!("cannot read {}: {e}", file.display())))?;
            let name = match name {
                Some(name) => name,
                None => file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            };
            let mut path = format!("/v1/plugins?name={}", url_encode(&name));
            if let Some(version) = &version {
                path.push_str(&format!("&version={}", url_encode(version)));
            }
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let info = client.upload(&path, bytes).await?;
                if json_out {
                    print_json(&info)?;
                } else {
                    let _ = writeln!(
                        std::io::stdout(),
                        "{}@{} {} ({} bytes)",
                        text(&info["name"]),
                        text(&info["version"]),
                        text(&info["digest"]),
                        text(&info["size_bytes"])
                    );
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        PluginsCommand::List { conn } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let list = client.json(Method::GET, "/v1/plugins", None).await?;
                if json_out {
                    return print_json(&list).map(|()| ExitStatus::Success);
                }
                let mut table = new_table(&["NAME", "VERSION", "DIGEST", "SIZE", "CREATED"]);
                for p in list["plugins"].as_array().into_iter().flatten() {
                    table.add_row(vec![
                        text(&p["name"]),
                        text(&p["version"]),
                        short_digest(&text(&p["digest"])),
                        text(&p["size_bytes"]),
                        text(&p["created_at"]),
                    ]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        PluginsCommand::Show { conn, reference } => {
            let json_out = conn.json;
            let path = format!("/v1/plugins/{}", url_encode(&reference));
            with_client(&conn, false, async move |client| {
                let info = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&info).map(|()| ExitStatus::Success);
                }
                let mut table = new_table(&["FIELD", "VALUE"]);
                for key in ["name", "version", "digest", "size_bytes", "created_at"] {
                    table.add_row(vec![key.to_owned(), text(&info[key])]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
    }
}

// ---- diagnostics ----

pub(super) async fn diagnostics(args: DiagnosticsArgs) -> Result<ExitStatus, CliError> {
    let json_out = args.conn.json;
    with_client(&args.conn, false, async move |client| {
        let report = client.json(Method::GET, "/v1/health", None).await?;
        if json_out {
            return print_json(&report).map(|()| ExitStatus::Success);
        }
        let health = &report["health"];
        let counts = &health["counts"];
        let _ = writeln!(std::io::stdout(), "{}", text(&health["summary"]));
        let mut table = new_table(&["CHECK", "VALUE"]);
        let rows = [
            ("target", client.target()),
            ("client version", env!("CARGO_PKG_VERSION").to_owned()),
            (
                "queue",
                ["queued", "running", "succeeded", "failed", "cancelled"]
                    .iter()
                    .map(|k| format!("{k} {}", text(&counts[*k])))
                    .chain([format!(
                        "total {}",
                        ["queued", "running", "succeeded", "failed", "cancelled"]
                            .iter()
                            .map(|k| counts[*k].as_u64().unwrap_or(0))
                            .sum::<u64>()
                    )])
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            ("max timeout", format!("{} ms", text(&report["ceilings"]["max_timeout_ms"]))),
            ("max memory", format!("{} bytes", text(&report["ceilings"]["max_memory_bytes"]))),
            ("max output", format!("{} bytes", text(&report["ceilings"]["max_output_bytes"]))),
        ];
        for (check, value) in rows {
            table.add_row(vec![check.to_owned(), value]);
        }
        print_table(table);
        let mut workers = new_table(&[
            "WORKER",
            "HOST",
            "PID",
            "STATE",
            "SLOTS",
            "RUNNING",
            "DONE/FAILED/CANCELLED",
            "LAST HEARTBEAT",
            "JOBS",
        ]);
        for worker in health["workers"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let state = if worker["stale"] == true {
                format!("stale ({})", text(&worker["state"]))
            } else {
                text(&worker["state"])
            };
            let jobs: Vec<String> =
                worker["running_jobs"].as_array().map(|a| a.iter().map(text).collect()).unwrap_or_default();
            workers.add_row(vec![
                text(&worker["worker_id"]),
                text(&worker["host"]),
                text(&worker["pid"]),
                state,
                text(&worker["slots"]),
                text(&worker["running"]),
                format!("{}/{}/{}", text(&worker["processed"]), text(&worker["failed"]), text(&worker["cancelled"])),
                text(&worker["last_heartbeat"]),
                jobs.join(" "),
            ]);
        }
        print_table(workers);
        Ok(ExitStatus::Success)
    })
    .await
}
