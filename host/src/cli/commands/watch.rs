//! `leash jobs watch`: print job and worker events as they happen, from
//! `GET /v1/events` on a server or on the local database (every process
//! sharing it feeds the stream). A dropped connection is resumed after the
//! last event printed, so nothing is skipped.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;

use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{short_digest, url_encode, with_client};
use crate::cli::{CliError, ExitStatus, terminal_text};
use crate::client::ClientError;
use crate::job::{Event, EventKind};

/// Pause before reconnecting after the stream broke; doubles to a cap.
const RECONNECT_DELAY: Duration = Duration::from_millis(250);
const RECONNECT_DELAY_CAP: Duration = Duration::from_secs(5);

/// What to watch.
#[derive(Debug, Args)]
pub(in crate::cli) struct WatchArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Only this job's events; the command ends when the job does.
    #[arg(long, value_name = "JOB_ID")]
    job: Option<String>,
    /// Only events of this plan's jobs.
    #[arg(long)]
    plan: Option<String>,
    /// Only events of this plugin's jobs: name, name@version or digest.
    #[arg(long)]
    plugin: Option<String>,
    /// Only job events that leave the job in one of these states
    /// (comma-separated: queued,running,succeeded,…).
    #[arg(long)]
    status: Option<String>,
    /// Start after this event id (as printed with `--json`) instead of now.
    #[arg(long, value_name = "EVENT_ID")]
    after: Option<String>,
}

pub(in crate::cli) async fn watch(args: WatchArgs) -> Result<ExitStatus, CliError> {
    let mut query = Vec::new();
    for (key, value) in [("job", &args.job), ("plan", &args.plan), ("plugin", &args.plugin), ("status", &args.status)] {
        if let Some(value) = value {
            query.push(format!("{key}={}", url_encode(value)));
        }
    }
    let path = if query.is_empty() { "/v1/events".to_owned() } else { format!("/v1/events?{}", query.join("&")) };
    let json_out = args.conn.json;
    let until = args.job.clone();
    let mut last = args.after.clone();
    with_client(&args.conn, false, async move |client| {
        let mut delay = RECONNECT_DELAY;
        loop {
            let headers: Vec<(&'static str, String)> = last.iter().map(|id| ("last-event-id", id.clone())).collect();
            let body = match client.open_stream(&path, &headers).await {
                Ok(body) => body,
                // Unreachable: the server restarts, say; anything else
                // (a bad filter, a wrong token) will not mend itself.
                Err(ClientError::Unreachable { url, detail }) => {
                    say!("leash: cannot reach {url} ({detail}); retrying in {delay:?}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RECONNECT_DELAY_CAP);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            delay = RECONNECT_DELAY;
            let mut frames = body.eventsource();
            while let Some(frame) = frames.next().await {
                let Ok(frame) = frame else { break };
                match frame.event.as_str() {
                    "missed" => say!("leash: events were deleted by retention before they were read; some are missing"),
                    "error" => {
                        say!("leash: the server's event stream stopped ({}); resuming", terminal_text(&frame.data))
                    }
                    _ => {
                        let event: Event = serde_json::from_str(&frame.data)
                            .map_err(|e| CliError::internal(format!("an event that does not parse: {e}")))?;
                        print_event(&event, json_out, &frame.data);
                        last = Some(frame.id.clone());
                        let ended = event.kind == EventKind::JobFinished
                            && event.job.as_ref().is_some_and(|j| Some(j.id.to_string()) == until);
                        if ended {
                            return Ok(ExitStatus::Success);
                        }
                    }
                }
            }
            say!("leash: the event stream was cut; resuming after the last event printed");
        }
    })
    .await
}

/// One line per event: its JSON as the server sent it, or a summary.
fn print_event(event: &Event, json_out: bool, data: &str) {
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{data}");
        return;
    }
    let line = match (&event.job, &event.worker) {
        (Some(job), _) => {
            let plugin = match &job.plugin {
                Some(name) => terminal_text(&name.to_string()),
                None => short_digest(&job.digest.to_string()),
            };
            let mut line = format!(
                "{} {:<21} {} {plugin} {} {} attempt {}",
                event.at,
                event.kind.as_str(),
                job.id,
                terminal_text(&job.target.to_string()),
                job.status,
                job.attempt
            );
            if let Some(kind) = job.error_kind {
                line.push_str(&format!(" ({kind})"));
            }
            if let (EventKind::JobProgress, Some(progress)) = (event.kind, &job.progress) {
                line.push_str(&format!(" {}/{} {}", progress.done, progress.total, terminal_text(&progress.note)));
            }
            line
        }
        (None, Some(worker)) => {
            format!("{} {:<21} {} {}", event.at, event.kind.as_str(), worker.id, worker.state.as_str())
        }
        (None, None) => format!("{} {}", event.at, event.kind.as_str()),
    };
    let _ = writeln!(out, "{line}");
}
