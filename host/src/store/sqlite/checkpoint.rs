//! Checkpoints off the writer's path.
//!
//! In WAL mode SQLite runs a checkpoint (copying the WAL's pages into the
//! database file, with an fsync of each) on the connection whose commit
//! takes the WAL past `wal_autocheckpoint` pages. Left to the writer
//! thread, every write waiting behind that commit waited for the copy:
//! measured at a thousand submits a second, a 20-44 ms stall of every
//! submit about every 700 jobs. So a thread of its own, on its own
//! connection, runs a `PASSIVE` checkpoint (it never waits for the writer
//! and the writer never waits for it) at most every [`EVERY`] while
//! writes come. The writer's own checkpoint stays set, and still runs:
//! the WAL file still peaks at its threshold (41 MB, as before), but the
//! writer's checkpoint no longer stalls the submits (measured:
//! `BENCHMARKS.md`, "SQLite checkpoints off the writer").

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// The least time between two checkpoints.
const EVERY: Duration = Duration::from_millis(100);

/// Start the checkpointer on `conn`: it checkpoints after commits it is
/// told of, and ends once every sender of `commits` is gone.
pub(super) fn start(conn: Connection) -> std::io::Result<(mpsc::SyncSender<()>, std::thread::JoinHandle<()>)> {
    let (told, commits) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new().name("leash-sqlite-checkpoint".into()).spawn(move || {
        let mut last: Option<Instant> = None;
        while commits.recv().is_ok() {
            if let Some(wait) = last.map(|at| EVERY.saturating_sub(at.elapsed())) {
                std::thread::sleep(wait);
            }
            // The commits told of while it waited are in this checkpoint.
            while commits.try_recv().is_ok() {}
            last = Some(Instant::now());
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::debug!(error = %e, "a background checkpoint failed; the writer's own is the backstop");
            }
        }
    })?;
    Ok((told, thread))
}
