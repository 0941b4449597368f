//! `leash submit`: queue a job, and with `--wait` follow it to its end.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Duration;

use axum::http::Method;
use base64::Engine as _;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use crate::api::requests::{BatchRequest, Execution, GateChoice, SubmitRequest};
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{print_json, text, with_client};
use crate::cli::{CliError, ExitStatus, JobArgs, LabelArgs, RateArgs, parse_duration, parse_size, read_input};
use crate::client::{Client, ClientError};
use crate::job::{ErrorKind, JobStatus, Target};

#[derive(Debug, Args)]
pub(in crate::cli) struct SubmitArgs {
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
    #[command(flatten)]
    labels: LabelArgs,
    #[command(flatten)]
    rate: RateArgs,
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
    /// Claim order: 0 (first, the default) to 9 (last); one claimed job in
    /// ten goes to a job due for over a minute, whatever its priority.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    priority: Option<u8>,
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
const BATCH_CONFLICTS: [&str; 22] = [
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
    "priority",
    "plan",
    "tags",
    "meta",
    "rate_limit",
    "rate_key",
    "gate",
    "hold_after_approval",
    "wait",
    "work",
];

pub(in crate::cli) async fn submit(args: SubmitArgs) -> Result<ExitStatus, CliError> {
    if let Some(source) = &args.batch {
        let lines = batch_lines(source, args.queue_ttl)?;
        let json_out = args.conn.json;
        return with_client(&args.conn, false, async move |client| submit_batch(client, lines, json_out).await).await;
    }
    let plugin = args.plugin.clone().ok_or_else(|| CliError::usage("give a plugin, or --batch FILE"))?;
    let target = args.job.target()?;
    let input = read_input(args.job.input.as_deref())?;
    let file = Path::new(&plugin);
    let bytes = if file.is_file() || plugin.ends_with(".wasm") {
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
            None => plugin,
        };
        let (phase, action) = match &target {
            Target::Action(name) => (None, Some(name.clone())),
            other => (Some(other.to_string()), None),
        };
        let body = SubmitRequest {
            plugin,
            phase,
            action,
            input_base64: Some(base64::engine::general_purpose::STANDARD.encode(&input)),
            timeout: args.timeout,
            fuel: args.fuel,
            memory_bytes: args.memory,
            max_attempts: args.max_attempts,
            queue_ttl: args.queue_ttl,
            concurrency_key: args.concurrency_key.clone(),
            priority: args.priority,
            plan_id: args.plan.clone(),
            backoff: args.retry_backoff,
            backoff_cap: args.retry_backoff_cap,
            run_at: args.run_after.clone(),
            delay: args.delay,
            gate: args.gate.as_deref().map(gate_choice),
            run_on_approve: args.hold_after_approval.then_some(false),
            execution: Some(Execution::Async),
            tags: args.labels.tags.clone(),
            metadata: args.labels.metadata(),
            rate_limit: args.rate.rate_limit.clone(),
            rate_key: args.rate.rate_key.clone(),
            ..SubmitRequest::default()
        };
        let accepted = client.create("/v1/jobs", &body).await?;
        let id = text(&accepted["job_id"]);
        let gated = accepted["status"] == "pending_approval";
        let Some(wait) = wait else {
            if json_out {
                let status = if gated { "pending_approval" } else { "queued" };
                print_json(&json!({ "job_id": id, "status": status }))?;
            } else {
                let _ = writeln!(std::io::stdout(), "{id}");
                if gated {
                    say!("leash: {id} waits for approval: leash jobs approve {id}");
                }
            }
            return Ok(ExitStatus::Success);
        };
        if gated && !json_out {
            say!("leash: {id} waits for approval (leash jobs approve {id}); waiting");
        } else if !json_out {
            say!("leash: job {id} queued; waiting");
        }
        wait_for(client, &id, wait, json_out).await
    })
    .await
}

/// One job of a `--batch` file: its line number (from 1) and its request.
struct BatchLine {
    number: usize,
    body: SubmitRequest,
}

/// Read and check a `--batch` file before anything is sent: every
/// non-empty line must be a JSON object that is a job request (`POST
/// /v1/jobs`'s body). `queue_ttl` fills in lines that give none.
fn batch_lines(source: &str, queue_ttl: Option<Duration>) -> Result<Vec<BatchLine>, CliError> {
    let text = read_input(Some(source))?;
    let text = String::from_utf8(text).map_err(|_| CliError::usage(format!("--batch {source}: not UTF-8 text")))?;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .map_err(|e| CliError::usage(format!("--batch {source}, line {number}: not JSON: {e}")))?;
        if !value.is_object() {
            return Err(CliError::usage(format!("--batch {source}, line {number}: expected a JSON object (one job)")));
        }
        let mut body: SubmitRequest = serde_json::from_value(value)
            .map_err(|e| CliError::usage(format!("--batch {source}, line {number}: not a job request: {e}")))?;
        body.queue_ttl = body.queue_ttl.or(queue_ttl);
        lines.push(BatchLine { number, body });
    }
    if lines.is_empty() {
        return Err(CliError::usage(format!("--batch {source}: no jobs in it")));
    }
    Ok(lines)
}

