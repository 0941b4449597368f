//! Reaching jobs: a server (`--server`, with its token) or the local
//! database, and the table and JSON printing the commands share.

use std::io::Write;

use axum::http::Method;
use comfy_table::{Table, presets};
use serde_json::Value;

use crate::cli::commands::ConnArgs;
use crate::cli::{CliError, ExitStatus, parse_duration};
use crate::client::{Client, read_token_file, typed};
use crate::runtime::Runtime;
use crate::sandbox::{Allocator, SandboxConfig};

/// The server-side job defaults for a command that queues on the local
/// database itself: the variables `leash worker` and `leash serve` read
/// (`LEASH_JOB_TIMEOUT`, `LEASH_MAX_TIMEOUT`, `LEASH_MAX_ATTEMPTS`,
/// `LEASH_FREE_RERUNS`, `LEASH_APPROVAL_TTL`, `LEASH_RETRY_BACKOFF`,
/// `LEASH_RETRY_BACKOFF_CAP`), so a job queued either way gets the same
/// defaults.
pub(super) fn local_job_defaults(
    mut builder: crate::runtime::RuntimeBuilder,
) -> Result<crate::runtime::RuntimeBuilder, CliError> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let duration = |name: &str| {
        var(name).map(|v| parse_duration(&v).map_err(|e| CliError::usage(format!("{name}: {e}")))).transpose()
    };
    if let Some(d) = duration("LEASH_JOB_TIMEOUT")? {
        builder = builder.default_timeout(d);
    }
    if let Some(d) = duration("LEASH_MAX_TIMEOUT")? {
        builder = builder.max_timeout(d);
    }
    if let Some(n) = var("LEASH_MAX_ATTEMPTS") {
        let n: u32 =
            n.trim().parse().ok().filter(|n| (1..=crate::job::MAX_ATTEMPTS_CEILING).contains(n)).ok_or_else(|| {
                CliError::usage(format!(
                    "LEASH_MAX_ATTEMPTS: {n:?} is not a number from 1 to {}",
                    crate::job::MAX_ATTEMPTS_CEILING
                ))
            })?;
        builder = builder.default_max_attempts(n);
    }
    if let Some(n) = var("LEASH_FREE_RERUNS") {
        let n: u32 = n.trim().parse().ok().filter(|n| *n <= crate::job::MAX_ATTEMPTS_CEILING).ok_or_else(|| {
            CliError::usage(format!(
                "LEASH_FREE_RERUNS: {n:?} is not a number from 0 to {}",
                crate::job::MAX_ATTEMPTS_CEILING
            ))
        })?;
        builder = builder.free_rerun_limit(n);
    }
    if let Some(d) = duration("LEASH_APPROVAL_TTL")? {
        builder = builder.approval_ttl(d);
    }
    let default = crate::job::Backoff::default();
    let base = duration("LEASH_RETRY_BACKOFF")?.unwrap_or(default.base);
    let cap = duration("LEASH_RETRY_BACKOFF_CAP")?.unwrap_or(default.cap);
    Ok(builder.default_backoff(crate::job::Backoff { base, cap }))
}

