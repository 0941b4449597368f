//! `leash rules list|show|revoke`: standing approval rules ("Allow &
//! Remember"), which `leash jobs approve --remember` makes.

use std::io::Write as _;

use clap::Subcommand;
use reqwest::Method;

use crate::api::rules::RuleList;
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{new_table, print_json, print_table, short_digest, url_encode, with_client};
use crate::cli::{CliError, ExitStatus, terminal_text};
use crate::client::typed;
use crate::job::ApprovalRule;

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum RulesCommand {
    /// Standing rules, newest first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// Only rules this principal made.
        #[arg(long)]
        author: Option<String>,
        /// Only rules that still approve (not revoked, not expired).
        #[arg(long)]
        active: bool,
        /// Most rules to show.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One rule: what it approves, until when, and how often it has.
    Show {
        #[command(flatten)]
        conn: ConnArgs,
        /// The rule id (`rule_…`).
        id: String,
    },
    /// Revoke a rule: it approves nothing from now on (its author or an
    /// admin).
    Revoke {
        #[command(flatten)]
        conn: ConnArgs,
        /// The rule id (`rule_…`).
        id: String,
    },
}

pub(in crate::cli) async fn rules(command: RulesCommand) -> Result<ExitStatus, CliError> {
    match command {
        RulesCommand::List { conn, author, active, limit } => {
            let json_out = conn.json;
            let mut query = vec![format!("limit={limit}")];
            query.extend(author.map(|a| format!("author={}", url_encode(&a))));
            if active {
                query.push("active=true".into());
            }
            let path = format!("/v1/rules?{}", query.join("&"));
            with_client(&conn, false, async move |client| {
                let answer = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&answer).map(|()| ExitStatus::Success);
                }
                let list: RuleList = typed(answer)?;
                let mut table =
                    new_table(&["ID", "AUTHOR", "PLUGIN", "TARGET", "SUBMITTER", "EXPIRES", "STATE", "USES"]);
                for rule in &list.rules {
                    table.add_row(vec![
                        rule.id.clone(),
                        terminal_text(&rule.author),
                        short_digest(&rule.plugin.to_string()),
                        rule.target.to_string(),
                        rule.submitter.as_deref().map_or_else(|| "any".to_owned(), terminal_text),
                        rule.expires_at.to_string(),
                        state(rule).to_owned(),
                        rule.uses.to_string(),
                    ]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        RulesCommand::Show { conn, id } => {
            let json_out = conn.json;
            let path = format!("/v1/rules/{}", url_encode(&id));
            with_client(&conn, false, async move |client| {
                let answer = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&answer).map(|()| ExitStatus::Success);
                }
                show(&typed(answer)?);
                Ok(ExitStatus::Success)
            })
            .await
        }
        RulesCommand::Revoke { conn, id } => {
            let json_out = conn.json;
            let path = format!("/v1/rules/{}/revoke", url_encode(&id));
            with_client(&conn, false, async move |client| {
                let answer = client.post(&path, None::<&()>).await?;
                if json_out {
                    return print_json(&answer).map(|()| ExitStatus::Success);
                }
                let rule: ApprovalRule = typed(answer)?;
                let by = rule.revoked_by.as_deref().map_or_else(String::new, |b| format!(" by {}", terminal_text(b)));
                let _ = writeln!(std::io::stdout(), "{} revoked{by}", rule.id);
                Ok(ExitStatus::Success)
            })
            .await
        }
    }
}

/// `active`, `revoked` or `expired` (as of this machine's clock).
fn state(rule: &ApprovalRule) -> &'static str {
    match rule.revoked_at {
        Some(_) => "revoked",
        None if rule.active(crate::clock::Timestamp::now()) => "active",
        None => "expired",
    }
}

fn show(rule: &ApprovalRule) {
    let mut out = std::io::stdout();
    let name = rule.plugin_name.as_ref().map_or_else(String::new, |n| format!(" ({n})"));
    let lines = [
        format!("rule       {}", rule.id),
        format!("state      {}", state(rule)),
        format!("author     {}", terminal_text(&rule.author)),
        format!("made       {} from job {}", rule.created_at, rule.from_job),
        format!("expires    {}", rule.expires_at),
        format!("plugin     {}{name}", rule.plugin),
        format!("target     {}", rule.target),
        format!("submitter  {}", rule.submitter.as_deref().map_or_else(|| "any".to_owned(), terminal_text)),
        format!("input      sha256:{}", rule.input_sha256),
        format!("grants     {}", serde_json::to_string(&rule.grants).unwrap_or_default()),
        format!("uses       {}", rule.uses),
    ];
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    if let (Some(at), by) = (rule.revoked_at, rule.revoked_by.as_deref()) {
        let _ =
            writeln!(out, "revoked    {at}{}", by.map_or_else(String::new, |b| format!(" by {}", terminal_text(b))));
    }
}
