//! The SQLite backend's own tests: its schema, migrations and the plans
//! of its hot statements (the behaviour every backend shares is in the
//! conformance suite).

use std::path::Path;
use std::sync::mpsc;

use rusqlite::{Connection, params};

use super::SqliteStore;
use super::claim::CLAIM_ONE;
use super::jobs::insert_sql;
use super::leases::FINISH_ONE;
use super::migrations::MIGRATIONS;
use super::rows::db_err;
use super::schema::open_when_free;
use super::writer::{write_op, writer_loop};
use crate::clock::Timestamp;
use crate::job::Digest;
use crate::store::{Durability, Plugins, StoreError, Sweeps};

fn raw(dir: &tempfile::TempDir) -> (SqliteStore, Connection) {
    let path = dir.path().join("jobs.db");
    let store = SqliteStore::open(&path, Durability::Normal).unwrap();
    (store, Connection::open(&path).unwrap())
}

fn insert_raw(conn: &Connection, id: &str, status: &str, extra: &str) -> rusqlite::Result<usize> {
    conn.execute(
        &format!(
            "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, \
             created_at, expires_at, max_attempts{}) VALUES ('{id}', 'execute', 'sha256:00', '{status}', x'', '{{}}', 1, 0, 0, 1{})",
            if extra.is_empty() { "" } else { ", " },
            extra
        ),
        [],
    )
}

#[test]
fn the_queued_count_reads_only_queued_only_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, conn) = raw(&dir);
    let count = crate::store::sql::QUEUED_COUNT
        .replace("{claim}", "INDEXED BY jobs_claim_due")
        .replace("{parked}", "INDEXED BY jobs_parked");
    let mut explain = conn.prepare(&format!("EXPLAIN QUERY PLAN {count}")).unwrap();
    let plan: Vec<String> = explain.query_map([], |r| r.get(3)).unwrap().map(Result::unwrap).collect();
    // The claim's indexes hold queued rows not held by a pause, the parked
    // index the held ones (the expiry index holds gated ones too, so it
    // would need the table).
    assert!(plan.iter().any(|p| p.contains("COVERING INDEX jobs_claim_")), "{plan:?}");
    assert!(plan.iter().any(|p| p.contains("INDEX jobs_parked")), "{plan:?}");
    assert!(!plan.iter().any(|p| p.starts_with("SCAN jobs") && !p.contains("INDEX")), "{plan:?}");
}

#[test]
fn the_schema_refuses_states_the_lifecycle_forbids() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, conn) = raw(&dir);
    assert!(insert_raw(&conn, "a", "queued", "").is_ok());
    assert!(insert_raw(&conn, "b", "bogus", "").is_err(), "unknown status");
    assert!(insert_raw(&conn, "c", "running", "").is_err(), "running without a lease");
    assert!(insert_raw(&conn, "d", "succeeded", "").is_err(), "terminal without finished_at");
    assert!(conn.execute("UPDATE jobs SET phase = 'plan' WHERE job_id = 'a'", []).is_err(), "unknown phase");
    assert!(conn.execute("UPDATE jobs SET max_attempts = 0 WHERE job_id = 'a'", []).is_err());
    assert!(
        conn.execute("UPDATE jobs SET status = 'failed', finished_at = 1 WHERE job_id = 'a'", []).is_err(),
        "failed without an error kind"
    );
}

#[test]
fn two_running_jobs_cannot_share_a_concurrency_key() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, conn) = raw(&dir);
    conn.execute_batch(
        "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, created_at, \
         expires_at, max_attempts, worker_id, lease_token, lease_expires_at, started_at, concurrency_key) VALUES \
         ('a', 'execute', 'd', 'running', x'', '{}', 1, 0, 0, 1, 'w', 't1', 1, 0, 'plan-1')",
    )
    .unwrap();
    let second = conn.execute_batch(
        "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, created_at, \
         expires_at, max_attempts, worker_id, lease_token, lease_expires_at, started_at, concurrency_key) VALUES \
         ('b', 'execute', 'd', 'running', x'', '{}', 1, 0, 0, 1, 'w', 't2', 1, 0, 'plan-1')",
    );
    assert!(second.is_err());
}