/// Queue the lines in requests of [`crate::api::MAX_BATCH_JOBS`], each all
/// or nothing, printing each request's job ids as it is queued. A refused
/// request names its line and stops: the lines before it stay queued, the
/// rest are not sent.
async fn submit_batch(client: &Client, lines: Vec<BatchLine>, json_out: bool) -> Result<ExitStatus, CliError> {
    let mut queued = Vec::with_capacity(lines.len());
    for chunk in lines.chunks(crate::api::MAX_BATCH_JOBS) {
        let body = BatchRequest { jobs: chunk.iter().map(|l| l.body.clone()).collect() };
        let answer = match client.create("/v1/jobs:batch", &body).await {
            Ok(answer) => answer,
            Err(e) => {
                let first = chunk[0].number;
                let last = chunk[chunk.len() - 1].number;
                let line = refused_line(&e, chunk).map(|n| format!(" (the job on line {n})")).unwrap_or_default();
                if queued.is_empty() {
                    say!("leash: lines {first}–{last} were refused{line}; nothing was queued");
                } else {
                    say!(
                        "leash: lines {first}–{last} were refused{line} and not queued, nor any line after them; \
                         the {} jobs of the lines before were queued",
                        queued.len()
                    );
                    if json_out {
                        print_json(&json!({ "jobs": queued }))?;
                    }
                }
                return Err(e.into());
            }
        };
        let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
        if jobs.len() != chunk.len() {
            return Err(CliError::internal(format!("the server answered {} jobs for {}", jobs.len(), chunk.len())));
        }
        for job in jobs {
            if !json_out {
                let _ = writeln!(std::io::stdout(), "{}", text(&job["job_id"]));
            }
            queued.push(job);
        }
    }
    if json_out {
        print_json(&json!({ "jobs": queued }))?;
    }
    Ok(ExitStatus::Success)
}

/// The line of the job a batch refusal names (`jobs[3]: …`).
fn refused_line(error: &ClientError, chunk: &[BatchLine]) -> Option<usize> {
    let ClientError::Api { message, .. } = error else { return None };
    let index: usize = message.strip_prefix("jobs[")?.split(']').next()?.parse().ok()?;
    chunk.get(index).map(|l| l.number)
}

/// What a Ctrl-C during a wait decided.
pub(super) enum Interrupted {
    CancelJob,
    StopWaiting,
}

/// Ask on the terminal; without one, stop waiting and leave the job alone.
pub(super) async fn ask_on_interrupt(id: &str) -> Interrupted {
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

pub(super) fn progress_bar(json_out: bool) -> ProgressBar {
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
pub(super) async fn wait_for(
    client: &Client,
    id: &str,
    wait: Duration,
    json_out: bool,
) -> Result<ExitStatus, CliError> {
    let poll = if client.runtime().is_some() { Duration::from_millis(50) } else { Duration::from_millis(200) };
    let bar = progress_bar(json_out);
    let deadline = tokio::time::Instant::now() + wait;
    let mut interrupt = crate::cli::process::interrupt_signal()?;
    let path = format!("/v1/jobs/{id}");
    // Attempts spent when last seen (a job just submitted has spent none).
    let mut spent = Some(0);
    let job = loop {
        let job = client.json(Method::GET, &path, None).await?;
        if !json_out {
            bar.suspend(|| narrate_retry(&job, &mut spent));
        }
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
        crate::cli::write_output(&output).map_err(|e| CliError::internal(format!("cannot write to stdout: {e}")))?;
    } else {
        say!("leash: job {id} {}: {}", text(&job["status"]), text(&job["error_message"]));
    }
    Ok(error_kind.map_or(ExitStatus::Success, ExitStatus::for_kind))
}

/// Say, once per spent attempt, that an attempt failed and when the next
/// runs: `attempt 1 failed (guest_error: Retryable: …); retrying in 1.2 s
/// (2 of 3)`. `spent` is the attempts spent when last seen.
fn narrate_retry(job: &serde_json::Value, spent: &mut Option<u64>) {
    let count = |field: &str| job[field].as_u64().unwrap_or(0);
    let now_spent = count("retries") + count("lost_leases");
    let before = spent.replace(now_spent);
    if before.is_none_or(|before| now_spent <= before) {
        return;
    }
    let error: String = text(&job["last_error"]).lines().next().unwrap_or_default().chars().take(200).collect();
    let when = match job["run_after"].as_str().and_then(|t| crate::clock::Timestamp::parse_rfc3339(t).ok()) {
        Some(at) if job["status"] == "queued" => {
            let ms = (at.unix_ms() - crate::clock::Timestamp::now().unix_ms()).max(0);
            format!("retrying in {:.1} s", ms as f64 / 1000.0)
        }
        _ => "retrying".to_owned(),
    };
    // The attempt that failed: the one the job has just spent.
    say!(
        "leash: attempt {now_spent} failed ({}); {when} ({} of {})",
        crate::cli::terminal_text(&error),
        now_spent + 1,
        count("max_attempts")
    );
}

/// `--gate`'s value (clap allows only these two).
fn gate_choice(gate: &str) -> GateChoice {
    if gate == "none" { GateChoice::None } else { GateChoice::Approval }
}
