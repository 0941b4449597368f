//! `leash schedules`: add, list, show, pause, resume, remove and trigger
//! schedules. Every process that runs workers (`leash serve`, `leash
//! worker`) fires them.

use std::io::Write;
use std::time::Duration;

use axum::http::Method;
use clap::Subcommand;

use crate::api::pauses::PauseRequest;
use crate::api::schedules::{ScheduleBody, ScheduleList, ScheduleRequest, TriggerAnswer};
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{
    delete_and_say, new_table, print_json, print_table, request_and_print, url_encode, with_client,
};
use crate::cli::{CliError, ExitStatus, JobArgs, LabelArgs, RateArgs, parse_duration, read_input, terminal_text};
use crate::client::typed;
use crate::job::{CatchUp, GateChoice, JobTemplate, Overlap, Target};

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum SchedulesCommand {
    /// Add a schedule: a job submitted at each time a cron expression
    /// names, or every interval. Its job is checked now as a submit would
    /// check it, and each firing submits it as you.
    Add(Box<AddArgs>),
    /// List schedules: when each fires next and what its last firing did.
    List {
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Show a schedule, its next firings and its latest jobs.
    Show {
        #[command(flatten)]
        conn: ConnArgs,
        /// The schedule's name.
        name: String,
    },
    /// Pause a schedule: it fires nothing until resumed (operate).
    Pause {
        #[command(flatten)]
        conn: ConnArgs,
        /// The schedule's name.
        name: String,
        /// Why (kept with the pause and in the audit trail).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a schedule: it fires next at its first time after now; what
    /// the pause covered is not caught up (operate).
    Resume {
        #[command(flatten)]
        conn: ConnArgs,
        /// The schedule's name.
        name: String,
    },
    /// Remove a schedule; the jobs it submitted stay (operate).
    Remove {
        #[command(flatten)]
        conn: ConnArgs,
        /// The schedule's name.
        name: String,
    },
    /// Submit the schedule's job now, outside its times (operate); prints
    /// the job's id.
    Trigger {
        #[command(flatten)]
        conn: ConnArgs,
        /// The schedule's name.
        name: String,
    },
}

/// The arguments of `leash schedules add`.
#[derive(Debug, clap::Args)]
pub(in crate::cli) struct AddArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Its unique name (a-z, 0-9, - and _).
    name: String,
    /// A registered plugin: `name` (its newest version at each firing),
    /// `name@version` or a digest.
    plugin: String,
    /// A cron expression: 5 fields (minute hour day-of-month month
    /// day-of-week), 6 (seconds first), or `@hourly`, `@daily`,
    /// `@weekly`, `@monthly`, `@yearly`.
    #[arg(long, required_unless_present = "every", conflicts_with = "every")]
    cron: Option<String>,
    /// The IANA time zone the expression is read in, e.g.
    /// `Europe/Berlin` (default UTC).
    #[arg(long, requires = "cron", value_name = "ZONE")]
    tz: Option<String>,
    /// Fire every this long (at least 1 s), at whole multiples of it
    /// since the Unix epoch, e.g. `15m`.
    #[arg(long, value_parser = parse_duration)]
    every: Option<Duration>,
    /// While the previous job has not ended: `skip` the firing
    /// (default), `queue` it behind, or `allow` both to run.
    #[arg(long, value_parser = ["skip", "queue", "allow"])]
    overlap: Option<String>,
    /// After firings missed while no scheduler ran: `none`, the `last`
    /// one (default), or `all` (up to 100).
    #[arg(long, value_parser = ["none", "last", "all"])]
    catch_up: Option<String>,
    /// The job: its phase or action, and its input (JSON).
    #[command(flatten)]
    job: JobArgs,
    /// Its jobs' tags and metadata.
    #[command(flatten)]
    labels: LabelArgs,
    /// Its jobs' rate limit.
    #[command(flatten)]
    rate: RateArgs,
    /// Wall-clock limit per attempt.
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Attempts each job may use.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Claim order: 0 (first, the default) to 9 (last).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    priority: Option<u8>,
    /// How long each job may wait in the queue.
    #[arg(long, value_parser = parse_duration)]
    queue_ttl: Option<Duration>,
    /// `approval`: each job waits for a person.
    #[arg(long, value_parser = ["approval", "none"])]
    gate: Option<String>,
    /// Add it paused (it fires nothing until resumed).
    #[arg(long)]
    paused: bool,
}

pub(in crate::cli) async fn schedules(command: SchedulesCommand) -> Result<ExitStatus, CliError> {
    match command {
        SchedulesCommand::Add(args) => {
            let AddArgs {
                conn,
                name,
                plugin,
                cron,
                tz,
                every,
                overlap,
                catch_up,
                job,
                labels,
                rate,
                timeout,
                max_attempts,
                priority,
                queue_ttl,
                gate,
                paused,
            } = *args;
            let (phase, action) = match job.target()? {
                Target::Action(action) => (None, Some(action.to_string())),
                phase => (Some(phase.to_string()), None),
            };
            let input = read_input(job.input.as_deref())?;
            let input = if input.is_empty() {
                None
            } else {
                Some(serde_json::from_slice(&input).map_err(|e| {
                    CliError::usage(format!("a schedule's input is JSON (each job gets the same): {e}"))
                })?)
            };
            let request = ScheduleRequest {
                name,
                cron,
                timezone: tz,
                every,
                overlap: overlap.as_deref().map(str::parse::<Overlap>).transpose().map_err(CliError::usage)?,
                catch_up: catch_up.as_deref().map(str::parse::<CatchUp>).transpose().map_err(CliError::usage)?,
                paused: paused.then_some(true),
                job: JobTemplate {
                    plugin,
                    phase,
                    action,
                    input,
                    timeout,
                    max_attempts,
                    priority,
                    queue_ttl,
                    gate: gate.map(|g| if g == "none" { GateChoice::None } else { GateChoice::Approval }),
                    metadata: labels.metadata(),
                    tags: labels.tags,
                    rate_limit: rate.rate_limit,
                    rate_key: rate.rate_key,
                    ..JobTemplate::default()
                },
            };
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let added = client.send_json(Method::POST, "/v1/schedules", &request).await?;
                if json_out {
                    return print_json(&added).map(|()| ExitStatus::Success);
                }
                let added: ScheduleBody = typed(added)?;
                let next = added.next_fire_at.map_or_else(|| "never (paused)".to_owned(), |t| t.to_string());
                let _ = writeln!(
                    std::io::stdout(),
                    "schedule {} added: {}; next firing {next}",
                    terminal_text(&added.name),
                    cadence_text(&added)
                );
                Ok(ExitStatus::Success)
            })
            .await
        }
        SchedulesCommand::List { conn } => {
            request_and_print(&conn, Method::GET, "/v1/schedules", None, |list: ScheduleList| {
                let mut table = new_table(&["NAME", "WHEN", "PLUGIN", "NEXT", "LAST", "FIRED", "SKIPPED", "STATE"]);
                for s in &list.schedules {
                    table.add_row(vec![
                        terminal_text(&s.name),
                        cadence_text(s),
                        terminal_text(&s.job.plugin),
                        s.next_fire_at.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
                        terminal_text(s.last_outcome.as_deref().unwrap_or("-")),
                        s.fired.to_string(),
                        s.skipped.to_string(),
                        if s.paused.is_some() { "paused".into() } else { "running".into() },
                    ]);
                }
                print_table(table);
            })
            .await
        }
        SchedulesCommand::Show { conn, name } => {
            let path = format!("/v1/schedules/{}", url_encode(&name));
            request_and_print(&conn, Method::GET, &path, None, |shown: ScheduleBody| print_schedule(&shown)).await
        }
        SchedulesCommand::Pause { conn, name, reason } => {
            let path = format!("/v1/schedules/{}/pause", url_encode(&name));
            change(conn, path, Some(PauseRequest { reason })).await
        }
        SchedulesCommand::Resume { conn, name } => {
            change(conn, format!("/v1/schedules/{}/resume", url_encode(&name)), None).await
        }
        SchedulesCommand::Remove { conn, name } => {
            let path = format!("/v1/schedules/{}", url_encode(&name));
            delete_and_say(&conn, &path, format!("schedule {} removed; its jobs stay", terminal_text(&name))).await
        }
        SchedulesCommand::Trigger { conn, name } => {
            let path = format!("/v1/schedules/{}/trigger", url_encode(&name));
            request_and_print(&conn, Method::POST, &path, None, |answer: TriggerAnswer| {
                let _ = writeln!(std::io::stdout(), "{}", answer.job.id);
            })
            .await
        }
    }
}