/// A database at `path` with every migration before the first whose
/// text contains `marker`, as an older leash left it.
fn migrated_up_to(path: &Path, marker: &str) -> Connection {
    let first_not_applied = MIGRATIONS.iter().position(|m| m.contains(marker)).unwrap();
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)")
        .unwrap();
    for (i, sql) in MIGRATIONS[..first_not_applied].iter().enumerate() {
        conn.execute_batch(sql).unwrap();
        conn.execute("INSERT INTO schema_migrations VALUES (?1, 0)", params![i as i64 + 1]).unwrap();
    }
    conn
}

/// A database made before approval gates (the table rebuild) keeps its
/// rows, gains the new states and still refuses the old bad ones.
#[test]
fn the_approval_migration_keeps_every_row_and_widens_the_states() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = migrated_up_to(&path, "CREATE TABLE jobs_next");
        conn.execute_batch(
            "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, \
             created_at, expires_at, max_attempts, concurrency_key, idempotency_key, free_rerun_limit, releases) \
             VALUES ('q', 'execute', 'sha256:00', 'queued', x'', '{}', 1, 0, 0, 1, 'k', 'idem', 3, 2); \
             INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, \
             created_at, expires_at, max_attempts, finished_at, error_kind, error_message) VALUES \
             ('f', 'execute', 'sha256:00', 'failed', x'', '{}', 1, 0, 0, 1, 5, 'trap', 'Trap: x');",
        )
        .unwrap();
    }
    drop(SqliteStore::open(&path, Durability::Normal).unwrap());
    let conn = Connection::open(&path).unwrap();
    let kept: (String, String, i64, i64) = conn
        .query_row(
            "SELECT concurrency_key, idempotency_key, free_rerun_limit, releases FROM jobs WHERE job_id = 'q'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!(kept, ("k".to_owned(), "idem".to_owned(), 3, 2), "every column survives the rebuild");
    let n: i64 = conn.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 2);
    assert!(insert_raw(&conn, "p", "pending_approval", "").is_err(), "a gated state needs its record");
    conn.execute(
        "INSERT INTO jobs (job_id, phase, plugin_digest, status, payload, limits_json, schema_version, created_at,              expires_at, max_attempts, approval_json) VALUES ('p', 'execute', 'sha256:00', 'pending_approval', x'',              '{}', 1, 0, 0, 1, '{}')",
        [],
    )
    .unwrap();
    assert!(insert_raw(&conn, "b", "bogus", "").is_err(), "unknown states are still refused");
    let indexes: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' AND sql IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    // Ten, less the two a later migration merged into `jobs_running`,
    // and the suspects', submitters' and flow control's indexes later
    // migrations added (all of a submitter's jobs, its queued ones, its
    // running ones; the claim order by priority; the parked jobs; a
    // schedule's jobs by id and by status; the rate slots given).
    assert_eq!(indexes, 18, "every index is rebuilt");
}

/// A plugin stored before the plugins table put its bytes last keeps
/// them, its size and its age; afterwards reading its size touches one
/// page, not the component's overflow chain.
#[test]
fn the_plugin_table_rebuild_keeps_plugins_and_reads_sizes_without_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let bytes = vec![9u8; 200_000];
    let digest = Digest::of(&bytes).to_string();
    {
        let conn = migrated_up_to(&path, "CREATE TABLE plugins_next");
        conn.execute(
            "INSERT INTO plugins (digest, bytes, size_bytes, created_at) VALUES (?1, ?2, ?3, 7)",
            params![digest, bytes, bytes.len() as i64],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO plugin_names (name, version, digest, created_at) VALUES ('p', '1', ?1, 8)",
            [&digest],
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path, Durability::Normal).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let kept: (Vec<u8>, i64, i64) = Connection::open(&path)
        .unwrap()
        .query_row("SELECT bytes, size_bytes, created_at FROM plugins WHERE digest = ?1", [&digest], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(kept, (bytes.clone(), bytes.len() as i64, 7), "the plugin survives the rebuild");
    let named = runtime.block_on(store.plugin_resolve("p@1".parse().unwrap())).unwrap().unwrap();
    assert_eq!((named.size_bytes, named.created_at.unix_ms()), (bytes.len() as u64, 8), "the name still resolves");
    // A fresh connection with no cache: the pages the size read loads.
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "cache_size", 0).unwrap();
    let size = "SELECT size_bytes FROM plugins WHERE digest = ?1";
    let cache_misses = |reset: i32| {
        let (mut pages, mut highest) = (0, 0);
        // SAFETY: the handle is this live connection's, used on this
        // thread only, and the two outputs are live locals.
        let status = unsafe {
            rusqlite::ffi::sqlite3_db_status(
                conn.handle(),
                rusqlite::ffi::SQLITE_DBSTATUS_CACHE_MISS,
                &mut pages,
                &mut highest,
                reset,
            )
        };
        assert_eq!(status, rusqlite::ffi::SQLITE_OK);
        pages
    };
    // The schema loads with the first statement: not counted.
    conn.prepare(size).unwrap();
    cache_misses(1);
    conn.query_row(size, [&digest], |r| r.get::<_, i64>(0)).unwrap();
    let pages = cache_misses(0);
    assert!(pages < 8, "reading a size loaded {pages} pages: the component's overflow chain");
}

