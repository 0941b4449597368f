//! `leash serve`: the HTTP API, with a worker pool and the sweeps in a
//! supervised child process (see [`supervise`](super::supervise)) or in
//! its own (`--pool in-process`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::supervise::{PoolLink, Supervisor};
use super::worker::{build_runtime, worker_builder};
use crate::api::listen::ListenLimits;
use crate::api::{ApiConfig, router};
use crate::cli::commands::worker::worker_runtime;
use crate::cli::process::{init_logging, stop_signal};
use crate::cli::{CliError, ExitStatus, WorkerArgs, parse_duration, parse_size};
use crate::client::ensure_token_file;

#[derive(Debug, Args)]
pub(in crate::cli) struct ServeArgs {
    #[command(flatten)]
    worker: WorkerArgs,
    /// Address to listen on. Loopback unless told otherwise.
    #[arg(long, env = "LEASH_LISTEN", default_value = "127.0.0.1:7070")]
    listen: String,
    /// Where the API token is kept (created, mode 0600, on first start)
    /// when LEASH_API_TOKEN is not set. Default: `<db>.token`.
    #[arg(long, env = "LEASH_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The sync ceiling: the longest timeout an `"execution": "sync"`
    /// request may ask for (refused with 400 `sync_ceiling` above it), and
    /// the timeout of one that sets none when below `--job-timeout`. A sync
    /// job's timeout covers its queue wait and its run.
    #[arg(long, env = "LEASH_SYNC_TIMEOUT", value_parser = parse_duration, default_value = "60s")]
    sync_timeout: Duration,
    /// Largest request body (plugin uploads included); 413 above it.
    #[arg(long, env = "LEASH_MAX_BODY", value_parser = parse_size, default_value = "32MiB")]
    max_body: u64,
    /// Time a connection has to send a request's headers; an idle
    /// keep-alive connection is closed after the same time.
    #[arg(long, env = "LEASH_HEADER_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    header_timeout: Duration,
    /// Time an answer (or an event stream) may wait for its client to read
    /// before the connection is closed: a client that stops reading is
    /// dropped.
    #[arg(long, env = "LEASH_WRITE_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    write_timeout: Duration,
    /// Connections open at once; more are answered 503 and closed.
    #[arg(long, env = "LEASH_MAX_CONNECTIONS", default_value_t = crate::api::listen::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Where jobs run: `supervised` (a child process this server starts
    /// again when it dies, so a crash in a guest's run never takes the API
    /// down) or `in-process` (one process, as when embedding).
    #[arg(long, env = "LEASH_POOL", default_value = "supervised", value_parser = ["supervised", "in-process"])]
    pool: String,
}

pub(in crate::cli) async fn serve(args: ServeArgs) -> Result<ExitStatus, CliError> {
    init_logging(&args.worker.log_format)?;
    let token_file = args.token_file.clone().unwrap_or_else(|| args.worker.store.database().default_token_file());
    let (token, token_from) = match std::env::var("LEASH_API_TOKEN") {
        Ok(token) if !token.trim().is_empty() => (token.trim().to_owned(), "LEASH_API_TOKEN".to_owned()),
        _ => {
            let (token, created) = ensure_token_file(&token_file).map_err(CliError::usage)?;
            if created {
                tracing::info!("wrote a new API token to {}", token_file.display());
            }
            (token, token_file.display().to_string())
        }
    };
    raise_open_files_limit();
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| CliError::usage(format!("cannot listen on {}: {e}", args.listen)))?;
    let address = listener.local_addr().map_err(|e| CliError::internal(e.to_string()))?;
    let (runtime, supervisor) = if args.pool == "in-process" {
        (worker_runtime(&args.worker).await?, None)
    } else {
        let link = std::sync::Arc::new(PoolLink::default());
        let runtime = build_runtime(worker_builder(&args.worker)?.remote_pool(link.clone())).await?;
        let supervisor = Supervisor::start(link, runtime.clone(), args.worker.clone()).await?;
        (runtime, Some(supervisor))
    };
    let worker_id = supervisor.as_ref().map_or(runtime.worker_id(), |s| s.worker_id.as_str()).to_owned();
    let config = ApiConfig {
        token,
        sync_ceiling: args.sync_timeout,
        max_body_bytes: usize::try_from(args.max_body).unwrap_or(usize::MAX),
    };
    let app = router(runtime.clone(), config);
    let stop = stop_signal()?;
    tracing::info!(
        worker_id,
        "{worker_id} serving http://{address} with {} slots on {} ({})",
        args.worker.max_workers,
        args.worker.store.database(),
        if supervisor.is_some() { "pool in a supervised process" } else { "pool in this process" }
    );
    tracing::info!("dashboard: http://{address}/ui (sign in with the API token in {token_from})");
    // On a signal: stop accepting connections, shut the runtime down within
    // its budget, and drop requests still open (a sync wait must not hold
    // the process past the budget).
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let limits = ListenLimits {
        header_timeout: args.header_timeout,
        write_timeout: args.write_timeout,
        max_connections: args.max_connections,
    };
    let server = tokio::spawn(crate::api::listen::serve(listener, app, limits, async move {
        let _ = stop_rx.await;
    }));
    stop.await;
    let _ = stop_tx.send(());
    tracing::info!(budget = ?args.worker.shutdown_budget, "shutting down");
    runtime.shutdown().await;
    if let Some(supervisor) = supervisor {
        supervisor.stop().await;
    }
    server.abort();
    tracing::info!("stopped");
    Ok(ExitStatus::Success)
}

/// Raise the soft open-files limit to the hard one: each connection is a
/// descriptor, and the common soft default of 1024 is below the
/// connection cap. Best effort: a limit that cannot be raised stays.
pub(super) fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write `limit`, a live
    // local of the type they expect.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
