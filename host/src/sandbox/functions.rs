//! Cranelift's incremental compilation cache, on disk: compiled functions
//! keyed by a hash of their body and the target, so a component that
//! shares most of its code with one compiled before (a second Python
//! plugin: the same interpreter; a rebuilt plugin) compiles only the
//! functions that changed.
//!
//! The entries live in one SQLite file, `functions.db`, in the compile
//! cache's folder for this engine configuration. What a compile adds is
//! kept in memory and written in one transaction when the compile ends
//! ([`FunctionCache::flush`]), with the hits' last use; the file is then
//! cut back to its byte bound, least recently used first. Each value is
//! stored with the sha256 of its key and bytes: a value that does not match
//! is a miss (and is dropped), never loaded; a file SQLite calls corrupt,
//! or that is not a database at all, is removed and started again empty.
//! Nothing here is an error to a compile: at worst it compiles everything.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest as _, Sha256};

/// The file, inside the compile cache's folder for an engine.
const FILE: &str = "functions.db";

/// How long a write waits for another process sharing the folder.
const BUSY_WAIT: Duration = Duration::from_secs(2);

/// An eviction cuts the file to this share of its bound, so that the next
/// compiles do not each evict again.
const EVICT_TO_PERCENT: u64 = 90;

/// Compiled functions on disk, shared by every compile of one engine.
#[derive(Debug)]
pub(crate) struct FunctionCache {
    /// Set once the engine (and with it the folder) is known.
    path: OnceLock<PathBuf>,
    max_bytes: u64,
    db: Mutex<Db>,
    added: Mutex<Added>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Debug, Default)]
enum Db {
    #[default]
    Closed,
    Open(Connection),
    /// Could not be opened, even after starting the file again: every
    /// lookup is a miss.
    Unusable,
}

/// What the running compiles found and made, written at the next flush.
#[derive(Debug, Default)]
struct Added {
    new: HashMap<Vec<u8>, Vec<u8>>,
    used: Vec<Vec<u8>>,
    bad: Vec<Vec<u8>>,
}

/// Function lookups of the compiles since the sandbox was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionCounts {
    /// Functions found compiled.
    pub reused: u64,
    /// Functions compiled.
    pub compiled: u64,
}

impl FunctionCounts {
    /// The lookups made since `before` was read.
    pub(crate) fn since(self, before: FunctionCounts) -> FunctionCounts {
        FunctionCounts { reused: self.reused - before.reused, compiled: self.compiled - before.compiled }
    }
}

