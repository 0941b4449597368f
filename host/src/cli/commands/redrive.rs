//! `leash jobs retry`: run ended jobs again, by id or by filter, with a
//! dry run first.

use std::io::Write;

use axum::http::Method;
use clap::Args;

use crate::api::redrive::RedriveRequest;
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{print_json, with_client};
use crate::cli::{CliError, ExitStatus, parse_duration};
use crate::client::typed;
use crate::clock::Timestamp;
use crate::job::{ErrorKind, JobStatus};
use crate::runtime::{RedriveRefused, RedriveReport};

/// Which ended jobs `leash jobs retry` takes when it names no ids.
#[derive(Debug, Args)]
pub(in crate::cli) struct RedriveFilter {
    /// Only jobs in these states, comma-separated: failed, cancelled
    /// (default: failed).
    #[arg(long)]
    status: Option<String>,
    /// Only jobs of this plugin: name, name@version or digest.
    #[arg(long)]
    plugin: Option<String>,
    /// Only jobs that ended with this error kind (timeout, guest_error, …).
    #[arg(long, value_name = "KIND")]
    error_kind: Option<ErrorKind>,
    /// Only jobs whose error holds this text, in any case.
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// Only jobs created since: a duration back from now (`1h`) or an
    /// RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
    /// Say what would be retried, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

impl RedriveFilter {
    fn given(&self) -> bool {
        self.status.is_some()
            || self.plugin.is_some()
            || self.error_kind.is_some()
            || self.error.is_some()
            || self.since.is_some()
    }

    fn request(&self) -> Result<RedriveRequest, CliError> {
        let status = match &self.status {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|s| s.trim().parse::<JobStatus>())
                .collect::<Result<_, _>>()
                .map_err(|e| CliError::usage(format!("--status: {e}")))?,
        };
        let created_after = match &self.since {
            None => None,
            Some(when) => Some(match parse_duration(when) {
                Ok(back) => Timestamp::now().minus(back),
                Err(_) => Timestamp::parse_rfc3339(when)
                    .map_err(|e| CliError::usage(format!("--since: neither a duration nor a time: {e}")))?,
            }),
        };
        Ok(RedriveRequest {
            status,
            plugin: self.plugin.clone(),
            error_kind: self.error_kind,
            error: self.error.clone(),
            created_after,
            dry_run: self.dry_run,
            limit: Some(500),
            ..RedriveRequest::default()
        })
    }
}

/// `leash jobs retry`: each id in turn, or every page a filter matches.
pub(super) async fn retry(conn: ConnArgs, ids: Vec<String>, filter: RedriveFilter) -> Result<ExitStatus, CliError> {
    match (ids.is_empty(), filter.given()) {
        (false, true) => return Err(CliError::usage("name job ids or a filter, not both")),
        (true, false) if !filter.dry_run => {
            return Err(CliError::usage(
                "name the jobs: their ids, or a filter (--status failed, --plugin, --error-kind, --error, --since)",
            ));
        }
        (false, false) if filter.dry_run => return Err(CliError::usage("--dry-run goes with a filter")),
        _ => {}
    }
    let json_out = conn.json;
    if !ids.is_empty() {
        return with_client(&conn, false, async move |client| {
            let mut answers = Vec::new();
            for id in &ids {
                let answer = client.json(Method::POST, &format!("/v1/jobs/{id}/retry"), None).await?;
                if !json_out {
                    let _ = writeln!(std::io::stdout(), "{id} queued again");
                }
                answers.push(answer);
            }
            if json_out {
                print_json(&serde_json::Value::Array(answers))?;
            }
            Ok(ExitStatus::Success)
        })
        .await;
    }
    let mut request = filter.request()?;
    with_client(&conn, false, async move |client| {
        let mut total = RedriveReport {
            dry_run: request.dry_run,
            matched: 0,
            retried: Vec::new(),
            refused: Vec::new(),
            next_before: None,
        };
        loop {
            let body = serde_json::to_value(&request).map_err(|e| CliError::internal(e.to_string()))?;
            let page: RedriveReport = typed(client.json(Method::POST, "/v1/jobs:retry", Some(body)).await?)?;
            total.matched += page.matched;
            total.retried.extend(page.retried);
            total.refused.extend(page.refused);
            match page.next_before {
                Some(before) => request.before = Some(before.to_string()),
                None => break,
            }
        }
        if json_out {
            print_json(&serde_json::to_value(&total).map_err(|e| CliError::internal(e.to_string()))?)?;
        } else {
            print_report(&total);
        }
        Ok(ExitStatus::Success)
    })
    .await
}

fn print_report(report: &RedriveReport) {
    let mut out = std::io::stdout().lock();
    let n = report.retried.len();
    let (verb, ids) =
        if report.dry_run { ("would retry", "would be queued again") } else { ("retried", "queued again") };
    let _ = writeln!(out, "{verb} {n} of {} matching jobs", report.matched);
    for id in report.retried.iter().take(20) {
        let _ = writeln!(out, "  {id} {ids}");
    }
    if n > 20 {
        let _ = writeln!(out, "  … and {} more (--json lists every one)", n - 20);
    }
    for RedriveRefused { id, why } in report.refused.iter().take(20) {
        let _ = writeln!(out, "  {id} not retried: {why}");
    }
    if report.dry_run && n > 0 {
        let _ = writeln!(out, "run it again without --dry-run to retry them");
    }
}
