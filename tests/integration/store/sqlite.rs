//! What only a real SQLite file shows, beside the conformance suite
//! (`conformance/`): full durability, another process holding the write
//! lock, and the layout rule that only `store/` names a backend.

use std::sync::Arc;
use std::time::Duration;

use leash::clock::Timestamp;
use leash::store::sqlite::SqliteStore;
use leash::store::{Durability, JobInsertParams, Jobs};

use crate::store::conformance::cases;

#[tokio::test]
async fn a_deleted_job_takes_its_label_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let store = Arc::new(SqliteStore::open(&path, Durability::Normal).unwrap());
    let count = async || {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.query_row("SELECT COUNT(*) FROM job_labels", [], |r| r.get::<_, i64>(0)).unwrap()
    };
    cases::labels::a_deleted_job_takes_its_label_rows(store, count).await;
}

#[tokio::test]
async fn sqlite_with_full_durability_passes_a_lifecycle_case() {
    let fresh = crate::store::conformance::sqlite_with(Durability::Full);
    cases::leases::a_stale_token_changes_nothing(fresh.store.clone()).await;
}

/// Another process holding the write lock past the busy timeout: queued
/// writes fail as transient, a store opening meanwhile waits for the lock
/// instead of failing (the lock is held a second past SQLite's 5 s busy
/// timeout after the open starts: SQLite's own clock, which cannot be
/// injected), and writing works again once the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_elsewhere_is_transient_and_opening_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let store = Arc::new(SqliteStore::open(&path, Durability::Normal).unwrap());

    let (release, released) = std::sync::mpsc::channel::<()>();
    let (locked, is_locked) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn({
        let path = path.clone();
        move || {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked.send(()).unwrap();
            released.recv().unwrap();
            conn.execute_batch("COMMIT").unwrap();
        }
    });
    is_locked.recv().unwrap();

    let writes: Vec<_> = (0..3)
        .map(|i| {
            let store = store.clone();
            let now = Timestamp::now();
            tokio::spawn(async move {
                store.job_insert(JobInsertParams { jobs: vec![cases::new_job(&i.to_string())], now }).await
            })
        })
        .collect();
    for write in writes {
        let error = write.await.unwrap().expect_err("the write lock is held elsewhere");
        assert!(error.is_transient(), "busy is transient: {error}");
    }

    let opening = std::thread::spawn(move || SqliteStore::open(&path, Durability::Normal));
    std::thread::sleep(Duration::from_secs(6));
    assert!(!opening.is_finished(), "opening waits while the lock is held");
    release.send(()).unwrap();
    holder.join().unwrap();
    let reopened = opening.join().unwrap().expect("opening waits for the lock");

    let now = Timestamp::now();
    reopened.job_insert(JobInsertParams { jobs: vec![cases::new_job("after")], now }).await.expect("writes work again");
    store.job_insert(JobInsertParams { jobs: vec![cases::new_job("after")], now }).await.expect("writes work again");
}

/// Only `store/` knows the backends: the runtime, the pool, the faces and
/// the metrics reach a store through `store::open` and the `JobStore` trait.
/// One file outside it uses SQLite, for no job's state: the sandbox's
/// function cache (`sandbox/functions.rs`), a local cache file of compiled
/// code beside the compile cache, which names no store.
#[test]
fn nothing_outside_the_store_names_a_backend() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !path.ends_with("store") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    assert!(files.iter().any(|f| f.ends_with("runtime/mod.rs")), "walked {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for word in ["store::sqlite", "SqliteStore", "rusqlite", "store::postgres", "PostgresStore", "tokio_postgres"] {
            if word == "rusqlite" && file.ends_with("sandbox/functions.rs") {
                continue;
            }
            assert!(!text.contains(word), "{} names the backend ({word})", file.display());
        }
    }
}
