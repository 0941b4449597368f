//! `leash plan`: submit, show, list, approve, reject and cancel plans.

use std::io::Write;
use std::time::Duration;

use axum::http::Method;
use base64::Engine as _;
use clap::Subcommand;
use serde_json::Value;

use crate::api::requests::{PlanDecisionRequest, PlanRequest};
use crate::api::types::PlanAnswer;
use crate::cli::commands::connect::{new_table, print_json, print_table, short_digest, text, url_encode, with_client};
use crate::cli::commands::{ConnArgs, DecisionArgs};
use crate::cli::{CliError, ExitStatus, parse_duration, read_input, terminal_text};
use crate::client::{Client, typed};
use crate::job::proposal::PlanEffects;
use crate::job::{PlanPhase, ProposalState};
use std::fmt::Write as _;

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum PlanCommand {
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
    /// Approve a phase of a plan that waits for approval: name it, so a
    /// resent approval never approves the phase after it.
    Approve {
        #[command(flatten)]
        conn: ConnArgs,
        /// The plan id.
        id: String,
        /// The phase approved: `execute` or `apply`.
        #[arg(long, value_name = "PHASE")]
        phase: PlanPhase,
        /// Approving apply: the binding digest `leash plan show` printed.
        /// Refused (`plan_changed`) if the plan is no longer what it covers.
        #[arg(long, value_name = "SHA256")]
        digest: Option<String>,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Reject a phase of a plan that waits for approval: apply never runs.
    Reject {
        #[command(flatten)]
        conn: ConnArgs,
        /// The plan id.
        id: String,
        /// The phase rejected: `execute` or `apply`.
        #[arg(long, value_name = "PHASE")]
        phase: PlanPhase,
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

pub(in crate::cli) async fn plan(command: PlanCommand) -> Result<ExitStatus, CliError> {
    match command {
        PlanCommand::Submit { conn, plugin, input, apply, wait } => {
            let input = read_input(input.as_deref())?;
            let body = PlanRequest {
                plugin,
                input_base64: Some(base64::engine::general_purpose::STANDARD.encode(&input)),
                apply: apply.parse().map_err(CliError::usage)?,
                ..PlanRequest::default()
            };
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let plan = client.send_json(Method::POST, "/v1/plans", &body).await?;
                let id = text(&plan["plan_id"]);
                match wait {
                    None if json_out => print_json(&plan).map(|()| ExitStatus::Success),
                    None => {
                        let _ = writeln!(std::io::stdout(), "{id}");
                        Ok(ExitStatus::Success)
                    }
                    Some(wait) => wait_for_plan(client, &id, wait, json_out).await,
                }
            })
            .await
        }
        PlanCommand::Show { conn, id } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let plan = client.json(Method::GET, &format!("/v1/plans/{id}"), None).await?;
                show(plan, json_out)
            })
            .await
        }
        PlanCommand::List { conn, limit, before } => {
            let mut path = format!("/v1/plans?limit={limit}");
            if let Some(before) = before {
                path.push_str(&format!("&before={}", url_encode(&before)));
            }
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let page = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&page).map(|()| ExitStatus::Success);
                }
                let page: crate::api::types::PlanPage = typed(page)?;
                let mut table = new_table(&["PLAN", "STATUS", "PLUGIN", "APPLY", "CREATED", "APPROVED BY"]);
                for plan in page.plans {
                    let job = &plan.execute.job.job;
                    let plugin = match &job.plugin_name {
                        Some(name) => terminal_text(&name.to_string()),
                        None => short_digest(&job.plugin.to_string()),
                    };
                    table.add_row(vec![
                        plan.plan_id,
                        plan.status.to_string(),
                        plugin,
                        plan.apply_mode.as_str().to_owned(),
                        plan.created_at.to_string(),
                        plan.approved_by.as_deref().map_or_else(|| "-".to_owned(), terminal_text),
                    ]);
                }
                print_table(table);
                if let Some(next) = page.next_before {
                    say!("leash: more plans: --before {next}");
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        PlanCommand::Approve { conn, id, phase, digest, decision } => {
            let body = PlanDecisionRequest { digest, ..decision.plan_body(phase) };
            decide(conn, format!("/v1/plans/{id}/approve"), Some(body)).await
        }
        PlanCommand::Reject { conn, id, phase, decision } => {
            decide(conn, format!("/v1/plans/{id}/reject"), Some(decision.plan_body(phase))).await
        }
        PlanCommand::Cancel { conn, id } => decide(conn, format!("/v1/plans/{id}/cancel"), None).await,
    }
}

async fn decide(conn: ConnArgs, path: String, body: Option<PlanDecisionRequest>) -> Result<ExitStatus, CliError> {
    let json_out = conn.json;
    with_client(&conn, false, async move |client| {
        let plan = client.post(&path, body.as_ref()).await?;
        if json_out {
            return print_json(&plan).map(|()| ExitStatus::Success);
        }
        let _ = writeln!(std::io::stdout(), "{} {}", text(&plan["plan_id"]), text(&plan["status"]));
        Ok(ExitStatus::Success)
    })
    .await
}