/// A database whose change feed was made with AUTOINCREMENT keeps its
/// events through the rebuild, the triggers still write them, and new
/// numbers go on past the old ones.
#[test]
fn the_event_table_rebuild_keeps_the_feed_and_its_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = migrated_up_to(&path, "CREATE TABLE events_next");
        insert_raw(&conn, "a", "queued", "").unwrap();
        insert_raw(&conn, "b", "queued", "").unwrap();
        // Retention had deleted the first: AUTOINCREMENT remembered it.
        conn.execute_batch("DELETE FROM events WHERE job_id = 'a'").unwrap();
    }
    drop(SqliteStore::open(&path, Durability::Normal).unwrap());
    let conn = Connection::open(&path).unwrap();
    let seqs = |conn: &Connection| -> Vec<(i64, String)> {
        let mut stmt = conn.prepare("SELECT seq, job_id FROM events ORDER BY seq").unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    };
    assert_eq!(seqs(&conn), [(2, "b".to_owned())], "the old events survive, numbers and all");
    insert_raw(&conn, "c", "queued", "").unwrap();
    assert_eq!(seqs(&conn), [(2, "b".to_owned()), (3, "c".to_owned())], "the triggers write on, past the old");
    let sql: String = conn
        .query_row("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events'", [], |r| r.get(0))
        .unwrap();
    assert!(!sql.contains("AUTOINCREMENT"), "{sql}");
}

