//! `leash run`: one component, once, with no store — the plugin author's
//! loop — and the report it prints.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use clap::Args;
use serde::Serialize;

use crate::cli::process::{default_cache_dir, interrupt_signal};
use crate::cli::{
    CliError, ExitStatus, GrantArgs, JobArgs, load_secrets, parse_duration, parse_size, read_input, terminal_lines,
    terminal_text, write_output,
};
use crate::job::grant::Grants;
use crate::job::{ErrorKind, Target};
use crate::job::{Proposal, ProposalView};
use crate::sandbox;
use crate::sandbox::http::{ApprovedEffects, EffectFence};
use crate::sandbox::{
    Allocator, Loaded, LogRecord, Outcome, Progress, RunLimits, RunObserver, RunRequest, Sandbox, SandboxConfig,
    StopHandle, Tier,
};

#[derive(Debug, Args)]
pub(in crate::cli) struct RunArgs {
    /// The component (.wasm) implementing leash:plugin@0.1.x.
    component: PathBuf,
    #[command(flatten)]
    job: JobArgs,
    /// Run the phase as a plan's: an execute run sends no effect and
    /// proposes them instead (listed on stderr, and in the `--json`
    /// report); an apply run sends only the proposals `--approved` names.
    #[arg(long)]
    plan: bool,
    /// With `--phase apply` (implies `--plan`): the approved proposals, as
    /// a JSON file (an execute run's `--json` report, or its `proposals`
    /// array); the run may send those, each once, and nothing else
    /// effectful.
    #[arg(long, value_name = "FILE")]
    approved: Option<PathBuf>,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Print the outcome as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    grants: GrantArgs,
}

/// How a run outside the store is limited, and the sandbox it runs in:
/// `leash run`'s and `leash dev`'s.
#[derive(Debug, Args)]
pub(super) struct SandboxArgs {
    /// Wall-clock limit, e.g. `30s`, `500ms`, `2m`, `1h`.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    timeout: Duration,
    /// Fuel budget (roughly, wasm instructions). Unlimited when absent.
    #[arg(long)]
    fuel: Option<u64>,
    /// Memory limit, e.g. `64MiB`, `1GiB`, or bytes.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    memory: u64,
    /// Largest output accepted, e.g. `1MiB`.
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    output_limit: u64,
    /// Time the plugin has to stop after Ctrl-C before it is stopped by force.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    cancel_grace: Duration,
    /// Compiled-component cache. Default: $LEASH_CACHE_DIR, else ~/.cache/leash.
    #[arg(long, env = "LEASH_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// A file of `NAME=value` lines (mode 0600) with the secrets granted
    /// plugins may send; `LEASH_SECRET_<NAME>` variables set them too.
    #[arg(long, env = "LEASH_SECRETS_FILE", value_name = "FILE")]
    secrets_file: Option<PathBuf>,
    /// Do not read or write the compiled-component cache (overrides
    /// `--cache-dir` and LEASH_CACHE_DIR).
    #[arg(long)]
    no_cache: bool,
    /// Which compiler makes the plugin's code: `tiered` (default: a large
    /// plugin compiled with the quick baseline compiler, Winch, and the
    /// optimizing one, Cranelift, behind it for the next run), `cranelift`
    /// or `winch` alone.
    #[arg(long, env = "LEASH_COMPILER", default_value = "tiered", value_parser = ["tiered", "cranelift", "winch"])]
    compiler: String,
}

impl SandboxArgs {
    /// A one-slot sandbox with the compile cache and secrets asked for;
    /// refuses a memory limit over the ceiling.
    pub(super) fn sandbox(&self) -> Result<Arc<Sandbox>, CliError> {
        if self.memory > sandbox::DEFAULT_MEMORY_CEILING_BYTES {
            return Err(CliError::usage(format!(
                "--memory {} is over the ceiling of {} bytes (1GiB)",
                self.memory,
                sandbox::DEFAULT_MEMORY_CEILING_BYTES
            )));
        }
        let cache_dir = if self.no_cache { None } else { self.cache_dir.clone().or_else(default_cache_dir) };
        let config = SandboxConfig {
            allocator: Allocator::Pooling { slots: 1 },
            cache_dir,
            secrets: load_secrets(self.secrets_file.as_deref())?,
            compiler: self.compiler.parse().map_err(CliError::usage)?,
            ..SandboxConfig::default()
        };
        Ok(Arc::new(Sandbox::new(config).map_err(|e| CliError::internal(e.to_string()))?))
    }

