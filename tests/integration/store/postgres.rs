//! What only a real PostgreSQL server shows, beside the conformance suite
//! (`conformance/`): the store's own upkeep of the jobs table, and what
//! the server refuses to store.

use std::time::Duration;

use leash::job::{ErrorKind, JobStatus, NewJob, Proposal};
use leash::store::postgres::PostgresStore;
use leash::store::{Finish, JobInsertParams, Jobs, Lease, Leases};

use crate::store::conformance::cases::{at, claim_params, finish_params, new_job, retry_params, succeed};
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
        let params = claim_params("worker-aaaaaaaa", 1000, at(10));
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

/// A store on a fresh schema, and the schema kept alive with it.
async fn fresh() -> Option<(PostgresStore, Schema)> {
    let schema = Schema::create(&crate::support::pg::url()?).await;
    Some((PostgresStore::open(&schema.url).await.unwrap(), schema))
}

/// `n` jobs of three attempts, queued and claimed by one worker.
async fn running(store: &PostgresStore, n: usize) -> Vec<Lease> {
    let jobs = (0..n).map(|i| NewJob { max_attempts: 3, ..new_job(&i.to_string()) }).collect();
    store.job_insert(JobInsertParams { jobs, now: at(0) }).await.unwrap();
    let params = claim_params("worker-aaaaaaaa", n as u32, at(1));
    let leases = store.job_claim(params).await.unwrap();
    assert_eq!(leases.len(), n);
    leases
}

/// A `TEXT` column cannot hold a NUL byte, and a guest's error message
/// may carry one: its failure and its retry are kept (the NUL shown as
/// U+FFFD), not refused, which would leave the attempt unrecorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_message_with_a_nul_byte_is_recorded() {
    let Some((store, _schema)) = fresh().await else { return };
    let leases = running(&store, 2).await;
    let failed = Finish::Failed {
        kind: ErrorKind::GuestError,
        message: "Failed: bad\0byte".into(),
        backtrace: Some("at\0here".into()),
    };
    assert!(store.job_finish(finish_params(&leases[0], failed, at(2))).await.unwrap());
    let job = store.job_get(leases[0].job.id).await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Failed);
    assert_eq!(job.error_message.as_deref(), Some("Failed: bad\u{FFFD}byte"));
    assert_eq!(job.backtrace.as_deref(), Some("at\u{FFFD}here"));
    let mut retry = retry_params(&leases[1], at(3), at(2));
    retry.message = "Retryable: \0".into();
    assert!(store.job_retry(retry).await.unwrap());
    let job = store.job_get(leases[1].job.id).await.unwrap().unwrap();
    assert_eq!(job.last_error.as_deref(), Some("guest_error: Retryable: \u{FFFD}"));
}

/// Finishes sent at once go to the server together; one the server
/// refuses (a proposal it cannot store) fails alone, and the others land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_the_server_refuses_fails_alone() {
    let Some((store, _schema)) = fresh().await else { return };
    let leases = running(&store, 40).await;
    let bad = leases[20].job.id;
    let finishes = leases.iter().map(|lease| {
        let mut finish = succeed(lease, at(2));
        if lease.job.id == bad {
            let proposal = Proposal {
                n: 1,
                method: "PO\0ST".into(),
                url: "https://example.com/".into(),
                headers: Vec::new(),
                body: Vec::new(),
            };
            finish.proposals = vec![proposal];
        }
        let store = store.clone();
        async move { (lease.job.id, store.job_finish(finish).await) }
    });
    for (id, answer) in futures_util::future::join_all(finishes).await {
        let job = store.job_get(id).await.unwrap().unwrap();
        if id == bad {
            let error = answer.unwrap_err();
            assert!(!error.is_transient(), "{error}");
            assert_eq!(job.status, JobStatus::Running, "nothing of it landed");
        } else {
            assert!(answer.unwrap(), "{id} landed");
            assert_eq!(job.status, JobStatus::Succeeded);
        }
    }
}

/// A caller gone before its finish's round answered (its future dropped)
/// does not strand the job the round claimed for its slot: the finish
/// lands, and that job is queued again, not left running until its lease
/// expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_claimed_for_a_caller_gone_is_queued_again() {
    let Some((store, _schema)) = fresh().await else { return };
    let leases = running(&store, 1).await;
    let next = store.job_insert(JobInsertParams { jobs: vec![new_job("next")], now: at(2) }).await.unwrap()[0].id;
    let claim = claim_params("worker-bbbbbbbb", 1, at(3));
    // Polled once (the finish is sent), then dropped.
    let answer = futures_util::FutureExt::now_or_never(store.job_finish_and_claim(succeed(&leases[0], at(3)), claim));
    assert!(answer.is_none(), "the round had not answered yet");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (finished, next) =
            (store.job_get(leases[0].job.id).await.unwrap().unwrap(), store.job_get(next).await.unwrap().unwrap());
        if finished.status == JobStatus::Succeeded && next.status == JobStatus::Queued && next.attempt == 1 {
            assert_eq!(next.lease_token, None);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "finished {:?}, next {:?} (attempt {})",
            finished.status,
            next.status,
            next.attempt
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