/// The opcodes (name, P2) of `sql`, its triggers' programs included.
fn opcodes(conn: &Connection, sql: &str) -> Vec<(String, i64)> {
    let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
    stmt.query_map(rusqlite::params_from_iter((0..stmt.parameter_count()).map(|_| 1)), |r| Ok((r.get(1)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The claim's update, the finish and an event's insert build no
/// temporary b-tree: SQLite makes one for every `IN (…)` list a
/// statement checks, each time it runs.
#[test]
fn the_hot_statements_build_no_temporary_tables() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, conn) = raw(&dir);
    for sql in [CLAIM_ONE, FINISH_ONE, "INSERT INTO events (at, what, status) VALUES (?1, 'insert', 'queued')"] {
        assert!(!opcodes(&conn, sql).iter().any(|(op, _)| op == "OpenEphemeral"), "{sql}");
    }
    assert!(insert_raw(&conn, "b", "bogus", "").is_err(), "the CHECKs still refuse unknown states");
}

/// The claim's update, the finish and a one-job insert, triggers included, need no
/// statement journal: SQLite keeps one (a copy of every page the
/// statement touches) for a statement that writes several rows and may
/// stop halfway, which a constraint failing with `ABORT` or any function
/// call can.
#[test]
fn the_hot_statements_need_no_statement_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (store, conn) = raw(&dir);
    const ABORT: i64 = 2;
    for sql in [CLAIM_ONE, FINISH_ONE, &insert_sql(1)] {
        let ops = opcodes(&conn, sql);
        assert!(ops.iter().any(|(op, _)| op == "Program"), "the event triggers are part of {sql}");
        for (op, p2) in ops {
            assert!(op != "Function" && op != "PureFunc", "{sql} calls a function");
            assert!(!(op.starts_with("Halt") && p2 == ABORT), "{sql} may abort halfway ({op})");
        }
    }
    // What the triggers stamp events with: the writer's clock, set as
    // each of its transactions begins (from 0 here, so a clock the
    // writer did not set shows).
    conn.execute("UPDATE event_clock SET at = 0", []).unwrap();
    let before = Timestamp::now().unix_ms();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(store.workers_delete_stale(Timestamp::from_unix_ms(0))).unwrap();
    let after = Timestamp::now().unix_ms();
    let clock: i64 = conn.query_row("SELECT at FROM event_clock", [], |r| r.get(0)).unwrap();
    assert!((before..=after).contains(&clock), "{before} <= {clock} <= {after}");
    insert_raw(&conn, "c", "queued", "").unwrap();
    let at: i64 = conn.query_row("SELECT at FROM events WHERE job_id = 'c'", [], |r| r.get(0)).unwrap();
    assert_eq!(at, clock);
}

/// A write without a statement journal that fails on a full disk makes
/// SQLite roll back the whole transaction. The writes queued after it
/// in the same batch must not then commit one by one while every
/// caller hears an error: nothing of the batch is stored, the write
/// that failed says why, and the others hear a transient error.
#[test]
fn a_batch_whose_transaction_is_rolled_back_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let (writer, _reader) = open_when_free(&path, Durability::Normal).unwrap();
    let (first, first_answer) = write_op(false, |conn| insert_raw(conn, "a", "queued", "").map_err(db_err("a")));
    let (full, full_answer) = write_op(false, |conn| {
        let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).map_err(db_err("count"))?;
        conn.pragma_update(None, "max_page_count", pages).map_err(db_err("cap"))?;
        conn.execute("UPDATE OR FAIL jobs SET payload = ?1 WHERE job_id = 'a'", [vec![7u8; 1 << 20]])
            .map_err(db_err("growing a"))
    });
    let (last, last_answer) = write_op(false, |conn| {
        conn.pragma_update(None, "max_page_count", 1_000_000).map_err(db_err("uncap"))?;
        insert_raw(conn, "c", "queued", "").map_err(db_err("c"))
    });
    // Queued before the loop starts: one batch.
    let (tx, rx) = mpsc::channel();
    for op in [first, full, last] {
        tx.send(op).unwrap();
    }
    drop(tx);
    writer_loop(writer, rx, || {});

    let answer =
        |rx: tokio::sync::oneshot::Receiver<Result<usize, StoreError>>| rx.blocking_recv().unwrap().unwrap_err();
    let (first, full, last) = (answer(first_answer), answer(full_answer), answer(last_answer));
    assert!(full.to_string().contains("growing a"), "the failed write says why: {full}");
    for other in [&first, &last] {
        assert!(other.is_transient(), "{other}");
        assert!(other.to_string().contains("nothing in the batch was stored"), "{other}");
    }
    let conn = Connection::open(&path).unwrap();
    let stored: i64 = conn.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, 0, "a write after the rollback committed on its own");
}

#[test]
fn reopening_does_not_reapply_migrations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    drop(SqliteStore::open(&path, Durability::Full).unwrap());
    drop(SqliteStore::open(&path, Durability::Normal).unwrap());
    let conn = Connection::open(&path).unwrap();
    let n: i64 = conn.query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0)).unwrap();
    assert_eq!(n as usize, MIGRATIONS.len());
}

/// Commits are copied into the database file by the checkpoint thread,
/// long before the writer's own checkpoint (10,000 pages) would run: the
/// file grows while the WAL holds a few hundred pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_checkpointed_off_the_writer() {
    use crate::job::{JobLimits, NewJob, Target};
    use crate::store::{JobInsertParams, Jobs};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let store = SqliteStore::open(&path, Durability::Normal).unwrap();
    let size = || std::fs::metadata(&path).unwrap().len();
    let before = size();
    let limits = JobLimits {
        timeout: std::time::Duration::from_secs(1),
        fuel: None,
        memory_bytes: 1 << 20,
        output_bytes: 1 << 10,
    };
    // ~100 pages of input: a hundredth of the writer's threshold.
    let jobs =
        (0..100).map(|_| NewJob::new(Digest::of(b"plugin"), Target::Execute, vec![7; 4096], limits.clone())).collect();
    store.job_insert(JobInsertParams { jobs, now: Timestamp::now() }).await.unwrap();
    let start = std::time::Instant::now();
    while size() < before + 100 * 4096 {
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "not checkpointed: {} bytes", size());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
