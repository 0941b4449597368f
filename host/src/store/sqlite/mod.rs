//! The embedded SQLite backend: one file, WAL, one writer thread.
//!
//! Every write goes to a single writer thread that drains whatever calls
//! are waiting and runs them in **one** transaction, then commits once and
//! answers every caller. A failing call undoes only its own changes (one
//! statement, or a savepoint for multi-statement writes), never the
//! others'. Under load this pays one fsync per batch
//! instead of one per state change; alone, a call commits at once. Reads
//! use a separate connection (WAL lets them run beside the writer), and
//! so do checkpoints, on a thread of their own (`checkpoint.rs`), so no
//! write waits for the WAL to be copied into the database file.
//!
//! Durability ([`Durability`]): `normal` (WAL + `synchronous=NORMAL`, the
//! default) survives a killed process — a committed change is in the WAL —
//! but the transactions since the last checkpoint may be lost on power
//! failure; `full`
//! (`synchronous=FULL`) also survives power loss, at one fsync per commit.
//!
//! Several processes may share one file: `BEGIN IMMEDIATE` and a busy
//! timeout serialise their writers; a busy database surfaces as a
//! transient [`StoreError`].

mod audit;
mod checkpoint;
mod claim;
mod effects;
mod events;
mod fate;
mod jobs;
mod labels;
mod leases;
mod migrations;
mod pauses;
mod plans;
mod plugins;
mod principals;
mod proposals;
mod rate_limits;
mod rows;
mod schedules;
mod schema;
mod sessions;
mod standing;
mod sweeps;
mod triggers;
mod workers;
mod writer;

use schema::{create_private, open_when_free};
use writer::{WriteOp, write_op, writer_loop};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::Connection;
use tokio::sync::watch;

use super::rate_limits::SlotAlarm;
use super::{Durability, StoreError};

/// The SQLite [`JobStore`](super::JobStore).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<WriteOp>>>,
    reader: Arc<Mutex<Connection>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Rings when a rate slot a claim here gave comes (the store's
    /// [`enqueued`](super::Leases::enqueued) signal).
    alarm: SlotAlarm,
    enqueued: watch::Receiver<u64>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel ends the writer thread after its last batch.
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl SqliteStore {
    /// Open (creating if needed) the database at `path` and migrate it.
    pub fn open(path: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        let path = path.as_ref().to_owned();
        create_private(&path)?;
        let (writer, reader) = open_when_free(&path, durability)?;
        let cannot_start = |what: &str, e: std::io::Error| StoreError::Invalid(format!("cannot start the {what}: {e}"));
        let (checkpoint, checkpointer) = checkpoint::start(schema::open_connection(&path, durability)?)
            .map_err(|e| cannot_start("checkpoint thread", e))?;
        let (tx, rx) = mpsc::channel::<WriteOp>();
        let thread = std::thread::Builder::new()
            .name("leash-sqlite-writer".into())
            .spawn(move || {
                writer_loop(writer, rx, move || {
                    let _ = checkpoint.try_send(());
                });
                // The writer's sender gone, the checkpointer ends too.
                let _ = checkpointer.join();
            })
            .map_err(|e| cannot_start("writer thread", e))?;
        let (signal, enqueued) = watch::channel(0);
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Mutex::new(Some(tx)),
                reader: Arc::new(Mutex::new(reader)),
                thread: Mutex::new(Some(thread)),
                alarm: SlotAlarm::new(signal),
                enqueued,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Run one statement's worth of work on the writer thread, in the next
    /// batch. A failing statement undoes only itself (SQLite's statement
    /// atomicity), so single-statement writes need no savepoint.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.enqueue_write(false, f).await
    }

    /// Like [`Self::write`], for work of several statements that must land
    /// together: it runs in its own savepoint, rolled back if it fails.
    /// Savepoints cost a sub-journal write per touched page, so only
    /// multi-statement writes use one.
    async fn write_all_or_nothing<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.enqueue_write(true, f).await
    }

    async fn enqueue_write<T: Send + 'static>(
        &self,
        savepoint: bool,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (op, answer) = write_op(savepoint, f);
        let sender = self.inner.writer.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(StoreError::Closed)?;
        sender.send(op).map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Run `f` on the read connection, off the async runtime.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let reader = self.inner.reader.clone();
        tokio::task::spawn_blocking(move || f(&reader.lock().unwrap_or_else(|e| e.into_inner())))
            .await
            .map_err(|_| StoreError::Closed)?
    }
}

#[cfg(test)]
mod tests;
