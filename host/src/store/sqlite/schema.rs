//! Opening a database file (private, WAL, waiting out another process
//! that holds the write lock) and bringing its schema up to date.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::clock::Timestamp;
use crate::store::sqlite::migrations::MIGRATIONS;
use crate::store::sqlite::rows::db_err;
use crate::store::{Durability, StoreError};

/// How long a connection waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long opening waits out a database another process keeps busy.
const OPEN_PATIENCE: Duration = Duration::from_secs(30);

/// Create a missing database file readable by its owner only; SQLite gives
/// the WAL and shared-memory files the same mode. An existing file keeps
/// its mode.
pub(super) fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => {
            Err(StoreError::Database { operation: "creating the database file", source: Box::new(e), transient: false })
        }
    }
}

pub(super) fn open_connection(path: &Path, durability: Durability) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(db_err("opening the database"))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(db_err("setting the busy timeout"))?;
    // Plan each statement once. Otherwise every new `now` bound to the claim
    // query makes SQLite re-prepare it (it was ~8% of the writer's time).
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(db_err("configuring the query planner"))?;
    let synchronous = match durability {
        Durability::Normal => "NORMAL",
        Durability::Full => "FULL",
    };
    // Checkpoint every 10,000 WAL pages (~40 MiB) instead of 1,000: each
    // checkpoint fsyncs, and at the default they cost ~40% of the store's
    // throughput (see BENCHMARKS.md).
    //
    // Statement and savepoint journals in memory: on disk (SQLite's
    // default) they spilled into a temporary file on most claims and
    // finishes, ~10 writes a job that outnumbered the WAL's own (see
    // BENCHMARKS.md). They only hold the pages one statement changes.
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous}; PRAGMA wal_autocheckpoint = 10000; \
         PRAGMA temp_store = MEMORY;"
    ))
    .map_err(db_err("setting journal mode"))?;
    Ok(conn)
}

/// Open the writer (migrating the schema) and the reader. A process
/// starting while another holds the write lock waits for it (up to
/// [`OPEN_PATIENCE`]) rather than failing at the first busy timeout.
pub(super) fn open_when_free(path: &Path, durability: Durability) -> Result<(Connection, Connection), StoreError> {
    let started = std::time::Instant::now();
    loop {
        let opened = open_connection(path, durability).and_then(|mut writer| {
            migrate(&mut writer)?;
            Ok((writer, open_connection(path, durability)?))
        });
        match opened {
            Err(e) if e.is_transient() && started.elapsed() < OPEN_PATIENCE => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let err = db_err("migrating the schema");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )
    .map_err(&err)?;
    // SQLite's way to rebuild a table others refer to: foreign keys off
    // for the migration (a drop of the old table would otherwise delete
    // its rows through the references), then checked whole before commit.
    conn.pragma_update(None, "foreign_keys", false).map_err(&err)?;
    let migrated = run_migrations(conn);
    let restored = conn.pragma_update(None, "foreign_keys", true).map_err(&err);
    migrated.and(restored)
}

fn run_migrations(conn: &mut Connection) -> Result<(), StoreError> {
    let err = db_err("migrating the schema");
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(&err)?;
    let applied: i64 = tx.query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0)).map_err(&err)?;
    if applied as usize > MIGRATIONS.len() {
        return Err(StoreError::Invalid(format!(
            "the database has schema version {applied}, newer than this leash understands ({})",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
        tx.execute_batch(sql).map_err(&err)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            params![i as i64 + 1, Timestamp::now().unix_ms()],
        )
        .map_err(&err)?;
    }
    let broken: Option<String> = if applied as usize == MIGRATIONS.len() {
        None
    } else {
        tx.query_row("SELECT \"table\" FROM pragma_foreign_key_check LIMIT 1", [], |r| r.get(0))
            .optional()
            .map_err(&err)?
    };
    if let Some(table) = broken {
        return Err(StoreError::Invalid(format!("the migrated schema leaves rows of {table} referring to nothing")));
    }
    tx.commit().map_err(&err)
}