    /// The limits of one run.
    pub(super) fn limits(&self) -> RunLimits {
        RunLimits {
            timeout: self.timeout,
            fuel: self.fuel,
            memory_bytes: self.memory,
            output_bytes: self.output_limit,
            cancel_grace: self.cancel_grace,
            ..RunLimits::default()
        }
    }
}

/// What a component gets: as a durable job would, only what it both
/// declares (when it declares anything) and is granted.
pub(super) fn granted_to(bytes: &[u8], grants: Grants, component: &Path) -> Result<Grants, CliError> {
    match sandbox::declared_requests(bytes) {
        Ok(Some(requests)) => Ok(grants.within(&requests)),
        Ok(None) => Ok(grants),
        Err(e) => Err(CliError::usage(format!("{}: {e}", component.display()))),
    }
}

/// Prints guest logs to stderr as they arrive.
struct StderrLogs;

impl RunObserver for StderrLogs {
    fn on_log(&self, record: &LogRecord) {
        let fields: String =
            record.fields.iter().map(|(k, v)| format!(" {}={}", terminal_text(k), terminal_text(v))).collect();
        say!("[{}] {}{fields}", record.level.as_str(), terminal_text(&record.message));
    }

    fn on_progress(&self, _progress: &Progress) {}
}

pub(in crate::cli) async fn run_once(args: RunArgs) -> Result<ExitStatus, CliError> {
    let target = args.job.target()?;
    let sandbox = args.sandbox.sandbox()?;
    let grants = args.grants.grants();
    grants.check().map_err(CliError::usage)?;
    let bytes = std::fs::read(&args.component)
        .map_err(|e| CliError::usage(format!("cannot read {}: {e}", args.component.display())))?;
    let input = read_input(args.job.input.as_deref())?;

    let bytes = Arc::new(bytes);
    let plugin = match sandbox.compile(bytes.clone()).await {
        Ok(plugin) => plugin,
        Err(e) => {
            let message = format!("{}: {e}", args.component.display());
            if args.json {
                let refused = serde_json::json!({ "status": "refused", "error_kind": e.kind(), "message": message });
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{refused}");
            }
            return Err(CliError::usage(message));
        }
    };
    let grants = granted_to(&bytes, grants, &args.component)?;
    drop(bytes);

    let stop = StopHandle::new();
    let interrupts = tokio::spawn(stop_on_interrupt(stop.clone(), interrupt_signal()?));
    let loaded = plugin.loaded();
    if !args.json {
        let how = loaded.how();
        say!(
            "leash: {how} {} in {:.1} ms{}",
            args.component.display(),
            loaded.duration.as_secs_f64() * 1000.0,
            loaded.reuse_note()
        );
    }
    say!("leash: running {} ({})", args.component.display(), plugin.digest());
    let limits = args.sandbox.limits();
    // No lease, so no effect ledger: a one-shot run is neither fenced by a
    // lease nor recorded. As a plan's phase, an execute run proposes its
    // effects and an apply run sends only the approved ones.
    let mut request = RunRequest { grants: Arc::new(grants), ..RunRequest::new(target.clone(), input, limits) };
    let approved = match (&args.approved, &target) {
        (Some(file), Target::Apply) => Some(Arc::new(ApprovedEffects::new(read_approved(file)?, &BTreeSet::new()))),
        (Some(_), _) => return Err(CliError::usage("--approved goes with --phase apply")),
        (None, _) => None,
    };
    request.fence = plan_fence(args.plan, &target, approved.clone());
    let observer: Arc<dyn RunObserver> = if args.json { Arc::new(sandbox::NoObserver) } else { Arc::new(StderrLogs) };
    let mut outcome = sandbox.run(&plugin, request, &stop, observer).await;
    interrupts.abort();
    // Baseline code compiled for this run, written behind it: the next
    // run of the plugin loads it.
    sandbox.cached().await;
    if let Some(effects) = &approved {
        say!("leash: {}", effects.report().line());
        crate::worker::settle_apply(&mut outcome, effects);
    }
    report(&outcome, loaded, args.json)?;
    Ok(outcome.error_kind().map_or(ExitStatus::Success, ExitStatus::for_kind))
}