/// Pause or resume, and say what the schedule is now.
async fn change(conn: ConnArgs, path: String, pause: Option<PauseRequest>) -> Result<ExitStatus, CliError> {
    let json_out = conn.json;
    with_client(&conn, false, async move |client| {
        let changed = match &pause {
            Some(body) => client.send_json(Method::POST, &path, body).await?,
            None => client.json(Method::POST, &path, None).await?,
        };
        if json_out {
            return print_json(&changed).map(|()| ExitStatus::Success);
        }
        let s: ScheduleBody = typed(changed)?;
        let said = match (&s.paused, s.next_fire_at) {
            (Some(p), _) => format!("{} is paused since {}", terminal_text(&s.name), p.at),
            (None, Some(next)) => format!("{} is running; next firing {next}", terminal_text(&s.name)),
            (None, None) => format!("{} is running; its expression names no time to come", terminal_text(&s.name)),
        };
        let _ = writeln!(std::io::stdout(), "{said}");
        Ok(ExitStatus::Success)
    })
    .await
}

fn cadence_text(s: &ScheduleBody) -> String {
    match (&s.cron, &s.timezone, s.every) {
        (Some(cron), Some(zone), _) => format!("{} ({})", terminal_text(cron), terminal_text(zone)),
        (_, _, Some(every)) => format!("every {}", humantime::format_duration(every)),
        _ => "-".into(),
    }
}

