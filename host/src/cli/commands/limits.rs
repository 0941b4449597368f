//! `leash limits`: set, list, show and remove named rate limits. A job
//! names one with `leash submit --rate-limit NAME`.

use std::io::Write;

use axum::http::Method;
use clap::Subcommand;

use crate::api::rate_limits::{RateLimitList, RateLimitRequest};
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{delete_and_say, new_table, print_table, request_and_print, url_encode};
use crate::cli::{CliError, ExitStatus, terminal_text};
use crate::job::rate::{Rate, RateLimit};

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum LimitsCommand {
    /// Create a rate limit or change one (operate): jobs that name it
    /// start at most RATE, and granted requests matching its --host rules
    /// or carrying its --secret leave at most RATE, across every process
    /// on the store. Setting it again replaces its hosts and secrets.
    Set {
        #[command(flatten)]
        conn: ConnArgs,
        /// Its name (a-z, 0-9, '_', '.', '-').
        name: String,
        /// `COUNT/INTERVAL`: `50/s`, `1000/h`, `30/10s`, `5/min`.
        #[arg(value_parser = |s: &str| s.parse::<Rate>())]
        rate: Rate,
        /// Starts (or requests) that may come back to back (default 1:
        /// evenly spaced).
        #[arg(long)]
        burst: Option<u32>,
        /// Also limit the outbound requests of every job that this host
        /// rule matches, `[METHODS ]SCHEME://HOST[:PORT]`; repeat it for
        /// hosts sharing one quota (they share one bucket).
        #[arg(long = "host", value_name = "RULE")]
        hosts: Vec<String>,
        /// Also limit the outbound requests that carry this secret (a
        /// bucket for each secret: a quota per credential); repeatable.
        #[arg(long = "secret", value_name = "NAME")]
        secrets: Vec<String>,
    },
    /// List rate limits.
    List {
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Show a rate limit.
    Show {
        #[command(flatten)]
        conn: ConnArgs,
        /// The limit's name.
        name: String,
    },
    /// Remove a rate limit (operate): jobs that name it start unlimited
    /// from now on, and new ones naming it are refused.
    Remove {
        #[command(flatten)]
        conn: ConnArgs,
        /// The limit's name.
        name: String,
    },
}

/// `; requests to HOST, HOST, secret NAME` for a limit on outbound
/// requests, else nothing.
fn applies_to(limit: &RateLimit) -> String {
    let hosts = limit.hosts.iter().map(|h| terminal_text(&h.to_string()));
    let secrets = limit.secrets.iter().map(|s| format!("secret {s}"));
    let all: Vec<String> = hosts.chain(secrets).collect();
    if all.is_empty() { String::new() } else { format!("; requests to {}", all.join(", ")) }
}

fn path(name: &str) -> String {
    format!("/v1/rate-limits/{}", url_encode(name))
}

pub(in crate::cli) async fn limits(command: LimitsCommand) -> Result<ExitStatus, CliError> {
    match command {
        LimitsCommand::Set { conn, name, rate, burst, hosts, secrets } => {
            let request = RateLimitRequest { rate: rate.to_string(), burst, hosts, secrets };
            let body = serde_json::to_value(&request).map_err(|e| CliError::internal(e.to_string()))?;
            request_and_print(&conn, Method::PUT, &path(&name), Some(body), |set: RateLimit| {
                let _ = writeln!(
                    std::io::stdout(),
                    "rate limit {} set: {}, burst {}{}",
                    terminal_text(&set.name),
                    set.rate,
                    set.burst,
                    applies_to(&set)
                );
            })
            .await
        }
        LimitsCommand::List { conn } => {
            request_and_print(&conn, Method::GET, "/v1/rate-limits", None, |list: RateLimitList| {
                let mut table = new_table(&["NAME", "RATE", "BURST", "REQUESTS TO", "UPDATED", "BY"]);
                for l in &list.limits {
                    let to = applies_to(l);
                    table.add_row(vec![
                        terminal_text(&l.name),
                        l.rate.clone(),
                        l.burst.to_string(),
                        to.strip_prefix("; requests to ").map_or("-".to_owned(), str::to_owned),
                        l.updated_at.to_string(),
                        terminal_text(l.updated_by.as_deref().unwrap_or("-")),
                    ]);
                }
                print_table(table);
            })
            .await
        }
        LimitsCommand::Show { conn, name } => {
            request_and_print(&conn, Method::GET, &path(&name), None, |l: RateLimit| {
                let _ = writeln!(
                    std::io::stdout(),
                    "{}: {} (burst {}){}, set {} by {}",
                    terminal_text(&l.name),
                    l.rate,
                    l.burst,
                    applies_to(&l),
                    l.updated_at,
                    terminal_text(l.updated_by.as_deref().unwrap_or("-"))
                );
            })
            .await
        }
        LimitsCommand::Remove { conn, name } => {
            delete_and_say(&conn, &path(&name), format!("rate limit {} removed", terminal_text(&name))).await
        }
    }
}
