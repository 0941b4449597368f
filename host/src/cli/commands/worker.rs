//! `leash worker`: a worker pool and the sweeps until SIGINT or SIGTERM,
//! and the runtime, logging and signals it shares with `leash serve`.

use std::io::Write;
use std::path::Path;

use clap::Args;

use crate::cli::process::{default_cache_dir, init_logging, stop_signal};
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
    pub(in crate::cli) supervised_by: Option<u32>,
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
    if let Some(ttl) = args.audit_ttl {
        builder = builder.audit_ttl(ttl);
    }
    if let Some(bytes) = args.shared_code_size {
        builder = builder.shared_code_bytes(bytes);
    }
    Ok(builder
        .durability(durability(&args.store)?)
        .sandbox(SandboxConfig {
            allocator: Allocator::Pooling { slots },
            cache_dir,
            secrets: load_secrets(args.secrets_file.as_deref())?,
            compile_nice: args.compile_nice,
            keep_resident_bytes: args.keep_resident,
            function_cache_bytes: args.function_cache_size,
            compiler: args.compiler.parse().map_err(CliError::usage)?,
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
        .default_backoff(Backoff { base: args.retry_backoff, cap: args.retry_backoff_cap }))
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

/// `leash worker` (by hand: `leash serve` starts its pool process with
/// [`super::supervise::run_pool_process`] instead).
pub(in crate::cli) async fn run_worker(args: WorkerArgs) -> Result<ExitStatus, CliError> {
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
