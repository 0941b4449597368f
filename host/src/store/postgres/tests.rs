//! The PostgreSQL backend's own tests: how its hot statements are planned
//! (the behaviour every backend shares is in the conformance suite).
//!
//! They run against `LEASH_TEST_POSTGRES`, each in a schema of its own;
//! unset, they say they were skipped and pass, unless `CI` is set.

use std::time::Duration;

use leash_tests::pg::Schema;

use super::PostgresStore;
use super::claim::claim;
use super::finishes::FINISH;
use super::inserts::{InsertColumns, insert_rows, insert_unsigned};
use crate::clock::Timestamp;
use crate::job::{Digest, IdempotencyKey, JobId, JobLimits, NewJob, Target};
use crate::store::{JobClaimParams, JobInsertParams, Jobs};

/// A store in a schema of its own (dropped with the schema's guard), or
/// none when `LEASH_TEST_POSTGRES` is unset outside CI.
async fn fresh_store() -> Option<(Schema, PostgresStore)> {
    let schema = Schema::create(&leash_tests::pg::url()?).await;
    let store = PostgresStore::open(&schema.url).await.unwrap();
    Some((schema, store))
}

/// The connection's `plan_cache_mode`.
async fn plan_cache_mode(client: &tokio_postgres::Client) -> String {
    client.query_one("SHOW plan_cache_mode", &[]).await.unwrap().get(0)
}

fn new_job() -> NewJob {
    NewJob::new(
        Digest::of(b"plugin"),
        Target::Execute,
        Vec::new(),
        JobLimits { timeout: Duration::from_secs(1), fuel: None, memory_bytes: 1 << 20, output_bytes: 1 << 10 },
    )
}

/// A claim of up to `limit` jobs by worker `w`, at `now`.
fn claim_params(limit: u32, now: Timestamp) -> JobClaimParams {
    JobClaimParams { worker_id: "w".into(), limit, alone: false, lease_ttl: Duration::from_secs(30), now, aged: 0 }
}