/// What a one-shot run may do with effects: as a plan's phase (`plan`, or
/// `approved` given), an execute run proposes them and an apply run sends
/// only the approved ones (none when none are given); else every granted
/// request may be sent.
pub(super) fn plan_fence(plan: bool, target: &Target, approved: Option<Arc<ApprovedEffects>>) -> EffectFence {
    match (approved, target) {
        (Some(effects), _) => EffectFence::Approved(effects),
        (None, Target::Execute) if plan => EffectFence::Propose,
        (None, Target::Apply) if plan => {
            EffectFence::Approved(Arc::new(ApprovedEffects::new(Vec::new(), &BTreeSet::new())))
        }
        _ => EffectFence::Open,
    }
}

/// The approved proposals in `file`: an execute run's `--json` report, or
/// its `proposals` array.
fn read_approved(file: &std::path::Path) -> Result<Vec<Proposal>, CliError> {
    let shown = file.display();
    let text = std::fs::read(file).map_err(|e| CliError::usage(format!("cannot read {shown}: {e}")))?;
    let value: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| CliError::usage(format!("{shown} is not JSON: {e}")))?;
    let list = if value.is_array() { value } else { value["proposals"].clone() };
    let views: Vec<ProposalView> = serde_json::from_value(list)
        .map_err(|e| CliError::usage(format!("{shown} holds no proposals (an execute run's --json report): {e}")))?;
    views
        .iter()
        .map(|v| {
            v.proposal()
                .ok_or_else(|| CliError::usage(format!("{shown}: proposal {}'s body does not match its digest", v.n)))
        })
        .collect()
}

/// First Ctrl-C: ask the plugin to stop. Second: stop it now.
async fn stop_on_interrupt(stop: StopHandle, mut interrupts: tokio::signal::unix::Signal) {
    if interrupts.recv().await.is_none() {
        return;
    }
    say!("leash: cancelling; press Ctrl-C again to stop the plugin now");
    stop.request();
    if interrupts.recv().await.is_some() {
        say!("leash: stopping the plugin now");
        stop.force();
    }
}

/// `leash run --json` prints one of these.
#[derive(Debug, Serialize)]
struct RunReport<'a> {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_kind: Option<ErrorKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backtrace: Option<&'a str>,
    retryable: bool,
    /// Output as text when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a str>,
    /// Output as base64 when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    output_base64: Option<String>,
    fuel_used: u64,
    peak_memory_bytes: u64,
    /// Making the component ready before the run: compiling it, or reading
    /// it from the compile cache (`compile_cached`).
    compile_ms: f64,
    compile_cached: bool,
    /// Which compiler made the code that ran: `baseline` (Winch, while
    /// Cranelift's code is not ready) or `optimized`.
    tier: Tier,
    /// A compile's functions found in the function cache, and compiled.
    #[serde(skip_serializing_if = "Option::is_none")]
    functions_reused: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    functions_compiled: Option<u64>,
    /// The run itself, instantiation included.
    duration_ms: f64,
    http_requests: u64,
    http_denied: u64,
    logs: &'a [LogRecord],
    logs_dropped: u64,
    stdout: String,
    /// Stdout bytes dropped past the capture cap.
    stdout_dropped: u64,
    stderr: String,
    /// Stderr bytes dropped past the capture cap.
    stderr_dropped: u64,
    /// An execute run's proposed effects (pass this report to an apply run
    /// as `--approved`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    proposals: Vec<ProposalView>,
}

