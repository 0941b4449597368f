//! `leash diagnostics`: every worker sharing the database, the queue and
//! the ceilings.

use std::io::Write;

use axum::http::Method;
use clap::Args;

use crate::api::types::HealthReport;
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{new_table, print_json, print_table, with_client};
use crate::cli::{CliError, ExitStatus, terminal_text};
use crate::client::typed;

#[derive(Debug, Args)]
pub(in crate::cli) struct DiagnosticsArgs {
    #[command(flatten)]
    conn: ConnArgs,
}

pub(in crate::cli) async fn diagnostics(args: DiagnosticsArgs) -> Result<ExitStatus, CliError> {
    let json_out = args.conn.json;
    with_client(&args.conn, false, async move |client| {
        let report = client.json(Method::GET, "/v1/health", None).await?;
        if json_out {
            return print_json(&report).map(|()| ExitStatus::Success);
        }
        let HealthReport { health, ceilings } = typed(report)?;
        let _ = writeln!(std::io::stdout(), "{}", terminal_text(&health.summary));
        let mut table = new_table(&["CHECK", "VALUE"]);
        let c = health.counts;
        let queue = format!(
            "waiting for approval {}, approved (waiting for a run) {}, queued {}, running {}, succeeded {}, \
             failed {}, cancelled {}, total {}",
            c.pending_approval,
            c.approved,
            c.queued,
            c.running,
            c.succeeded,
            c.failed,
            c.cancelled,
            c.total()
        );
        let rows = [
            ("target", client.target()),
            ("client version", env!("CARGO_PKG_VERSION").to_owned()),
            ("queue", queue),
            ("max timeout", format!("{} ms", ceilings.max_timeout.as_millis())),
            ("max memory", format!("{} bytes", ceilings.max_memory_bytes)),
            ("max output", format!("{} bytes", ceilings.max_output_bytes)),
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
        for view in health.workers {
            let w = view.worker;
            let state = if view.stale { format!("stale ({})", w.state.as_str()) } else { w.state.as_str().to_owned() };
            let jobs: Vec<String> = view.running_jobs.iter().map(ToString::to_string).collect();
            workers.add_row(vec![
                terminal_text(&w.worker_id),
                terminal_text(&w.host),
                w.pid.to_string(),
                state,
                w.slots.to_string(),
                w.running.to_string(),
                format!("{}/{}/{}", w.processed, w.failed, w.cancelled),
                w.last_heartbeat.to_string(),
                jobs.join(" "),
            ]);
        }
        print_table(workers);
        Ok(ExitStatus::Success)
    })
    .await
}
