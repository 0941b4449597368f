//! What only a real PostgreSQL server shows, beside the conformance suite
//! (`conformance/`): the store's own upkeep of the jobs table.

use std::time::Duration;

use leash::store::postgres::PostgresStore;
use leash::store::{JobClaimParams, JobInsertParams, Jobs, Leases};

use crate::store::conformance::cases::{TTL, at, new_job, succeed};
use crate::support::pg::Schema;

/// On a server that does not vacuum by itself (autovacuum off, as this
/// project's servers run), the store vacuums its jobs table once the rows
/// it changed pass its threshold (10,000 here: 6,000 jobs claimed and
/// finished); the dead rows claims and finishes leave would otherwise stay
/// in the claim's index for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_vacuums_the_jobs_table_when_the_server_does_not() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let (client, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let autovacuum: String = client.query_one("SHOW autovacuum", &[]).await.unwrap().get(0);
    if autovacuum != "off" {
        eprintln!("skipped: this server runs autovacuum, and leash leaves vacuuming to it");
        return;
    }
    let store = PostgresStore::open(&schema.url).await.unwrap();
    let last_vacuum = async || -> bool {
        let row = client
            .query_one(
                "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables \
                 WHERE schemaname = current_schema() AND relname = 'jobs'",
                &[],
            )
            .await
            .unwrap();
        row.get(0)
    };
    for i in 0..6 {
        let jobs = (0..1000).map(|j| new_job(&format!("{i}-{j}"))).collect();
        store.job_insert(JobInsertParams { jobs, now: at(i) }).await.unwrap();
    }
    let mut leases = Vec::new();
    for _ in 0..6 {
        let params = JobClaimParams {
            worker_id: "worker-aaaaaaaa".into(),
            limit: 1000,
            alone: false,
            lease_ttl: TTL,
            now: at(10),
            aged: 0,
        };
        leases.extend(store.job_claim(params).await.unwrap());
    }
    assert_eq!(leases.len(), 6000);
    assert!(!last_vacuum().await, "6,000 changed rows are below the threshold");
    for chunk in leases.chunks(500) {
        let finishes = chunk.iter().map(|lease| store.job_finish(succeed(lease, at(11))));
        assert!(futures_util::future::join_all(finishes).await.into_iter().all(|f| f.unwrap()));
    }
    // The vacuum runs in the background; a 12,000-row table takes well
    // under a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !last_vacuum().await {
        assert!(std::time::Instant::now() < deadline, "the jobs table was not vacuumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