/// The (generic, custom) plans run of each statement this connection
/// prepared whose text is `like` (an SQL `LIKE` pattern).
async fn plans(client: &tokio_postgres::Client, like: &str) -> Vec<(i64, i64)> {
    client
        .query("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1", &[&like])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The claim runs its generic plan from its first run on a connection (the
/// server, left to choose, plans it afresh on every run: 1.1 ms a claim,
/// measured), and the connection's settings are its own again after it,
/// in a transaction or not.
#[tokio::test]
async fn the_claim_is_planned_once_per_connection() {
    let Some((_schema, store)) = fresh_store().await else { return };
    let now = Timestamp::from_unix_ms(1_700_000_000_000);
    store.job_insert(JobInsertParams { jobs: (0..8).map(|_| new_job()).collect(), now }).await.unwrap();

    let mut client = store.client("test").await.unwrap();
    let settings = "SELECT current_setting('jit') || ' ' || current_setting('plan_cache_mode')";
    let before: String = client.query_one(settings, &[]).await.unwrap().get(0);
    let params = claim_params(1, now);
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
    assert_eq!(plans(&client, "WITH picked%").await, vec![(8, 0)], "(generic, custom) runs of the claim");
    let after: String = client.query_one(settings, &[]).await.unwrap().get(0);
    assert_eq!(after, before, "the settings after the claims");
}

/// A submit's insert runs its generic plan from its first run on a
/// connection (left to choose, the server planned every single-job insert
/// afresh: its generic plan, costed at ten rows, looked dearer), and the
/// statements after it in its transaction are planned as before.
#[tokio::test]
async fn the_insert_is_planned_once_per_connection() {
    let Some((_schema, store)) = fresh_store().await else { return };
    let now = Timestamp::from_unix_ms(1_700_000_000_000);
    let mut client = store.client("test").await.unwrap();
    for _ in 0..8 {
        let mut columns = InsertColumns::default();
        columns.push(new_job(), JobId::new(now), now).unwrap();
        let tx = client.transaction().await.unwrap();
        assert_eq!(insert_rows(&tx, &columns, now).await.unwrap().len(), 1);
        let then: String = tx.query_one("SHOW plan_cache_mode", &[]).await.unwrap().get(0);
        assert_eq!(then, "auto", "the setting after the insert, in its transaction");
        tx.commit().await.unwrap();
    }
    assert_eq!(plans(&client, "INSERT INTO jobs%").await, vec![(8, 0)], "(generic, custom) runs of the insert");
    assert_eq!(plan_cache_mode(&client).await, "auto", "the connection's own setting after the inserts");
}

/// The finish finds its rows by id (the primary key), not by reading every
/// running row: the planner, told the rows run, walked
/// `jobs_running_worker` and its dead entries for each finish.
#[tokio::test]
async fn a_finish_reads_its_rows_by_id() {
    let Some((_schema, store)) = fresh_store().await else { return };
    let now = Timestamp::from_unix_ms(1_700_000_000_000);
    // Enough rows that no plan reads them all; a few running, as in a drain.
    store.job_insert(JobInsertParams { jobs: (0..2000).map(|_| new_job()).collect(), now }).await.unwrap();
    let client = store.client("test").await.unwrap();
    let params = claim_params(4, now);
    // Analyzed while none runs, as a queue filled before its workers start.
    client.batch_execute("ANALYZE jobs").await.unwrap();
    let lease = claim(&client, &params, false).await.unwrap().remove(0);
    let none: Vec<Option<&str>> = vec![None];
    let plan: Vec<String> = client
        .query(
            &format!("EXPLAIN {FINISH}"),
            &[
                &vec![lease.job.id.to_string()],
                &vec![lease.token.as_str()],
                &vec!["succeeded"],
                &vec![Some(b"out".as_slice())],
                &none,
                &none,
                &none,
                &vec![1_i64],
                &vec![1_i64],
                &vec![now.unix_ms()],
                &none,
                &none,
            ],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains("jobs_pkey") && !plan.contains("jobs_running_worker"), "the finish's plan:\n{plan}");
}

/// How many rows `table` holds, read on `client`.
async fn count(client: &tokio_postgres::Client, table: &str) -> i64 {
    client.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.unwrap().get(0)
}

/// A submit no principal signs for is sent whole, `BEGIN` to `COMMIT`, on
/// its first poll (no statement waits on another's answer: one round
/// trip), so it commits even when dropped right after; its insert keeps
/// its generic plan and the connection its own setting.
#[tokio::test]
async fn an_unsigned_submit_is_sent_whole_on_its_first_poll() {
    let Some((_schema, store)) = fresh_store().await else { return };
    let now = Timestamp::from_unix_ms(1_700_000_000_000);
    let client = store.client("test").await.unwrap();
    let mut tagged = new_job();
    tagged.tags = vec!["first".into()];
    // The first submit on a connection prepares its statements.
    insert_unsigned(&client, vec![tagged.clone()], now).await.unwrap();
    {
        let submit = std::pin::pin!(insert_unsigned(&client, vec![tagged], now));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(submit.poll(&mut cx).is_pending(), "answered without the server");
    }
    // Answered once everything sent before it is, in a transaction of its
    // own unless the submit's is still open (rolled back then, so the
    // schema can be dropped).
    let open: Option<i64> = client.query_one("SELECT txid_current_if_assigned()", &[]).await.unwrap().get(0);
    if open.is_some() {
        client.batch_execute("ROLLBACK").await.unwrap();
    }
    assert_eq!(open, None, "the submit's transaction still open on its connection");
    let other = store.client("test").await.unwrap();
    assert_eq!((count(&other, "jobs").await, count(&other, "job_labels").await), (2, 2), "(jobs, labels) committed");
    assert_eq!(plans(&client, "INSERT INTO jobs%").await, vec![(2, 0)], "(generic, custom) runs of the insert");
    assert_eq!(plan_cache_mode(&client).await, "auto", "the connection's own setting after the submits");
}

/// A refused unsigned submit stores nothing, its labels included, and
/// leaves its connection ready for the next: the `COMMIT` sent after the
/// refusal rolls the transaction back.
#[tokio::test]
async fn a_refused_unsigned_submit_stores_nothing() {
    let Some((_schema, store)) = fresh_store().await else { return };
    let now = Timestamp::from_unix_ms(1_700_000_000_000);
    let client = store.client("test").await.unwrap();
    let mut keyed = new_job();
    keyed.idempotency = Some(IdempotencyKey { key: "k".into(), request_digest: "d".into() });
    keyed.tags = vec!["refused".into()];
    let refused = insert_unsigned(&client, vec![keyed.clone(), keyed], now).await.unwrap_err();
    assert!(refused.to_string().contains("jobs_idempotency_key"), "the refusal: {refused}");
    assert_eq!((count(&client, "jobs").await, count(&client, "job_labels").await), (0, 0), "(jobs, labels) stored");
    assert_eq!(insert_unsigned(&client, vec![new_job()], now).await.unwrap().len(), 1);
    let other = store.client("test").await.unwrap();
    assert_eq!(count(&other, "jobs").await, 1, "the next submit on the connection, committed");
}
