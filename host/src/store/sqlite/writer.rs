//! The writer thread: it drains every waiting write, runs them in one
//! transaction (each in its own savepoint or statement), commits once and
//! answers every caller.

use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::clock::Timestamp;
use crate::store::StoreError;
use crate::store::sqlite::rows::db_err;

/// Most calls the writer commits in one transaction.
const MAX_WRITE_BATCH: usize = 512;

/// Called after the batch's commit with its result.
type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// A write: runs against the writer's connection (given none, it is
/// skipped: its batch could not start) and returns its completion.
pub(super) type WriteOp = Box<dyn FnOnce(Option<&Connection>) -> Completion + Send>;

/// A write for the writer thread, and where its answer arrives: `f`'s
/// result once its batch has committed, or why nothing was stored.
pub(super) fn write_op<T: Send + 'static>(
    savepoint: bool,
    f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
) -> (WriteOp, oneshot::Receiver<Result<T, StoreError>>) {
    let (reply, answer) = oneshot::channel();
    let op: WriteOp = Box::new(move |conn: Option<&Connection>| {
        let result = conn.map(|conn| if savepoint { in_savepoint(conn, f) } else { f(conn) });
        Box::new(move |committed: Result<(), StoreError>| {
            // A skipped write's batch always reports an error. When the
            // batch fails, a write that failed by itself says why.
            let _ = reply.send(match (committed, result) {
                (Ok(()), Some(result)) => result,
                (Ok(()), None) => Err(StoreError::Closed),
                (Err(_), Some(Err(own))) => Err(own),
                (Err(batch), _) => Err(batch),
            });
        })
    });
    (op, answer)
}

/// Run batches until every sender of `ops` is gone, calling `committed`
/// after each batch's commit.
pub(super) fn writer_loop(conn: Connection, ops: mpsc::Receiver<WriteOp>, committed: impl Fn()) {
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
        let mut completions: Vec<Completion> = Vec::with_capacity(batch.len());
        let mut lost = false;
        for op in batch {
            // A write that had no statement journal (see `CLAIM_ONE`) and
            // failed on I/O or a full disk makes SQLite roll back the whole
            // transaction: the writes after it would each commit alone
            // while the batch answered an error. They are skipped instead,
            // and every write of the batch answers that nothing was stored.
            completions.push(op((!lost).then_some(&conn)));
            lost = lost || (in_tx && conn.is_autocommit());
        }
        let committed = if lost {
            Err(StoreError::Database {
                operation: "writing",
                source: "SQLite rolled the batch's transaction back after a write in it failed; \
                         nothing in the batch was stored"
                    .into(),
                transient: true,
            })
        } else if in_tx {
            run("COMMIT").map_err(db_err("committing")).inspect(|()| committed()).inspect_err(|_| {
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