impl FunctionCache {
    /// A cache of at most `max_bytes` of compiled functions; its folder is
    /// given later by [`FunctionCache::place`].
    pub(crate) fn new(max_bytes: u64) -> Self {
        FunctionCache {
            path: OnceLock::new(),
            max_bytes,
            db: Mutex::default(),
            added: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Keep the file in `dir` (the compile cache's folder for the engine).
    pub(crate) fn place(&self, dir: &Path) {
        let _ = self.path.set(dir.join(FILE));
    }

    /// Lookups so far: how much of the compiles was reused.
    pub(crate) fn counts(&self) -> FunctionCounts {
        FunctionCounts { reused: self.hits.load(Ordering::Relaxed), compiled: self.misses.load(Ordering::Relaxed) }
    }

    /// Run `f` on the open database; `None` when it cannot be opened. A
    /// corrupt file is removed and opened again, empty.
    fn with_db<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Option<T> {
        let path = self.path.get()?;
        let mut db = self.db.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*db, Db::Closed) {
            *db = match open(path) {
                Ok(conn) => Db::Open(conn),
                Err(e) if is_corrupt(&e) => restart(path),
                Err(e) => {
                    tracing::debug!(error = %e, path = %path.display(), "the function cache cannot be opened");
                    Db::Unusable
                }
            };
        }
        let Db::Open(conn) = &mut *db else { return None };
        match f(conn) {
            Ok(value) => Some(value),
            Err(e) => {
                if is_corrupt(&e) {
                    tracing::warn!(error = %e, path = %path.display(), "the function cache is corrupt: starting it again");
                    // Close it before its files are removed.
                    *db = Db::Closed;
                    *db = restart(path);
                } else {
                    tracing::debug!(error = %e, "the function cache did not answer");
                }
                None
            }
        }
    }

    /// Write what the compiles since the last flush made and used, then
    /// keep the file within its bound. Best effort: what cannot be written
    /// is compiled again next time.
    pub(crate) fn flush(&self) {
        let added = std::mem::take(&mut *self.added.lock().unwrap_or_else(|e| e.into_inner()));
        if added.new.is_empty() && added.used.is_empty() && added.bad.is_empty() {
            return;
        }
        let max_bytes = self.max_bytes;
        self.with_db(|conn| {
            let tx = conn.transaction()?;
            // Last uses are counted in flushes, not read off a clock.
            let now: i64 = tx.query_row("SELECT COALESCE(MAX(used_at), 0) + 1 FROM functions", [], |row| row.get(0))?;
            {
                let mut insert = tx.prepare_cached(
                    "INSERT OR REPLACE INTO functions (key, bytes, used_at, checksum, value) VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                for (key, value) in &added.new {
                    insert.execute(params![key, value.len() as i64, now, checksum(key, value).as_slice(), value])?;
                }
                let mut touch = tx.prepare_cached("UPDATE functions SET used_at = ?2 WHERE key = ?1")?;
                for key in &added.used {
                    touch.execute(params![key, now])?;
                }
                let mut drop = tx.prepare_cached("DELETE FROM functions WHERE key = ?1")?;
                for key in &added.bad {
                    drop.execute(params![key])?;
                }
            }
            evict(&tx, max_bytes)?;
            tx.commit()
        });
    }
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        // Made by a compile still running, or one not yet flushed.
        let made = self.added.lock().unwrap_or_else(|e| e.into_inner()).new.get(key).cloned();
        if let Some(value) = made {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(Cow::Owned(value));
        }
        let found = self
            .with_db(|conn| {
                conn.prepare_cached("SELECT checksum, value FROM functions WHERE key = ?1")?
                    .query_row([key], |row| Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?)))
                    .optional()
            })
            .flatten();
        let mut added = self.added.lock().unwrap_or_else(|e| e.into_inner());
        match found {
            Some((sum, value)) if sum == checksum(key, &value).as_slice() => {
                added.used.push(key.to_vec());
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(Cow::Owned(value))
            }
            Some(_) => {
                // Altered on disk: never handed to the compiler.
                added.bad.push(key.to_vec());
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        self.added.lock().unwrap_or_else(|e| e.into_inner()).new.insert(key.to_vec(), value);
        true
    }
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_WAIT)?;
    // A cache: losing the last writes to a power cut costs a recompile, and
    // a file left damaged is detected and started again.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS functions (
             key BLOB NOT NULL UNIQUE,
             bytes INTEGER NOT NULL,
             used_at INTEGER NOT NULL,
             checksum BLOB NOT NULL,
             value BLOB NOT NULL
         );
         CREATE INDEX IF NOT EXISTS functions_used_at ON functions (used_at);",
    )?;
    Ok(conn)
}

/// Remove the file and open it again, empty.
fn restart(path: &Path) -> Db {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
    match open(path) {
        Ok(conn) => Db::Open(conn),
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "the function cache cannot be started again: compiling without it");
            Db::Unusable
        }
    }
}

fn is_corrupt(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase))
}

/// Delete the least recently used entries until the file holds at most
/// [`EVICT_TO_PERCENT`] of `max_bytes`, when it holds more than `max_bytes`.
fn evict(tx: &rusqlite::Transaction<'_>, max_bytes: u64) -> rusqlite::Result<()> {
    let total: i64 = tx.query_row("SELECT COALESCE(SUM(bytes), 0) FROM functions", [], |row| row.get(0))?;
    let total = u64::try_from(total).unwrap_or(0);
    if total <= max_bytes {
        return Ok(());
    }
    let target = max_bytes / 100 * EVICT_TO_PERCENT;
    let mut over = total - target;
    let mut oldest = tx.prepare("SELECT rowid, bytes FROM functions ORDER BY used_at, rowid")?;
    let mut rows = oldest.query([])?;
    let mut doomed = Vec::new();
    while over > 0
        && let Some(row) = rows.next()?
    {
        doomed.push(row.get::<_, i64>(0)?);
        over = over.saturating_sub(u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0));
    }
    drop(rows);
    let mut delete = tx.prepare_cached("DELETE FROM functions WHERE rowid = ?1")?;
    for rowid in doomed {
        delete.execute([rowid])?;
    }
    Ok(())
}