pub(super) async fn connect(conn: &ConnArgs, work: bool) -> Result<Client, CliError> {
    if let Some(server) = &conn.server {
        let token = match std::env::var("LEASH_API_TOKEN") {
            Ok(token) if !token.trim().is_empty() => token.trim().to_owned(),
            _ => {
                let file = conn.token_file.clone().unwrap_or_else(|| conn.store.database().default_token_file());
                read_token_file(&file).map_err(|e| {
                    CliError::usage(format!("no API token: set LEASH_API_TOKEN or pass --token-file ({e})"))
                })?
            }
        };
        return Ok(Client::remote(server, token)?);
    }
    let mut builder = Runtime::builder(conn.store.database()).durability(crate::cli::durability(&conn.store)?);
    builder = local_job_defaults(builder)?;
    builder = if work {
        let file = std::env::var_os("LEASH_SECRETS_FILE").map(std::path::PathBuf::from);
        builder.sandbox(SandboxConfig {
            allocator: Allocator::Pooling { slots: crate::runtime::DEFAULT_MAX_WORKERS as u32 },
            cache_dir: crate::cli::process::default_cache_dir(),
            secrets: crate::cli::load_secrets(file.as_deref())?,
            ..SandboxConfig::default()
        })
    } else {
        // `plugins add` compiles what it registers: into the cache the
        // workers on this machine read, so their first job does not wait.
        builder
            .sandbox(SandboxConfig { cache_dir: crate::cli::process::default_cache_dir(), ..SandboxConfig::default() })
            .without_workers()
    };
    let runtime = builder.build().await.map_err(|e| match e {
        crate::runtime::RuntimeError::InvalidJob(message) => {
            CliError::usage(format!("LEASH_RETRY_BACKOFF/LEASH_RETRY_BACKOFF_CAP: {message}"))
        }
        other => CliError::internal(other.to_string()),
    })?;
    // A principal's token in LEASH_API_TOKEN names whom to act as here
    // too; without one, whoever can open the database acts as the
    // bootstrap admin (a server token there means the same).
    Ok(match std::env::var("LEASH_API_TOKEN") {
        Ok(token) if crate::access::token_parts(token.trim()).is_some() => {
            Client::local_as(runtime, token.trim().to_owned())
        }
        _ => Client::local(runtime),
    })
}

/// Run `f` on a connection and close it (shutting down a local runtime)
/// whatever `f` returns.
pub(super) async fn with_client(
    conn: &ConnArgs,
    work: bool,
    f: impl AsyncFnOnce(&Client) -> Result<ExitStatus, CliError>,
) -> Result<ExitStatus, CliError> {
    let client = connect(conn, work).await?;
    let result = f(&client).await;
    client.close().await;
    result
}

/// Send one request (a JSON `body`, or none) and print its answer: as
/// JSON with `--json`, else read as `T` and told by `human`.
pub(super) async fn request_and_print<T: serde::de::DeserializeOwned>(
    conn: &ConnArgs,
    method: Method,
    path: &str,
    body: Option<Value>,
    human: impl FnOnce(T),
) -> Result<ExitStatus, CliError> {
    let json_out = conn.json;
    with_client(conn, false, async move |client| {
        let answer = client.json(method, path, body).await?;
        if json_out {
            return print_json(&answer).map(|()| ExitStatus::Success);
        }
        human(typed(answer)?);
        Ok(ExitStatus::Success)
    })
    .await
}

/// Send a `DELETE` and say `said` when it succeeds.
pub(super) async fn delete_and_say(conn: &ConnArgs, path: &str, said: String) -> Result<ExitStatus, CliError> {
    with_client(conn, false, async move |client| {
        client.send(Method::DELETE, path, None).await?;
        let _ = writeln!(std::io::stdout(), "{said}");
        Ok(ExitStatus::Success)
    })
    .await
}

pub(super) fn print_json(value: &Value) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)
        .map_err(|e| CliError::internal(e.to_string()))
        .and_then(|()| writeln!(stdout).map_err(|e| CliError::internal(e.to_string())))
}

pub(super) fn print_table(table: Table) {
    let _ = writeln!(std::io::stdout(), "{table}");
}

pub(super) fn new_table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(presets::NOTHING).set_header(header.iter().copied());
    table
}

/// A JSON value as one line for a table cell or a message. Strings may
/// come from a guest, so they are made safe for a terminal; other values
/// print as JSON, which escapes control characters already.
pub(super) fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => crate::cli::terminal_text(s),
        other => other.to_string(),
    }
}

/// A digest cut to its first 12 hex digits, for tables.
pub(super) fn short_digest(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

/// Percent-encode a query value.
pub(super) fn url_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}
