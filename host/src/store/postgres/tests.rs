//! The PostgreSQL backend's own tests: how its hot statements are planned
//! (the behaviour every backend shares is in the conformance suite).
//!
//! They run against `LEASH_TEST_POSTGRES`, each in a schema of its own;
//! unset, they say they were skipped and pass, unless `CI` is set.

use std::time::Duration;

use leash_tests::pg::Schema;

use super::PostgresStore;
use super::claim::claim;
use crate::clock::Timestamp;
use crate::job::{Digest, JobLimits, NewJob, Target};
use crate::store::{JobClaimParams, JobInsertParams, Jobs};

fn new_job() -> NewJob {
    NewJob::new(
        Digest::of(b"plugin"),
        Target::Execute,
        Vec::new(),
        JobLimits { timeout: Duration::from_secs(1), fuel: None, memory_bytes: 1 << 20, output_bytes: 1 << 10 },
    )
}

/// The claim runs its generic plan from its first run on a connection (the
/// server, left to choose, plans it afresh on every run: 1.1 ms a claim,
/// measured), and the connection's settings are its own again after it,
/// in a transaction or not.
#[tokio::test]
async fn the_claim_is_planned_once_per_connection() {
    let Some(base) = leash_tests::pg::url() else { return };
    let schema = Schema::create(&base).await;
    let store = PostgresStore::open(&schema.url).await.unwrap();
    let now = Timestamp::from_unix_ms(1_700_000_000_000);
    store.job_insert(JobInsertParams { jobs: (0..8).map(|_| new_job()).collect(), now }).await.unwrap();

    let mut client = store.client("test").await.unwrap();
    let settings = "SELECT current_setting('jit') || ' ' || current_setting('plan_cache_mode')";
    let before: String = client.query_one(settings, &[]).await.unwrap().get(0);
    let params = JobClaimParams {
        worker_id: "w".into(),
        limit: 1,
        alone: false,
        lease_ttl: Duration::from_secs(30),
        now,
        aged: 0,
    };
    let mut claimed = 0;
    for i in 0..8 {
        if i % 2 == 0 {
            claimed += claim(&client, &params, false).await.unwrap().len();
        } else {
            let tx = client.transaction().await.unwrap();
            claimed += claim(&tx, &params, false).await.unwrap().len();
            let then: String = tx.query_one(settings, &[]).await.unwrap().get(0);
            assert_eq!(then, before, "the settings after a claim in a transaction");
            tx.commit().await.unwrap();
        }
    }
    assert_eq!(claimed, 8, "every job claimed, one a claim");
    let plans: Vec<(i64, i64)> = client
        .query(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE 'WITH picked%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(plans, vec![(8, 0)], "(generic, custom) runs of the claim");
    let after: String = client.query_one(settings, &[]).await.unwrap().get(0);
    assert_eq!(after, before, "the settings after the claims");
}
