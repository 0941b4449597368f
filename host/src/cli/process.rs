//! What every long-running command does with its process: the
//! operational log, the signals that stop it, the compile cache's
//! default place.

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::cli::CliError;

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

/// SIGINT, registered before the plugin starts so an early Ctrl-C is seen.
pub(in crate::cli) fn interrupt_signal() -> Result<tokio::signal::unix::Signal, CliError> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| CliError::internal(format!("cannot listen for Ctrl-C: {e}")))
}
