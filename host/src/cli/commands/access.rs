//! `leash principals`, `leash tokens` and `leash whoami`: who may call
//! the API, with which roles and tokens (admin), and who this command acts
//! as.

use std::io::Write;
use std::time::Duration;

use axum::http::Method;
use clap::Subcommand;

use crate::access::{Principal, PrincipalCeilings, Role, TokenRecord};
use crate::api::access::{PrincipalList, PrincipalRequest, TokenCreated, TokenList, TokenRequest};
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{new_table, print_json, print_table, url_encode, with_client};
use crate::cli::{CliError, ExitStatus, parse_duration, terminal_text};
use crate::client::typed;
use crate::job::millis;

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum PrincipalsCommand {
    /// Add a principal, or give an existing one these roles.
    Add {
        #[command(flatten)]
        conn: ConnArgs,
        /// Its name: lowercase letters, digits, `.`, `_`, `-`.
        name: String,
        /// A role: submit, approve, operate or admin (repeat for more).
        #[arg(long = "role", value_name = "ROLE", required = true)]
        roles: Vec<Role>,
        /// Longest timeout its jobs may ask for (e.g. 10m).
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        max_timeout: Option<Duration>,
        /// Most attempts its jobs may ask for.
        #[arg(long, value_name = "N")]
        max_attempts: Option<u32>,
        /// Longest queue TTL its jobs may ask for (e.g. 1h).
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        max_queue_ttl: Option<Duration>,
        /// Most of its jobs running at once, across every pool and replica.
        #[arg(long, value_name = "N")]
        max_running: Option<u32>,
    },
    /// List principals and their roles.
    List {
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Remove a principal: its tokens stop working at once.
    Remove {
        #[command(flatten)]
        conn: ConnArgs,
        /// The principal's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum TokensCommand {
    /// Create a token for a principal and print it: it is shown this once.
    Create {
        #[command(flatten)]
        conn: ConnArgs,
        /// Whose token: a principal's name.
        principal: String,
        /// What it is for.
        #[arg(long)]
        label: Option<String>,
        /// How long it works, e.g. `30d` (default: until revoked).
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        ttl: Option<Duration>,
    },
    /// List tokens (never their secrets), newest first.
    List {
        #[command(flatten)]
        conn: ConnArgs,
        /// Only this principal's.
        #[arg(long)]
        principal: Option<String>,
    },
    /// Revoke a token: refused from now on, everywhere.
    Revoke {
        #[command(flatten)]
        conn: ConnArgs,
        /// The token's id (`leash tokens list`).
        id: String,
    },
}

pub(in crate::cli) async fn principals(command: PrincipalsCommand) -> Result<ExitStatus, CliError> {
    match command {
        PrincipalsCommand::Add { conn, name, roles, max_timeout, max_attempts, max_queue_ttl, max_running } => {
            let json_out = conn.json;
            let path = format!("/v1/principals/{}", url_encode(&name));
            let ceilings = PrincipalCeilings {
                max_timeout_ms: max_timeout.map(millis::of),
                max_attempts,
                max_queue_ttl_ms: max_queue_ttl.map(millis::of),
                max_running,
            };
            with_client(&conn, false, async move |client| {
                let body = PrincipalRequest { roles: roles.into_iter().collect(), ceilings };
                let stored = client.send_json(Method::PUT, &path, &body).await?;
                if json_out {
                    return print_json(&stored).map(|()| ExitStatus::Success);
                }
                let principal: Principal = typed(stored)?;
                say(&format!("{} {}", principal.name, roles_text(&principal)));
                Ok(ExitStatus::Success)
            })
            .await
        }
        PrincipalsCommand::List { conn } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let list = client.json(Method::GET, "/v1/principals", None).await?;
                if json_out {
                    return print_json(&list).map(|()| ExitStatus::Success);
                }
                let list: PrincipalList = typed(list)?;
                let mut table = new_table(&["NAME", "ROLES", "CEILINGS", "ADDED"]);
                for p in &list.principals {
                    let row =
                        [terminal_text(&p.name), roles_text(p), ceilings_text(&p.ceilings), p.created_at.to_string()];
                    table.add_row(row.to_vec());
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        PrincipalsCommand::Remove { conn, name } => {
            let path = format!("/v1/principals/{}", url_encode(&name));
            with_client(&conn, false, async move |client| {
                client.act(Method::DELETE, &path).await?;
                say(&format!("removed {name}; its tokens no longer work"));
                Ok(ExitStatus::Success)
            })
            .await
        }
    }
}

pub(in crate::cli) async fn tokens(command: TokensCommand) -> Result<ExitStatus, CliError> {
    match command {
        TokensCommand::Create { conn, principal, label, ttl } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let created = client.post("/v1/tokens", Some(&TokenRequest { principal, label, ttl })).await?;
                if json_out {
                    return print_json(&created).map(|()| ExitStatus::Success);
                }
                let created: TokenCreated = typed(created)?;
                say(&created.token);
                eprintln!(
                    "leash: token {} for {}: it is shown this once; send it as LEASH_API_TOKEN or \
                     `Authorization: Bearer`",
                    created.record.id, created.record.principal
                );
                Ok(ExitStatus::Success)
            })
            .await
        }
        TokensCommand::List { conn, principal } => {
            let json_out = conn.json;
            let path = match &principal {
                Some(p) => format!("/v1/tokens?principal={}", url_encode(p)),
                None => "/v1/tokens".to_owned(),
            };
            with_client(&conn, false, async move |client| {
                let list = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&list).map(|()| ExitStatus::Success);
                }
                let list: TokenList = typed(list)?;
                let mut table = new_table(&["ID", "PRINCIPAL", "LABEL", "CREATED", "EXPIRES", "REVOKED"]);
                for t in &list.tokens {
                    table.add_row(token_row(t));
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        TokensCommand::Revoke { conn, id } => {
            let path = format!("/v1/tokens/{}/revoke", url_encode(&id));
            with_client(&conn, false, async move |client| {
                client.act(Method::POST, &path).await?;
                say(&format!("revoked {id}"));
                Ok(ExitStatus::Success)
            })
            .await
        }
    }
}

/// `leash whoami`: the principal this command's token stands for.
pub(in crate::cli) async fn whoami(conn: ConnArgs) -> Result<ExitStatus, CliError> {
    let json_out = conn.json;
    with_client(&conn, false, async move |client| {
        let me = client.json(Method::GET, "/v1/whoami", None).await?;
        if json_out {
            return print_json(&me).map(|()| ExitStatus::Success);
        }
        let me: Principal = typed(me)?;
        say(&format!("{} {}", me.name, roles_text(&me)));
        Ok(ExitStatus::Success)
    })
    .await
}

fn roles_text(p: &Principal) -> String {
    p.roles.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(",")
}

/// A principal's own ceilings, those it has (`-`: the server's alone).
fn ceilings_text(c: &PrincipalCeilings) -> String {
    let duration = |ms: u64| humantime::format_duration(Duration::from_millis(ms)).to_string();
    let said: Vec<String> = [
        c.max_timeout_ms.map(|ms| format!("timeout {}", duration(ms))),
        c.max_attempts.map(|n| format!("attempts {n}")),
        c.max_queue_ttl_ms.map(|ms| format!("queue {}", duration(ms))),
        c.max_running.map(|n| format!("running {n}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if said.is_empty() { "-".to_owned() } else { said.join(", ") }
}

fn token_row(t: &TokenRecord) -> Vec<String> {
    let when = |at: Option<crate::clock::Timestamp>| at.map_or_else(|| "-".to_owned(), |t| t.to_string());
    vec![
        t.id.clone(),
        terminal_text(&t.principal),
        t.label.as_deref().map_or_else(|| "-".to_owned(), terminal_text),
        t.created_at.to_string(),
        when(t.expires_at),
        when(t.revoked_at),
    ]
}

fn say(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}
