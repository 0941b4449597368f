//! `leash worker`: a worker pool and the sweeps until SIGINT or SIGTERM,
//! and the runtime, logging and signals it shares with `leash serve`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use super::run::interrupt_signal;
use super::supervise::run_pool_process;
use crate::cli::{CliError, ExitStatus, WorkerArgs, durability, load_secrets};
use crate::job::Backoff;
use crate::runtime::{Runtime, RuntimeBuilder};
use crate::sandbox::{Allocator, SandboxConfig};
use crate::worker::JobStarted;

/// `leash worker`'s arguments.
#[derive(Debug, Args)]
pub(in crate::cli) struct WorkerCommandArgs {
    #[command(flatten)]
    pub(in crate::cli) worker: WorkerArgs,
    /// Run as the pool process of the `leash serve` with this PID, taking
    /// its settings from stdin (what `leash serve` starts; not for use by
    /// hand).
    #[arg(long, hide = true, value_name = "PID")]
    supervised_by: Option<u32>,
}

/// A runtime with a worker pool and sweeps, as `worker` and `serve` run.
pub(in crate::cli) async fn worker_runtime(args: &WorkerArgs) -> Result<Runtime, CliError> {
    build_runtime(worker_builder(args)?).await
}

/// The builder of [`worker_runtime`], for callers that add to it.
pub(in crate::cli) fn worker_builder(args: &WorkerArgs) -> Result<RuntimeBuilder, CliError> {
    let cache_dir = args.cache_dir.clone().or_else(default_cache_dir);
    let slots = u32::try_from(args.max_workers).unwrap_or(u32::MAX).max(1);
    let mut builder = Runtime::builder(args.store.database());
    if let Some(path) = &args.start_log {
        // On the builder, so the first claims after a restart are logged too.
        let log = StartLog::open(path)?;
        builder = builder.on_start(move |start| log.record(start));
    }
    Ok(builder
        .durability(durability(&args.store)?)
        .sandbox(SandboxConfig {
            allocator: Allocator::Pooling { slots },
            cache_dir,
            secrets: load_secrets(args.secrets_file.as_deref())?,
            compile_nice: args.compile_nice,
            keep_resident_bytes: args.keep_resident,
            ..SandboxConfig::default()
        })
        .max_workers(args.max_workers)
        .poll_interval(args.poll_interval)
        .lease_ttl(args.lease_ttl)
        .job_ttl(args.job_ttl)
        .event_ttl(args.event_ttl)
        .cancel_grace(args.cancel_grace)
        .shutdown_budget(args.shutdown_budget)
        .queue_ttl(args.queue_ttl)
        .max_queued(args.max_queued)
        .guest_log_level(args.guest_logs.parse().ok())
        .guest_nice(args.guest_nice)
        .default_timeout(args.job_timeout)
        .max_timeout(args.max_timeout)
        .default_max_attempts(args.max_attempts)
        .free_rerun_limit(args.free_reruns)
        .approval_ttl(args.approval_ttl)
        .default_backoff(Backoff {
            base_ms: args.retry_backoff.as_millis() as u64,
            cap_ms: args.retry_backoff_cap.as_millis() as u64,
        }))
}

/// Build a runtime from the command line's settings.
pub(in crate::cli) async fn build_runtime(builder: RuntimeBuilder) -> Result<Runtime, CliError> {
    builder.build().await.map_err(|e| match e {
        crate::runtime::RuntimeError::InvalidJob(message) => {
            CliError::usage(format!("--retry-backoff/--retry-backoff-cap/--approval-ttl: {message}"))
        }
        other => CliError::internal(other.to_string()),
    })
}

/// `--start-log`: one line per guest start, appended by a single `write`
/// so lines from several processes never interleave. A process killed
/// right after keeps its line (it is in the kernel's page cache).
struct StartLog {
    file: std::fs::File,
    pid: u32,
}

impl StartLog {
    fn open(path: &Path) -> Result<StartLog, CliError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| CliError::usage(format!("cannot open the start log {}: {e}", path.display())))?;
        Ok(StartLog { file, pid: std::process::id() })
    }

    fn record(&self, start: &JobStarted) {
        let line = format!("{} {} {}\n", start.id, start.attempt, self.pid);
        if let Err(e) = (&self.file).write_all(line.as_bytes()) {
            tracing::warn!(error = %e, "cannot append to the start log");
        }
    }
}

/// Send the operational log (`tracing` events of `serve`, `worker` and the
/// runtime) to stderr as text or JSON lines, filtered by `LEASH_LOG`.
pub(in crate::cli) fn init_logging(format: &str) -> Result<(), CliError> {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("LEASH_LOG") {
        Ok(directives) if !directives.trim().is_empty() => EnvFilter::try_new(&directives).map_err(|e| {
            CliError::usage(format!("LEASH_LOG: {directives:?} is not a filter like `info,leash::guest=debug`: {e}"))
        })?,
        _ => EnvFilter::new("info"),
    };
    // A closed stderr (a log pipe whose reader went away) must not stop the
    // process: events are dropped, as `say!` drops its lines.
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).log_internal_errors(false);
    let installed = if format == "json" {
        builder.json().flatten_event(true).with_current_span(true).with_span_list(false).try_init()
    } else {
        builder.with_target(false).with_ansi(std::io::stderr().is_terminal()).try_init()
    };
    // Already installed (a second command in one process): keep it.
    let _ = installed;
    Ok(())
}

pub(in crate::cli) async fn run_worker(args: WorkerCommandArgs) -> Result<ExitStatus, CliError> {
    if let Some(supervisor) = args.supervised_by {
        return run_pool_process(supervisor).await;
    }
    let args = args.worker;
    init_logging(&args.log_format)?;
    let runtime = worker_runtime(&args).await?;
    let stop = stop_signal()?;
    tracing::info!(
        worker_id = runtime.worker_id(),
        "{} running {} slots on {}",
        runtime.worker_id(),
        args.max_workers,
        args.store.database()
    );
    stop.await;
    tracing::info!(budget = ?args.shutdown_budget, "shutting down");
    runtime.shutdown().await;
    tracing::info!("stopped");
    Ok(ExitStatus::Success)
}

/// `LEASH_CACHE_DIR`, else `$XDG_CACHE_HOME/leash`, else `~/.cache/leash`.
pub(in crate::cli) fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LEASH_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("leash"))
}

/// Resolves at the first SIGINT or SIGTERM. The handlers are installed
/// here, before the process says it is ready, so a signal sent after that
/// line is never taken by the default action.
pub(in crate::cli) fn stop_signal() -> Result<impl std::future::Future<Output = ()>, CliError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = interrupt_signal()?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| CliError::internal(format!("cannot listen for SIGTERM: {e}")))?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}
