//! `leash jobs`: list, show, cancel, approve, reject, run, wait for and
//! read the logs of jobs (`watch` is in its own module).

use std::io::Write;
use std::time::Duration;

use axum::http::Method;
use base64::Engine as _;
use clap::Subcommand;

use crate::api::requests::{DecisionRequest, RememberRequest};
use crate::api::types::{AttemptList, CancelAnswer, JobPage, JobView};
use crate::cli::commands::connect::{new_table, print_json, print_table, short_digest, text, url_encode, with_client};
use crate::cli::commands::show::{attempts_table, attempts_text};
use crate::cli::commands::submit::wait_for;
use crate::cli::commands::watch::WatchArgs;
use crate::cli::commands::{ConnArgs, DecisionArgs};
use crate::cli::{CliError, ExitStatus, parse_duration, terminal_text};
use crate::client::typed;
use crate::job::{JobStatus, Verdict, millis};
use crate::runtime::Cancelled;

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum JobsCommand {
    /// List jobs, newest first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// Only jobs in one of these states, comma-separated
        /// (pending_approval, approved, queued, running, succeeded, failed,
        /// cancelled).
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
        /// Only jobs this schedule submitted (by its name).
        #[arg(long, value_name = "NAME")]
        schedule: Option<String>,
        /// Only jobs with this tag (repeat: all of them, or with
        /// `--any-tag` any one).
        #[arg(long = "tag", value_name = "TAG")]
        tags: Vec<String>,
        /// Match jobs with any one of the `--tag`s, not all.
        #[arg(long, requires = "tags")]
        any_tag: bool,
        /// Only jobs whose metadata has this entry, `KEY=VALUE` (repeat:
        /// all of them).
        #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = crate::cli::parse::parse_meta)]
        meta: Vec<(String, String)>,
        /// Jobs per page (1-500).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Jobs older than this id (the previous page's last).
        #[arg(long, value_name = "JOB_ID")]
        before: Option<String>,
        /// Only jobs whose error (or last retried attempt's error) holds
        /// this text, in any case.
        #[arg(long, value_name = "TEXT")]
        error: Option<String>,
        /// Only jobs that ended with this error kind (timeout, guest_error, …).
        #[arg(long, value_name = "KIND")]
        error_kind: Option<String>,
        /// Only jobs created at or after this RFC 3339 time.
        #[arg(long, value_name = "TIME")]
        created_after: Option<String>,
        /// Only jobs created before this RFC 3339 time.
        #[arg(long, value_name = "TIME")]
        created_before: Option<String>,
    },
    /// Show one job: its status and error first, then its plugin, timings, limits, grants and attempts (`--json`: every field).
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
    /// Run ended jobs again (redrive): each failed or cancelled job is
    /// queued again with a fresh set of attempts; its earlier attempts stay
    /// in its history. Not a job that waited for approval, nor a plan's
    /// phase (operate). Name the jobs by id, or by a filter (`--status
    /// failed --plugin X --error-kind timeout --since 1h`), trying it with
    /// `--dry-run` first.
    Retry {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job ids.
        ids: Vec<String>,
        #[command(flatten)]
        filter: super::redrive::RedriveFilter,
    },
    /// Print a job's effect ledger: every effectful request (by default any
    /// method but GET and HEAD) its attempts made, and how each ended.
    Effects {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
    },
    /// Print a job's attempts, oldest first: worker, start, duration, how
    /// each ended and its error (`--json`: with what each logged).
    Attempts {
        #[command(flatten)]
        conn: ConnArgs,
        /// The job id.
        id: String,
    },
    /// Say in one sentence why a job is where it is (what holds it in the
    /// queue, whom it waits for, where it runs, how it ended), then the
    /// evidence.
    Why {
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
        /// Let this approval stand this long (1m to 90d) for jobs exactly
        /// like this one: same plugin bytes, target, grants, input and
        /// submitter. Matching jobs waiting now are approved too, and
        /// matching jobs submitted meanwhile on arrival (`leash rules`).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        remember: Option<Duration>,
        /// With `--remember`: any principal's matching submits, not only
        /// this job's submitter's.
        #[arg(long, requires = "remember")]
        any_submitter: bool,
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
    Watch(WatchArgs),
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

pub(in crate::cli) async fn jobs(command: JobsCommand) -> Result<ExitStatus, CliError> {
    match command {
        JobsCommand::List {
            conn,
            status,
            plugin,
            plan,
            concurrency_key,
            schedule,
            tags,
            any_tag,
            meta,
            limit,
            before,
            error,
            error_kind,
            created_after,
            created_before,
        } => {
            let mut query = vec![format!("limit={limit}")];
            for (key, value) in [
                ("status", status),
                ("plugin", plugin),
                ("plan", plan),
                ("concurrency_key", concurrency_key),
                ("schedule", schedule),
                ("tag", (!tags.is_empty()).then(|| tags.join(","))),
                ("tag_match", any_tag.then(|| "any".to_owned())),
                (
                    "meta",
                    (!meta.is_empty()).then(|| {
                        serde_json::Value::Object(
                            meta.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect(),
                        )
                        .to_string()
                    }),
                ),
                ("before", before),
                ("error", error),
                ("error_kind", error_kind),
                ("created_after", created_after),
                ("created_before", created_before),
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
                let page: JobPage = typed(page)?;
                let paused = crate::cli::commands::plugins::paused_names(client).await?;
                let mut table = new_table(&["ID", "STATUS", "PLUGIN", "TARGET", "ATTEMPT", "CREATED", "ERROR"]);
                for JobView { job, .. } in page.jobs {
                    let plugin = match &job.plugin_name {
                        Some(name) => terminal_text(&name.to_string()),
                        None => short_digest(&job.plugin.to_string()),
                    };
                    // A queued job of a paused plugin waits for its resume.
                    let held = job.status == JobStatus::Queued
                        && job.plugin_name.as_ref().is_some_and(|n| paused.iter().any(|z| z.name == n.name));
                    table.add_row(vec![
                        job.id.to_string(),
                        if held {
                            "queued (paused)".to_owned()
                        } else if job.waiting_rate(crate::clock::Timestamp::now()) {
                            "queued (waiting_rate)".to_owned()
                        } else {
                            job.status.to_string()
                        },
                        plugin,
                        terminal_text(&job.target.to_string()),
                        attempts_text(&job),
                        job.created_at.to_string(),
                        job.error_kind.map_or_else(|| "-".to_owned(), |k| k.to_string()),
                    ]);
                }
                print_table(table);
                if let Some(next) = page.next_before {
                    say!("leash: more jobs: --before {next}");
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        JobsCommand::Show { conn, id } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let mut job = client.json(Method::GET, &format!("/v1/jobs/{id}"), None).await?;
                let list = client.json(Method::GET, &format!("/v1/jobs/{id}/attempts"), None).await?;
                let attempts: AttemptList = typed(list)?;
                if json_out {
                    // Each attempt without its logs (`leash jobs attempts
                    // --json` has them).
                    let mut summaries =
                        serde_json::to_value(&attempts.attempts).map_err(|e| CliError::internal(e.to_string()))?;
                    for summary in summaries.as_array_mut().into_iter().flatten() {
                        summary.as_object_mut().map(|o| o.remove("logs"));
                    }
                    if let Some(fields) = job.as_object_mut() {
                        fields.insert("attempts".to_owned(), summaries);
                    }
                    return print_json(&job).map(|()| ExitStatus::Success);
                }
                let view: JobView = typed(job)?;
                let now = crate::clock::Timestamp::now();
                let page = super::show::job_text(&view, &attempts.attempts, now, crate::cli::terminal_width());
                let _ = write!(std::io::stdout(), "{page}");
                Ok(ExitStatus::Success)
            })
            .await
        }
        JobsCommand::Attempts { conn, id } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let list = client.json(Method::GET, &format!("/v1/jobs/{id}/attempts"), None).await?;
                if json_out {
                    return print_json(&list).map(|()| ExitStatus::Success);
                }
                let attempts: AttemptList = typed(list)?;
                print_table(attempts_table(&attempts.attempts, crate::cli::terminal_width()));
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
                    let said = match typed::<CancelAnswer>(answer)?.status {
                        Cancelled::Cancelled => "cancelled",
                        Cancelled::Requested => "cancel requested",
                    };
                    let _ = writeln!(std::io::stdout(), "{id} {said}");
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        JobsCommand::Retry { conn, ids, filter } => super::redrive::retry(conn, ids, filter).await,
        JobsCommand::Effects { conn, id } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let effects = client.json(Method::GET, &format!("/v1/jobs/{id}/effects"), None).await?;
                if json_out {
                    return print_json(&effects).map(|()| ExitStatus::Success);
                }
                let list: crate::api::types::EffectList = typed(effects)?;
                let mut table =
                    new_table(&["ATTEMPT", "SEQ", "METHOD", "URL", "OUTCOME", "STARTED", "IDEMPOTENCY KEY"]);
                for e in list.effects {
                    let outcome = match (e.status, &e.error) {
                        (Some(status), _) => status.to_string(),
                        (None, Some(error)) => terminal_text(error),
                        // Recorded before sending, never completed: the
                        // attempt ended before it knew.
                        (None, None) => "no outcome".to_owned(),
                    };
                    table.add_row(vec![
                        e.attempt.to_string(),
                        e.seq.to_string(),
                        terminal_text(&e.method),
                        terminal_text(&e.url),
                        outcome,
                        e.started_at.to_string(),
                        e.idempotency_key,
                    ]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        JobsCommand::Why { conn, id } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let why = client.json(Method::GET, &format!("/v1/jobs/{}/why", url_encode(&id)), None).await?;
                if json_out {
                    return print_json(&why).map(|()| ExitStatus::Success);
                }
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", terminal_text(&text(&why["sentence"])));
                for (key, value) in why["evidence"].as_object().into_iter().flatten().filter(|(_, v)| !v.is_null()) {
                    let _ = writeln!(out, "  {key}: {}", terminal_text(&text(value)));
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
                    for line in crate::cli::terminal_lines(logs[stream].as_str().unwrap_or_default()) {
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
        JobsCommand::Approve { conn, id, decision, remember, any_submitter } => {
            let mut body = decision.body();
            body.remember = remember.map(|ttl| RememberRequest { ttl_ms: millis::of(ttl), any_submitter });
            decide(conn, format!("/v1/jobs/{id}/approve"), Some(body)).await
        }
        JobsCommand::Reject { conn, id, decision } => {
            decide(conn, format!("/v1/jobs/{id}/reject"), Some(decision.body())).await
        }
        JobsCommand::Run { conn, id } => decide(conn, format!("/v1/jobs/{id}/run"), None).await,
        JobsCommand::Watch(args) => super::watch::watch(args).await,
        JobsCommand::Wait { conn, id, timeout } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| wait_for(client, &id, timeout, json_out).await).await
        }
    }
}

/// Send a decision and say what it did: the job's state now (and, for a
/// job stamped sync whose run it triggered, its outcome and output).
async fn decide(conn: ConnArgs, path: String, body: Option<DecisionRequest>) -> Result<ExitStatus, CliError> {
    let json_out = conn.json;
    with_client(&conn, false, async move |client| {
        let answer = client.post(&path, body.as_ref()).await?;
        if json_out {
            print_json(&answer)?;
        } else {
            let view: JobView = typed(answer["job"].clone())?;
            let job = view.job;
            let _ = writeln!(std::io::stdout(), "{} {}", job.id, job.status);
            if let Some(approval) = &job.approval {
                let by: Vec<&str> = approval.approvals.iter().map(|a| a.by.as_str()).collect();
                let said = match &approval.decision {
                    Some(decision) => {
                        let verdict = if decision.verdict == Verdict::Approved { "approved" } else { "rejected" };
                        format!("{verdict} by {}", decision.by)
                    }
                    None => format!("approvals {} of {}", by.len(), approval.duties.quorum),
                };
                let given = if by.len() > 1 { format!(" (approved by {})", by.join(", ")) } else { String::new() };
                let _ = writeln!(std::io::stdout(), "{}", terminal_text(&format!("{said}{given}")));
                for rule in approval.approvals.iter().filter_map(|a| a.remembered.as_deref()) {
                    let _ = writeln!(std::io::stdout(), "remembered as rule {}", terminal_text(rule));
                }
            }
            if let Some(output) = answer["output_base64"].as_str() {
                let bytes = base64::engine::general_purpose::STANDARD.decode(output).unwrap_or_default();
                let _ = std::io::stdout().write_all(&bytes);
            }
        }
        Ok(ExitStatus::Success)
    })
    .await
}
