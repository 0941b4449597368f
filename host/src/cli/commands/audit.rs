//! `leash audit list|verify`: the audit trail, and a check of its chain
//! made here, on the rows as the server (or the database) hands them over.

use std::io::Write as _;

use clap::Subcommand;
use reqwest::Method;

use crate::api::audit::AuditPage;
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{new_table, print_json, print_table, url_encode, with_client};
use crate::cli::{CliError, ExitStatus, terminal_text};
use crate::client::{Client, typed};
use crate::store::{AuditHead, verify_chain};

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum AuditCommand {
    /// Rows of the audit trail, oldest first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// Only rows after this sequence number.
        #[arg(long, value_name = "SEQ")]
        after: Option<i64>,
        /// Only rows by this principal.
        #[arg(long)]
        principal: Option<String>,
        /// Only rows of this action (job.approve, plugin.policy, token.revoke, …).
        #[arg(long)]
        action: Option<String>,
        /// Only rows about this target (a job id, name@version, a principal).
        #[arg(long)]
        target: Option<String>,
        /// Most rows to show.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Check the whole chain: every row follows the one before, names its
    /// hash, hashes to what it says, and the last is the kept head. Prints
    /// the head to record elsewhere; exits 10 where the chain breaks.
    Verify {
        #[command(flatten)]
        conn: ConnArgs,
    },
}

/// Rows read per request while verifying.
const VERIFY_PAGE: u32 = 500;

pub(in crate::cli) async fn audit(command: AuditCommand) -> Result<ExitStatus, CliError> {
    match command {
        AuditCommand::List { conn, after, principal, action, target, limit } => {
            let json_out = conn.json;
            let mut query = vec![format!("limit={limit}")];
            query.extend(after.map(|a| format!("after={a}")));
            for (key, value) in [("principal", principal), ("action", action), ("target", target)] {
                query.extend(value.map(|v| format!("{key}={}", url_encode(&v))));
            }
            let path = format!("/v1/audit?{}", query.join("&"));
            with_client(&conn, false, async move |client| {
                let page = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&page).map(|()| ExitStatus::Success);
                }
                let page: AuditPage = typed(page)?;
                let mut table = new_table(&["SEQ", "AT", "PRINCIPAL", "ACTION", "TARGET", "DETAIL"]);
                for row in &page.rows {
                    table.add_row(vec![
                        row.seq.to_string(),
                        row.at.to_string(),
                        row.principal.as_deref().map_or_else(|| "-".to_owned(), terminal_text),
                        terminal_text(&row.action),
                        terminal_text(&row.target),
                        terminal_text(&row.detail),
                    ]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        AuditCommand::Verify { conn } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| verify(client, json_out).await).await
        }
    }
}

/// Walk the chain page by page up to the head read first.
async fn verify(client: &Client, json_out: bool) -> Result<ExitStatus, CliError> {
    let head: AuditHead = typed(client.json(Method::GET, "/v1/audit/head", None).await?)?;
    let verdict = verify_chain(&head, async |after| -> Result<_, CliError> {
        let path = format!("/v1/audit?after={after}&limit={VERIFY_PAGE}");
        let page: AuditPage = typed(client.json(Method::GET, &path, None).await?)?;
        Ok(page.rows)
    })
    .await?;
    let mut out = std::io::stdout();
    match verdict {
        Ok(head) => {
            if json_out {
                print_json(&serde_json::json!({ "intact": true, "head": head }))?;
            } else {
                let rows = match head.pruned_seq {
                    0 => format!("{} rows", head.seq),
                    pruned => format!("rows {} to {} (those before deleted by retention)", pruned + 1, head.seq),
                };
                let _ = writeln!(out, "intact: {rows}; head {} {}", head.seq, head.hash);
            }
            Ok(ExitStatus::Success)
        }
        Err(e) => {
            if json_out {
                print_json(&serde_json::json!({ "intact": false, "seq": e.seq, "why": e.why }))?;
            } else {
                let _ = writeln!(out, "broken at row {}: {}", e.seq, e.why);
            }
            Ok(ExitStatus::AuditBroken)
        }
    }
}