fn print_schedule(s: &ScheduleBody) {
    let mut table = new_table(&["FIELD", "VALUE"]);
    let mut row = |field: &str, value: String| {
        table.add_row(vec![field.to_owned(), value]);
    };
    row("name", terminal_text(&s.name));
    row("id", s.id.to_string());
    row("when", cadence_text(s));
    row("overlap", s.overlap.as_str().to_owned());
    row("catch-up", s.catch_up.as_str().to_owned());
    row("job", terminal_text(&serde_json::to_string(&s.job).unwrap_or_default()));
    if let Some(p) = &s.paused {
        let by = p.by.as_deref().map(|b| format!(" by {}", terminal_text(b))).unwrap_or_default();
        let why = p.reason.as_deref().map(|r| format!(": {}", terminal_text(r))).unwrap_or_default();
        row("paused", format!("since {}{by}{why}", p.at));
    }
    if let Some(at) = s.last_fired_at {
        row("last firing", format!("{at}: {}", terminal_text(s.last_outcome.as_deref().unwrap_or("-"))));
    }
    row("fired", format!("{} jobs; {} firings submitted nothing", s.fired, s.skipped));
    row(
        "created",
        format!("{}{}", s.created_at, s.created_by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default()),
    );
    let upcoming: Vec<String> = s.upcoming.iter().map(ToString::to_string).collect();
    row("next firings", if upcoming.is_empty() { "-".into() } else { upcoming.join("\n") });
    print_table(table);
    if !s.recent.is_empty() {
        let mut runs = new_table(&["JOB", "STATUS", "SUBMITTED", "ENDED"]);
        for run in &s.recent {
            let status = match run.error_kind {
                Some(kind) => format!("{} ({})", run.status.as_str(), kind.as_str()),
                None => run.status.as_str().to_owned(),
            };
            let ended = run.finished_at.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
            runs.add_row(vec![run.id.to_string(), status, run.created_at.to_string(), ended]);
        }
        print_table(runs);
    }
}
