//! The writer thread: it drains every waiting write, runs them in one
//! transaction (each in its own savepoint or statement), commits once and
//! answers every caller.

use super::*;

/// Most calls the writer commits in one transaction.
const MAX_WRITE_BATCH: usize = 512;

/// Called after the batch's commit with its result.
type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// A write: runs against the writer's connection (given none, it is
/// skipped: its batch could not start) and returns its completion.
pub(super) type WriteOp = Box<dyn FnOnce(Option<&Connection>) -> Completion + Send>;

pub(super) fn writer_loop(conn: Connection, ops: mpsc::Receiver<WriteOp>) {
    while let Ok(first) = ops.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_WRITE_BATCH {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let run = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([])).map(|_| ());
        let mut began = run("BEGIN IMMEDIATE").map_err(db_err("starting a write"));
        // The time the event triggers stamp this transaction's events with.
        // Not set, the transaction goes (events would carry an older time)
        // and the batch takes the path of a failed BEGIN below.
        if began.is_ok()
            && let Err(e) = set_event_clock(&conn)
        {
            let _ = run("ROLLBACK");
            began = Err(e);
        }
        // Another process held the write lock past the busy timeout: the
        // batch fails as transient and its callers retry. (Run one by one,
        // each write would wait out the timeout again.)
        if let Err(busy) = &began
            && busy.is_transient()
        {
            for op in batch {
                op(None)(Err(copy_error(busy)));
            }
            continue;
        }
        // Without an outer transaction each write commits by itself:
        // slower, but still correct, so another failed BEGIN is not fatal.
        let in_tx = began.is_ok();
        let completions: Vec<Completion> = batch.into_iter().map(|op| op(Some(&conn))).collect();
        let committed = if in_tx {
            run("COMMIT").map_err(db_err("committing")).inspect_err(|_| {
                let _ = run("ROLLBACK");
            })
        } else {
            Ok(())
        };
        for complete in completions {
            complete(committed.as_ref().map(|_| ()).map_err(copy_error));
        }
    }
}

/// Set the time this transaction's events carry: now, by this machine's
/// clock, in milliseconds since the epoch.
fn set_event_clock(conn: &Connection) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE event_clock SET at = ?1 WHERE id = 1")
        .and_then(|mut s| s.execute([Timestamp::now().unix_ms()]))
        .map(|_| ())
        .map_err(db_err("setting the event clock"))
}

/// The same error again, for each write of a batch that shares it.
fn copy_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Database { operation, source, transient } => {
            StoreError::Database { operation, source: source.to_string().into(), transient: *transient }
        }
        other => StoreError::Invalid(other.to_string()),
    }
}

/// Run `f` inside a savepoint: all of its changes land, or none do.
pub(super) fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    // Cached statements: parsing these on every call showed in profiles.
    let run = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([])).map(|_| ());
    let result = run("SAVEPOINT op").map_err(db_err("starting a savepoint")).and_then(|()| f(conn));
    let closed = match &result {
        Ok(_) => run("RELEASE op"),
        Err(_) => run("ROLLBACK TO op").and_then(|()| run("RELEASE op")),
    };
    result.and_then(|v| closed.map(|()| v).map_err(db_err("ending a savepoint")))
}
