//! `leash plugins`: add, list, show, grant, gate, pause and resume
//! registered plugins, and shrink a component file.

use std::io::Write;
use std::path::{Path, PathBuf};

use axum::http::Method;
use clap::Subcommand;
use serde_json::Value;

use crate::api::pauses::{PauseList, PauseRequest, ResumeAnswer};
use crate::api::types::PluginList;
use crate::cli::commands::ConnArgs;
use crate::cli::commands::connect::{new_table, print_json, print_table, short_digest, text, url_encode, with_client};
use crate::cli::{CliError, ExitStatus, GrantArgs, terminal_text};
use crate::client::{Client, typed};
use crate::job::{ApprovalPolicy, Grants, PluginInfo};
use crate::store::PluginPause;

#[derive(Debug, Subcommand)]
pub(in crate::cli) enum PluginsCommand {
    /// Validate, precompile and register a component.
    Add {
        #[command(flatten)]
        conn: ConnArgs,
        /// The component file (.wasm).
        file: PathBuf,
        /// Registry name (default: the file name without `.wasm`).
        #[arg(long)]
        name: Option<String>,
        /// Version (default 0.0.0). Adding a name@version again replaces it
        /// and keeps its grants; jobs already queued keep the bytes they were
        /// given.
        #[arg(long)]
        version: Option<String>,
        /// Grant jobs of this name@version what the flags say (replacing
        /// what it had). Without any grant flag, grants are left as they
        /// are (none, for a new name@version).
        #[command(flatten)]
        grants: GrantArgs,
        /// Jobs of this target wait for approval: `*`, `execute`, `apply`,
        /// `action:*` or `action:NAME` (repeat for more), set with the name
        /// in one step. Without it, a replaced name@version keeps its
        /// policy.
        #[arg(long, value_name = "TARGET")]
        require_approval: Vec<String>,
    },
    /// Replace which targets of a registered name@version wait for
    /// approval. Jobs submitted afterwards follow it; a submit can add a
    /// gate but never remove one the policy sets.
    Approval {
        #[command(flatten)]
        conn: ConnArgs,
        /// The registration: name@version.
        reference: String,
        /// A gated target: `*`, `execute`, `apply`, `action:*` or
        /// `action:NAME` (repeat for more; none gates nothing).
        #[arg(long, value_name = "TARGET")]
        require: Vec<String>,
        /// Distinct principals whose approvals a gated job takes (1 to 10).
        #[arg(long, default_value_t = 1, value_name = "N")]
        quorum: u32,
        /// Let the principal that submitted a gated job approve it too
        /// (by default it may not: separation of duties).
        #[arg(long)]
        allow_self_approval: bool,
    },
    /// Replace what jobs of a registered name@version may use outside
    /// their sandbox. Jobs submitted afterwards get the new grants; jobs
    /// already submitted keep theirs. With no `--allow-host`, every
    /// request of later jobs is denied.
    Grant {
        #[command(flatten)]
        conn: ConnArgs,
        /// The registration: name@version.
        reference: String,
        #[command(flatten)]
        grants: GrantArgs,
    },
    /// List registered plugins (a paused name says so).
    List {
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Pause a plugin name (every version): no worker claims its queued
    /// jobs until it is resumed; running jobs finish, new jobs queue. The
    /// pause is stored: it holds across restarts and on every process.
    Pause {
        #[command(flatten)]
        conn: ConnArgs,
        /// The plugin's name.
        name: String,
        /// Why (kept with the pause and in the audit trail).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused plugin name: its queued jobs run again, in their
    /// usual order.
    Resume {
        #[command(flatten)]
        conn: ConnArgs,
        /// The plugin's name.
        name: String,
    },
    /// Make a component file smaller without losing named backtraces:
    /// its function names move from the name sections into one compressed
    /// `leash:names` section, which leash reads when a job traps. Works
    /// on the file alone (no server); run it on a build's output before
    /// `plugins add`. Code, data and every other section are kept as they are.
    Shrink {
        /// The component file (.wasm).
        file: PathBuf,
        /// Where to write the smaller component (default: over FILE).
        #[arg(long, short = 'o', value_name = "FILE")]
        out: Option<PathBuf>,
        /// Print what changed as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one plugin: name, name@version or digest.
    Show {
        #[command(flatten)]
        conn: ConnArgs,
        /// The reference.
        reference: String,
    },
}

/// `leash plugins shrink`: read `file`, write the shrunk component to
/// `out` (through a temporary file, so `out` is whole or untouched).
fn shrink(file: &Path, out: &Path, json: bool) -> Result<ExitStatus, CliError> {
    let bytes = std::fs::read(file).map_err(|e| CliError::usage(format!("cannot read {}: {e}", file.display())))?;
    let shrunk = crate::sandbox::names::shrink(&bytes)
        .map_err(|e| CliError::usage(format!("cannot shrink {}: {e}", file.display())))?;
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let write = || -> std::io::Result<()> {
        let mut temp = tempfile::NamedTempFile::new_in(dir)?;
        // The file keeps its mode (a temporary file is made 0600).
        temp.as_file().set_permissions(std::fs::metadata(file)?.permissions())?;
        temp.write_all(&shrunk.bytes)?;
        temp.as_file().sync_all()?;
        temp.persist(out).map_err(|e| e.error)?;
        Ok(())
    };
    write().map_err(|e| CliError::usage(format!("cannot write {}: {e}", out.display())))?;
    if json {
        print_json(&serde_json::json!({
            "file": out.display().to_string(),
            "bytes_before": bytes.len(),
            "bytes_after": shrunk.bytes.len(),
            "names_bytes_before": shrunk.names_before,
            "names_bytes_after": shrunk.names_after,
            "functions": shrunk.functions,
        }))?;
    } else {
        let _ = writeln!(
            std::io::stdout(),
            "{}: {} -> {} bytes (names {} -> {} bytes, {} functions named)",
            out.display(),
            bytes.len(),
            shrunk.bytes.len(),
            shrunk.names_before,
            shrunk.names_after,
            shrunk.functions
        );
    }
    Ok(ExitStatus::Success)
}

/// From this size `plugins add` says it is compiling (an interpreter
/// inside: seconds, not milliseconds).
const BIG_COMPONENT_BYTES: usize = 4 << 20;

pub(in crate::cli) async fn plugins(command: PluginsCommand) -> Result<ExitStatus, CliError> {
    match command {
        PluginsCommand::Add { conn, file, name, version, grants, require_approval } => {
            let bytes =
                std::fs::read(&file).map_err(|e| CliError::usage(format!("cannot read {}: {e}", file.display())))?;
            let name = match name {
                Some(name) => name,
                None => file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            };
            let mut path = format!("/v1/plugins?name={}", url_encode(&name));
            if let Some(version) = &version {
                path.push_str(&format!("&version={}", url_encode(version)));
            }
            if !require_approval.is_empty() {
                path.push_str(&format!("&require_approval={}", url_encode(&require_approval.join(","))));
            }
            let json_out = conn.json;
            let grants = grants.grants_given();
            // An interpreter inside a component (Python, JavaScript) takes
            // seconds to compile: say so rather than block silently.
            let big = bytes.len() >= BIG_COMPONENT_BYTES && !json_out;
            if big {
                say!(
                    "leash: compiling {} ({:.1} MB) to machine code; a component this size takes a second or more \
                     the first time (a 19 MB Python one, about 1.6 s on 2 cores, with the quick baseline compiler; \
                     workers compile its optimized code behind its first jobs), then loads from the compile cache",
                    terminal_text(&name),
                    bytes.len() as f64 / 1e6
                );
            }
            let started = std::time::Instant::now();
            with_client(&conn, false, async move |client| {
                let mut info = client.upload(&path, bytes).await?;
                if big {
                    say!("leash: compiled and stored in {:.1} s", started.elapsed().as_secs_f64());
                }
                if let Some(grants) = grants {
                    let registered: PluginInfo = typed(info)?;
                    let name = registered.name.ok_or_else(|| CliError::internal("the registration has no name"))?;
                    info = put_grants(client, &name.to_string(), &grants).await?;
                }
                if json_out {
                    print_json(&info)?;
                } else {
                    let info: PluginInfo = typed(info)?;
                    let name = info.name.as_ref().map_or_else(|| "-".to_owned(), |n| terminal_text(&n.to_string()));
                    let _ = writeln!(std::io::stdout(), "{name} {} ({} bytes)", info.digest, info.size_bytes);
                    print_grants(&info);
                    print_policy(&info);
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        PluginsCommand::Approval { conn, reference, require, quorum, allow_self_approval } => {
            let json_out = conn.json;
            let path = format!("/v1/plugins/{}/approval", url_encode(&reference));
            with_client(&conn, false, async move |client| {
                let policy = ApprovalPolicy {
                    require: require.iter().map(|t| t.parse()).collect::<Result<_, _>>().map_err(CliError::usage)?,
                    separate_approver: !allow_self_approval,
                    quorum,
                };
                let info = client.send_json(Method::PUT, &path, &policy).await?;
                print_registration(info, json_out, print_policy)
            })
            .await
        }
        PluginsCommand::Grant { conn, reference, grants } => {
            let json_out = conn.json;
            let grants = grants.grants();
            with_client(&conn, false, async move |client| {
                let info = put_grants(client, &reference, &grants).await?;
                print_registration(info, json_out, print_grants)
            })
            .await
        }
        PluginsCommand::List { conn } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let list = client.json(Method::GET, "/v1/plugins", None).await?;
                if json_out {
                    return print_json(&list).map(|()| ExitStatus::Success);
                }
                let paused = paused_names(client).await?;
                let mut table = new_table(&["NAME", "VERSION", "DIGEST", "SIZE", "CREATED", "PAUSED"]);
                let list: PluginList = typed(list)?;
                for p in list.plugins {
                    let pause = p.name.as_ref().and_then(|n| paused.iter().find(|z| z.name == n.name));
                    let (name, version) = match p.name {
                        Some(n) => (terminal_text(&n.name), terminal_text(&n.version)),
                        None => ("-".to_owned(), "-".to_owned()),
                    };
                    table.add_row(vec![
                        name,
                        version,
                        short_digest(&p.digest.to_string()),
                        p.size_bytes.to_string(),
                        p.created_at.to_string(),
                        pause.map_or_else(String::new, |z| format!("since {}", z.paused_at)),
                    ]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        PluginsCommand::Pause { conn, name, reason } => {
            let json_out = conn.json;
            let path = format!("/v1/plugins/{}/pause", url_encode(&name));
            with_client(&conn, false, async move |client| {
                let pause = client.send_json(Method::POST, &path, &PauseRequest { reason }).await?;
                if json_out {
                    return print_json(&pause).map(|()| ExitStatus::Success);
                }
                let pause: PluginPause = typed(pause)?;
                let by = pause.paused_by.as_deref().map(|p| format!(" by {}", terminal_text(p))).unwrap_or_default();
                let why = pause.reason.as_deref().map(|r| format!(": {}", terminal_text(r))).unwrap_or_default();
                let _ = writeln!(
                    std::io::stdout(),
                    "{} is paused since {}{by}{why}",
                    terminal_text(&pause.name),
                    pause.paused_at
                );
                Ok(ExitStatus::Success)
            })
            .await
        }
        PluginsCommand::Resume { conn, name } => {
            let json_out = conn.json;
            let path = format!("/v1/plugins/{}/resume", url_encode(&name));
            with_client(&conn, false, async move |client| {
                let answer = client.json(Method::POST, &path, None).await?;
                if json_out {
                    return print_json(&answer).map(|()| ExitStatus::Success);
                }
                let answer: ResumeAnswer = typed(answer)?;
                let name = terminal_text(&name);
                let said = if answer.resumed {
                    format!("{name} is resumed: its queued jobs run again")
                } else {
                    format!("{name} was not paused: nothing changed")
                };
                let _ = writeln!(std::io::stdout(), "{said}");
                Ok(ExitStatus::Success)
            })
            .await
        }
        PluginsCommand::Shrink { file, out, json } => shrink(&file, out.as_deref().unwrap_or(&file), json),
        PluginsCommand::Show { conn, reference } => {
            let json_out = conn.json;
            let path = format!("/v1/plugins/{}", url_encode(&reference));
            with_client(&conn, false, async move |client| {
                let info = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&info).map(|()| ExitStatus::Success);
                }
                let mut table = new_table(&["FIELD", "VALUE"]);
                for key in ["name", "version", "digest", "size_bytes", "created_at"] {
                    table.add_row(vec![key.to_owned(), text(&info[key])]);
                }
                let info: PluginInfo = typed(info)?;
                table.add_row(vec!["grants".to_owned(), grants_text(&info.grants)]);
                table.add_row(vec!["approval".to_owned(), policy_text(&info)]);
                if let Some(requests) = &info.requests {
                    table.add_row(vec!["requests".to_owned(), requests_text(requests)]);
                    let effective = info.grants.within(requests);
                    table.add_row(vec!["jobs get".to_owned(), grants_text(&effective)]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
    }
}

/// The paused plugin names, as the store has them now.
pub(in crate::cli) async fn paused_names(client: &Client) -> Result<Vec<PluginPause>, CliError> {
    let list: PauseList = typed(client.json(Method::GET, "/v1/pauses", None).await?)?;
    Ok(list.pauses)
}

async fn put_grants(client: &Client, reference: &str, grants: &Grants) -> Result<serde_json::Value, CliError> {
    let path = format!("/v1/plugins/{}/grants", url_encode(reference));
    Ok(client.send_json(Method::PUT, &path, grants).await?)
}

/// One line per granted rule and range, or `nothing` (terminal-safe).
fn grants_text(grants: &Grants) -> String {
    let http = &grants.http;
    if http.hosts.is_empty() && http.private_ranges.is_empty() && http.secrets.is_empty() && grants.config.is_empty() {
        return "nothing".to_owned();
    }
    let mut lines: Vec<String> = http.hosts.iter().map(|h| format!("http {h}")).collect();
    lines.extend(http.private_ranges.iter().map(|r| format!("private range {r}")));
    for binding in &http.secrets {
        lines.extend(binding.hosts.iter().map(|h| format!("secret {} to {h}", binding.name)));
    }
    if http.safe_methods != crate::job::grant::DEFAULT_SAFE_METHODS {
        lines.push(format!("safe methods (not effects): {}", http.safe_methods.join(",")));
    }
    lines.extend(grants.config.iter().map(|(k, v)| format!("config {k}={v}")));
    let l = &http.limits;
    lines.push(format!(
        "at most {} requests, {} B out, {} B in, {} ms each",
        l.requests,
        l.request_bytes,
        l.response_bytes,
        l.request_timeout.as_millis()
    ));
    safe_lines(&lines)
}

/// Lines, each made terminal-safe, joined by newlines (a newline escaped
/// with the rest would print as `\n`).
fn safe_lines(lines: &[String]) -> String {
    lines.iter().map(|l| terminal_text(l)).collect::<Vec<_>>().join("\n")
}

/// What a component declares, one line per item (terminal-safe).
fn requests_text(requests: &crate::job::grant::Requests) -> String {
    let mut lines: Vec<String> = requests.hosts.iter().map(|h| format!("http {h}")).collect();
    lines.extend(requests.config.iter().map(|k| format!("config {k}")));
    lines.extend(requests.secrets.iter().map(|n| format!("secret {n}")));
    if lines.is_empty() {
        return "nothing".to_owned();
    }
    safe_lines(&lines)
}

fn print_grants(info: &PluginInfo) {
    for line in grants_text(&info.grants).lines() {
        let _ = writeln!(std::io::stdout(), "  grants {line}");
    }
    if let Some(requests) = &info.requests {
        for line in requests_text(requests).lines() {
            let _ = writeln!(std::io::stdout(), "  requests {line}");
        }
    }
}

/// The targets a registration gates, one line: `apply, action:deploy`.
fn policy_text(info: &PluginInfo) -> String {
    if info.approval.is_none() {
        return "none".to_owned();
    }
    let rules: Vec<String> = info.approval.require.iter().map(ToString::to_string).collect();
    terminal_text(&rules.join(", "))
}

fn print_policy(info: &PluginInfo) {
    let _ = writeln!(std::io::stdout(), "  approval required for {}", policy_text(info));
    let policy = &info.approval;
    if !policy.is_none() {
        let who = if policy.separate_approver { "not by its submitter" } else { "its submitter may approve" };
        let _ = writeln!(std::io::stdout(), "  approvals needed: {} ({who})", policy.quorum);
    }
}

/// A changed registration: as JSON, or its name and digest and then what
/// `detail` prints of it.
fn print_registration(info: Value, json_out: bool, detail: fn(&PluginInfo)) -> Result<ExitStatus, CliError> {
    if json_out {
        print_json(&info)?;
    } else {
        let info: PluginInfo = typed(info)?;
        let name = info.name.as_ref().map_or_else(|| "-".to_owned(), |n| terminal_text(&n.to_string()));
        let _ = writeln!(std::io::stdout(), "{name} {}", info.digest);
        detail(&info);
    }
    Ok(ExitStatus::Success)
}