fn checksum(key: &[u8], value: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update((key.len() as u64).to_le_bytes());
    hasher.update(key);
    hasher.update(value);
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use wasmtime::CacheStore as _;

    use super::*;

    fn cache(dir: &Path, max_bytes: u64) -> FunctionCache {
        let cache = FunctionCache::new(max_bytes);
        cache.place(dir);
        cache
    }

    fn key(n: u8) -> Vec<u8> {
        vec![n; 32]
    }

    /// A file on the folder holding one entry, `key(1)`.
    fn one_entry_written(dir: &Path) {
        let first = cache(dir, 1 << 20);
        first.insert(&key(1), b"code one".to_vec());
        first.flush();
    }

    /// The rows in the file and their bytes.
    fn stored(dir: &Path) -> (i64, i64) {
        Connection::open(dir.join(FILE))
            .unwrap()
            .query_row("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM functions", [], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .unwrap()
    }

    #[test]
    fn what_a_compile_adds_is_found_by_the_next_cache_on_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let first = cache(dir.path(), 1 << 20);
        assert!(first.get(&key(1)).is_none());
        assert!(first.insert(&key(1), b"code one".to_vec()));
        // Before the flush, from memory.
        assert_eq!(first.get(&key(1)).as_deref(), Some(&b"code one"[..]));
        first.flush();
        let second = cache(dir.path(), 1 << 20);
        assert_eq!(second.get(&key(1)).as_deref(), Some(&b"code one"[..]));
        assert!(second.get(&key(2)).is_none());
        assert_eq!(second.counts(), FunctionCounts { reused: 1, compiled: 1 });
    }

    #[test]
    fn an_altered_value_is_a_miss_and_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        one_entry_written(dir.path());
        let conn = Connection::open(dir.path().join(FILE)).unwrap();
        conn.execute("UPDATE functions SET value = ?1", [b"code 0ne".to_vec()]).unwrap();
        drop(conn);
        let second = cache(dir.path(), 1 << 20);
        assert!(second.get(&key(1)).is_none(), "an altered value is never handed out");
        second.flush();
        assert_eq!(stored(dir.path()).0, 0, "the altered entry was dropped");
    }

    #[test]
    fn a_file_that_is_not_a_database_is_started_again() {
        let dir = tempfile::tempdir().unwrap();
        one_entry_written(dir.path());
        std::fs::write(dir.path().join(FILE), vec![0xA5; 64 << 10]).unwrap();
        let _ = std::fs::remove_file(dir.path().join(format!("{FILE}-wal")));
        let second = cache(dir.path(), 1 << 20);
        assert!(second.get(&key(1)).is_none());
        second.insert(&key(2), b"code two".to_vec());
        second.flush();
        let third = cache(dir.path(), 1 << 20);
        assert_eq!(third.get(&key(2)).as_deref(), Some(&b"code two"[..]), "the file works again");
    }

    #[test]
    fn the_file_is_kept_within_its_bound_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        // Entries of 1,000 bytes in a bound of 5,000.
        let cache = cache(dir.path(), 5_000);
        for n in 0..5 {
            cache.insert(&key(n), vec![n; 1000]);
            cache.flush();
        }
        // Used again: kept over the ones after it.
        assert!(cache.get(&key(0)).is_some());
        cache.flush();
        cache.insert(&key(5), vec![5; 1000]);
        cache.insert(&key(6), vec![6; 1000]);
        cache.flush();
        // Over the bound, cut to 90% of it: four entries.
        assert_eq!(stored(dir.path()), (4, 4_000));
        let kept: Vec<u8> = (0..7).filter(|&n| cache.get(&key(n)).is_some()).collect();
        assert_eq!(kept, [0, 4, 5, 6], "the least recently used went first; the one used again stayed");
    }
}