pub(super) fn status_name(outcome: &Outcome) -> &'static str {
    match outcome.error_kind() {
        None => "succeeded",
        Some(ErrorKind::Cancelled) => "cancelled",
        Some(_) => "failed",
    }
}

fn report(outcome: &Outcome, loaded: Loaded, json: bool) -> Result<(), CliError> {
    let write_err = |e: std::io::Error| CliError::internal(format!("cannot write to stdout: {e}"));
    let failure = outcome.result.as_ref().err();
    if json {
        let output = outcome.result.as_deref().ok();
        let text = output.and_then(|o| std::str::from_utf8(o).ok());
        let report = RunReport {
            status: status_name(outcome),
            error_kind: failure.map(|f| f.kind),
            message: failure.map(|f| f.message.as_str()),
            backtrace: failure.and_then(|f| f.backtrace.as_deref()),
            retryable: failure.is_some_and(|f| f.retryable),
            output: text,
            output_base64: output
                .filter(|_| text.is_none())
                .map(|o| base64::engine::general_purpose::STANDARD.encode(o)),
            fuel_used: outcome.usage.fuel_used,
            peak_memory_bytes: outcome.usage.peak_memory_bytes,
            compile_ms: loaded.duration.as_secs_f64() * 1000.0,
            compile_cached: loaded.from_cache,
            tier: outcome.usage.tier,
            functions_reused: loaded.functions.map(|f| f.reused),
            functions_compiled: loaded.functions.map(|f| f.compiled),
            duration_ms: outcome.usage.duration.as_secs_f64() * 1000.0,
            http_requests: outcome.usage.http_requests,
            http_denied: outcome.usage.http_denied,
            logs: &outcome.logs,
            logs_dropped: outcome.logs_dropped,
            stdout: String::from_utf8_lossy(&outcome.stdout.bytes).into_owned(),
            stdout_dropped: outcome.stdout.dropped,
            stderr: String::from_utf8_lossy(&outcome.stderr.bytes).into_owned(),
            stderr_dropped: outcome.stderr.dropped,
            proposals: outcome.proposals.iter().map(|p| ProposalView::new(p, None, &[])).collect(),
        };
        let mut stdout = std::io::stdout().lock();
        serde_json::to_writer(&mut stdout, &report).map_err(|e| CliError::internal(e.to_string()))?;
        writeln!(stdout).map_err(write_err)?;
        return Ok(());
    }
    for (name, captured) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
        for line in terminal_lines(&String::from_utf8_lossy(&captured.bytes)) {
            say!("[guest {name}] {line}");
        }
        if captured.dropped > 0 {
            say!("[guest {name}] ... {} more bytes dropped", captured.dropped);
        }
    }
    if outcome.logs_dropped > 0 {
        say!("leash: {} log records dropped past the cap", outcome.logs_dropped);
    }
    for p in &outcome.proposals {
        say!("leash: proposed {} ({} bytes, {})", terminal_text(&p.shown()), p.body.len(), p.body_digest());
    }
    match &outcome.result {
        Ok(output) => write_output(output).map_err(write_err)?,
        Err(failure) => {
            say!("leash: {} ({}): {}", status_name(outcome), failure.kind, terminal_text(&failure.message));
            if let Some(backtrace) = &failure.backtrace {
                say!("guest backtrace:");
                for line in terminal_lines(backtrace) {
                    say!("{line}");
                }
            }
        }
    }
    say!(
        "leash: {} in {:.1} ms, fuel used {}, peak memory {} bytes",
        status_name(outcome),
        outcome.usage.duration.as_secs_f64() * 1000.0,
        outcome.usage.fuel_used,
        outcome.usage.peak_memory_bytes
    );
    let usage = &outcome.usage;
    if usage.http_requests + usage.http_denied > 0 {
        say!("leash: {} HTTP requests sent, {} denied", usage.http_requests, usage.http_denied);
    }
    Ok(())
}