/// Poll a plan until it needs a decision or ends, showing its phase; then
/// show it. The exit status is the outcome of its last phase.
async fn wait_for_plan(client: &Client, id: &str, wait: Duration, json_out: bool) -> Result<ExitStatus, CliError> {
    let poll = if client.runtime().is_some() { Duration::from_millis(50) } else { Duration::from_millis(200) };
    let bar = super::submit::progress_bar(json_out);
    let deadline = tokio::time::Instant::now() + wait;
    let path = format!("/v1/plans/{id}");
    loop {
        let plan = client.json(Method::GET, &path, None).await?;
        let status = text(&plan["status"]);
        if !matches!(status.as_str(), "planning" | "applying") {
            bar.finish_and_clear();
            return show(plan, json_out);
        }
        let phase = if status == "planning" { &plan["execute"]["job"] } else { &plan["apply"]["job"] };
        let progress = &phase["progress"];
        match (progress["done"].as_u64(), progress["total"].as_u64()) {
            (Some(done), Some(total)) => {
                if total > 0 {
                    bar.set_length(total);
                }
                bar.set_position(done);
                bar.set_message(format!("{status}: {}", text(&progress["note"])));
            }
            _ => bar.set_message(status),
        }
        if tokio::time::Instant::now() >= deadline {
            bar.finish_and_clear();
            say!("leash: plan {id} is still running after {wait:?}; `leash plan show {id}` shows it");
            return Ok(ExitStatus::Timeout);
        }
        tokio::time::sleep(poll).await;
    }
}

/// Print a plan: as JSON, or its status, phases and the execute output —
/// the change a person approves — with what to run next.
fn show(plan: Value, json_out: bool) -> Result<ExitStatus, CliError> {
    let answer: PlanAnswer = typed(plan.clone())?;
    let last = answer.apply.as_ref().unwrap_or(&answer.execute);
    let exit = last.job.job.error_kind.map_or(ExitStatus::Success, ExitStatus::for_kind);
    if json_out {
        print_json(&plan)?;
        return Ok(exit);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "plan {} {}", answer.plan_id, answer.status);
    for (name, phase) in [("execute", Some(&answer.execute)), ("apply", answer.apply.as_ref())] {
        let Some(phase) = phase else { continue };
        let job = &phase.job.job;
        let error = job.error_message.as_deref().map(|m| format!(": {}", terminal_text(m))).unwrap_or_default();
        let _ = writeln!(out, "  {name:<8} {} {}{error}", job.id, job.status);
    }
    if let Some(by) = &answer.approved_by {
        let _ = writeln!(out, "  approved by {}", terminal_text(by));
    }
    if let Some(output) = &answer.execute.output_base64 {
        let bytes = base64::engine::general_purpose::STANDARD.decode(output).unwrap_or_default();
        let _ = writeln!(out, "execute output:");
        let _ = out.write_all(&bytes);
        if !bytes.ends_with(b"\n") {
            let _ = writeln!(out);
        }
    }
    if let Some(effects) = &answer.effects {
        let _ = out.write_all(effects_text(effects).as_bytes());
    }
    if answer.status == crate::job::PlanStatus::AwaitingApproval {
        let id = &answer.plan_id;
        let phase = if answer.apply.is_some() { PlanPhase::Apply } else { PlanPhase::Execute }.as_str();
        let digest = match (&answer.effects, answer.apply.is_some()) {
            (Some(effects), true) => format!(" --digest {}", effects.binding_digest),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "approve: leash plan approve {id} --phase {phase}{digest}    reject: leash plan reject {id} --phase {phase}"
        );
    }
    Ok(exit)
}

/// Body lines shown per proposal; the rest are counted.
const BODY_LINES: usize = 20;

/// A plan's proposed effects as a reviewer reads them: each write with its
/// headers and its body as added lines (`+ `), its size, digest and where
/// it stands.
pub(crate) fn effects_text(effects: &PlanEffects) -> String {
    let mut out = String::new();
    let n = effects.proposals.len();
    let _ = writeln!(out, "proposed effects: {n} (binding {})", effects.binding_digest);
    if n == 0 {
        let _ = writeln!(out, "  none: apply may send no effectful request");
    }
    for p in &effects.proposals {
        let state = match (p.state, p.status) {
            (ProposalState::Sent, Some(status)) => format!("sent, {status}"),
            (ProposalState::Sent, None) => "sent".to_owned(),
            (ProposalState::InDoubt, _) => "in doubt (sent again under the same key if apply runs again)".to_owned(),
            (ProposalState::NotSent, _) => "not sent".to_owned(),
        };
        let size = if p.body_bytes == 1 { "1 byte".to_owned() } else { format!("{} bytes", p.body_bytes) };
        let _ = writeln!(
            out,
            "  #{} {} {}  {size}  {}  {state}",
            p.n,
            terminal_text(&p.method),
            terminal_text(&p.url),
            p.body_sha256
        );
        for (name, value) in &p.headers {
            let _ = writeln!(out, "      {}: {}", terminal_text(name), terminal_text(value));
        }
        match (&p.body_text, &p.body_base64) {
            (Some(text), _) => {
                let lines: Vec<&str> = text.lines().collect();
                for line in lines.iter().take(BODY_LINES) {
                    let _ = writeln!(out, "    + {}", terminal_text(line));
                }
                if lines.len() > BODY_LINES {
                    let _ = writeln!(out, "    … {} more lines (the whole body: --json)", lines.len() - BODY_LINES);
                }
            }
            (None, Some(_)) => {
                let _ = writeln!(out, "    (binary body: --json shows it as base64)");
            }
            (None, None) => {}
        }
    }
    if effects.sent + effects.in_doubt > 0 || effects.refused > 0 {
        let _ = writeln!(
            out,
            "  apply: {} sent, {} in doubt, {} not sent; {} request(s) refused as not proposed",
            effects.sent, effects.in_doubt, effects.not_sent, effects.refused
        );
    }
    out
}
