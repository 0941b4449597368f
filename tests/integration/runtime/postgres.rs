//! leash on PostgreSQL beyond the store's own cases (those are in the
//! conformance suite): wake-ups between processes, a lost listener,
//! terminated connections, and replicas sharing one database.

use std::process::Child;
use std::time::{Duration, Instant};

use leash::job::{JobStatus, NewJob, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::SandboxConfig;
use leash::store::postgres::PostgresStore;
use leash::store::{Events, JobInsertParams, Jobs, Leases};
use serde_json::{Value, json};

use crate::chaos::crash::{sigterm, start_worker_with};
use crate::support::pg::Schema;
use crate::support::server::Server;
use crate::support::{GENEROUS, cache_dir, eventually, eventually_blocking};

async fn insert_one(store: &PostgresStore) {
    let job: NewJob = crate::store::conformance::cases::new_job("wake");
    store.job_insert(JobInsertParams { jobs: vec![job], now: leash::clock::Timestamp::now() }).await.unwrap();
}

/// Transactions commit out of the order of their ids: an event of one
/// still open must not be skipped by a reader that has already read a
/// newer transaction's event. Events wait until every older transaction
/// has ended, then come in transaction order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_of_a_transaction_that_commits_late_is_read_in_its_place_not_skipped() {
    use leash::job::EventKind;
    use leash::store::EventsAfterParams;
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let store = PostgresStore::open(&schema.url).await.unwrap();
    insert_one(&store).await;
    // Start after that insert's event: other tests' open transactions on
    // the server may hold it back a moment, and the head with it.
    let start = Some(
        eventually("the first insert's event is read", async || {
            let page = store.events_after(EventsAfterParams { after: None, limit: 10 }).await.unwrap();
            page.events.last().map(|e| e.id)
        })
        .await,
    );
    let queued =
        store.job_list(leash::store::JobListParams { limit: 10, ..Default::default() }).await.unwrap().pop().unwrap();
    // An older transaction changes the job and stays open...
    let (slow, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    slow.batch_execute("BEGIN").await.unwrap();
    let now = leash::clock::Timestamp::now().unix_ms();
    slow.execute(
        "UPDATE jobs SET status = 'cancelled', finished_at = $2, error_kind = 'cancelled', error_message = 'x' \
         WHERE job_id = $1",
        &[&queued.id.to_string(), &now],
    )
    .await
    .unwrap();
    // ...while a newer one commits.
    insert_one(&store).await;
    let read = |after| store.events_after(EventsAfterParams { after, limit: 10 });
    let early = read(start).await.unwrap();
    assert_eq!(early.events, [], "the newer event waits for the older transaction");
    slow.batch_execute("COMMIT").await.unwrap();
    // Other tests' transactions on the server may hold the events back a
    // moment longer.
    let events = eventually("both events are read", async || {
        let events = read(start).await.unwrap().events;
        (events.len() >= 2).then_some(events)
    })
    .await;
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::JobFinished, EventKind::JobSubmitted], "in transaction order, none skipped");
    assert_eq!(events[0].job.as_ref().unwrap().id, queued.id);
}

/// The next change of `signal`, or a panic after `GENEROUS`.
async fn next_signal(signal: &mut tokio::sync::watch::Receiver<u64>, what: &str) {
    tokio::time::timeout(GENEROUS, signal.changed())
        .await
        .unwrap_or_else(|_| panic!("no wake-up: {what}"))
        .expect("the listener is alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_through_one_store_wakes_another_even_after_its_listener_is_killed() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let submitter = PostgresStore::open(&schema.url).await.unwrap();
    let listener = PostgresStore::open(&schema.url).await.unwrap();
    let mut signal = listener.enqueued().expect("PostgreSQL stores signal enqueues");
    next_signal(&mut signal, "the listener connects").await;
    // The submitter listens too: wait for it, so both LISTEN connections
    // exist when they are terminated below.
    let mut submitter_signal = submitter.enqueued().expect("PostgreSQL stores signal enqueues");
    next_signal(&mut submitter_signal, "the submitter's listener connects").await;

    insert_one(&submitter).await;
    next_signal(&mut signal, "an insert through the other store").await;

    // Each connection last ran its set-up (`LISTEN …`) or a wake-up.
    let killed = schema.terminate_backends("query LIKE 'LISTEN%' OR query = 'NOTIFY leash_jobs'").await;
    assert_eq!(killed, 2, "each store has one listening connection");
    // The reconnect is itself a wake-up: notifications may have been missed.
    next_signal(&mut signal, "the listener reconnects").await;
    insert_one(&submitter).await;
    next_signal(&mut signal, "an insert after the reconnect").await;
}

/// A deleted job takes its label rows with it (the trigger, counted in
/// the table; the SQLite twin is in `store::sqlite`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_job_takes_its_label_rows() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let store = std::sync::Arc::new(PostgresStore::open(&schema.url).await.unwrap());
    let (client, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let count = async || client.query_one("SELECT COUNT(*) FROM job_labels", &[]).await.unwrap().get::<_, i64>(0);
    crate::store::conformance::cases::labels::a_deleted_job_takes_its_label_rows(store, count).await;
}

/// A table filled in a burst is analyzed without waiting for autovacuum,
/// at its first thousand rows and again each time it has doubled (the
/// threshold's own arithmetic is `stats::tests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_inserts_into_a_new_table_is_analyzed_without_waiting_for_autovacuum() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let store = PostgresStore::open(&schema.url).await.unwrap();
    // A table never analyzed has reltuples -1, and the claim is planned as
    // if it held a handful of rows; autovacuum looks once a minute at most.
    let (client, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let mut inserted = 0;
    for (batches, analyzed) in [(1, 1000.0), (1, 2000.0), (2, 4000.0)] {
        for _ in 0..batches {
            let jobs = (0..1000).map(|_| crate::store::conformance::cases::new_job("burst")).collect();
            store.job_insert(JobInsertParams { jobs, now: leash::clock::Timestamp::now() }).await.unwrap();
            inserted += 1000;
        }
        eventually(format!("the jobs table is analyzed after {inserted} inserts"), async || {
            let row =
                client.query_one("SELECT reltuples FROM pg_class WHERE oid = 'jobs'::regclass", &[]).await.unwrap();
            (row.get::<_, f32>(0) >= analyzed).then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_vacuum_by_itself_is_named_at_start() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let (client, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let autovacuum: String = client.query_one("SHOW autovacuum", &[]).await.unwrap().get(0);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_leash"))
        .args(["worker", "--db", &schema.url, "--max-workers", "1", "--shutdown-budget", "3s"])
        .env("LEASH_CACHE_DIR", cache_dir())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut before_ready = String::new();
    loop {
        let mut line = String::new();
        assert!(std::io::BufRead::read_line(&mut err, &mut line).unwrap() > 0, "exited early: {before_ready}");
        if line.contains(" running ") {
            break;
        }
        before_ready += &line;
    }
    sigterm(&child);
    assert!(child.wait().unwrap().success());
    // This project's servers run with autovacuum off; a default server
    // runs it on, and then nothing is said.
    assert_eq!(
        before_ready.contains("autovacuum is off"),
        autovacuum == "off",
        "autovacuum {autovacuum}, and the worker said: {before_ready}"
    );
}

/// A runtime on `db` with the shared compile cache and a fast poll.
fn runtime_on(db: String) -> leash::runtime::RuntimeBuilder {
    Runtime::builder(db)
        .sandbox(SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() })
        .poll_interval(Duration::from_millis(50))
}

/// A `sleep` job of `ms` with one attempt: any re-run would show.
fn sleeper(ms: u64) -> Submit {
    let mut job = Submit::new(
        PluginSource::Bytes(leash_tests::plugin_bytes("sleep")),
        Target::Execute,
        json!({ "ms": ms }).to_string().into_bytes(),
    );
    job.max_attempts = Some(1);
    job
}

/// Every job succeeded on its first attempt, never lost or released.
async fn succeeded_on_the_first_attempt(runtime: &Runtime, ids: impl IntoIterator<Item = leash::job::JobId>) {
    for id in ids {
        let done = runtime.wait(id, GENEROUS).await.unwrap();
        assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
        assert_eq!((done.attempt, done.lost_leases, done.releases), (1, 0, 0), "{done:?}");
    }
}

fn hello(name: &str) -> Submit {
    Submit::new(
        PluginSource::Bytes(leash_tests::plugin_bytes("hello")),
        Target::Execute,
        json!({ "name": name }).to_string().into_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_only_polls_hourly_starts_a_job_submitted_elsewhere_at_once() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let submitter = runtime_on(schema.url.clone()).without_workers().build().await.unwrap();
    // Ready means its first claim has found nothing: only a wake-up can
    // start a job submitted now before an hour has passed.
    let mut worker = start_worker_with(&schema.url, 2, &["--poll-interval", "1h"]);
    let id = submitter.submit(hello("notify")).await.unwrap();
    let done = submitter.wait(id, GENEROUS).await.unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}");
    stop(&mut worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_finish_when_every_connection_is_terminated_under_them() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let runtime = runtime_on(schema.url.clone()).lease_ttl(Duration::from_secs(3)).build().await.unwrap();
    let sleeper = sleeper(1500);
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(runtime.submit(sleeper.clone()).await.unwrap());
    }
    for i in 0..8 {
        ids.push(runtime.submit(hello(&format!("n{i}"))).await.unwrap());
    }
    // Terminate every connection of this store, twice, while the sleeps run
    // (their leases are renewed every second, so renewals hit it too).
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(schema.terminate_backends("TRUE").await > 0);
    }
    succeeded_on_the_first_attempt(&runtime, ids).await;
    runtime.shutdown().await;
}

/// SIGTERM and wait for exit 0.
fn stop(child: &mut Child) {
    sigterm(child);
    let status = eventually_blocking("the process exits after SIGTERM", || child.try_wait().unwrap());
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_replicas_and_a_worker_share_jobs_and_pass_cancels_along() {
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    let serve = |extra: &[&str]| Server::start_on(schema.url.as_ref(), &token, extra, |_| {});
    let a = serve(&["--poll-interval", "1h"]);
    let b = serve(&["--poll-interval", "1h"]);
    let mut worker = start_worker_with(&schema.url, 2, &["--poll-interval", "1h", "--lease-ttl", "3s"]);
    a.add_plugin("hello").await;
    a.add_plugin("sleep").await;

    // Submitted through one replica, visible and finished through the other.
    let mut ids = Vec::new();
    for i in 0..12 {
        let (status, answer) = b
            .call(
                reqwest::Method::POST,
                "/v1/jobs",
                Some(json!({ "plugin": "hello", "input": { "name": format!("r{i}") }, "execution": "async" })),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        ids.push(answer["job_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let job = a.poll_job(id, |j| j["status"] == "succeeded").await;
        assert!(job["worker_id"].is_string(), "{job}");
    }

    // Three pools in one registry, each with its own id: each server's in
    // the child process it supervises.
    let (_, workers) = a.call(reqwest::Method::GET, "/v1/workers", None).await;
    let pids: Vec<u64> = workers["workers"].as_array().unwrap().iter().map(|w| w["pid"].as_u64().unwrap()).collect();
    let (a_pool, b_pool) = (pool_pid(&a).await, pool_pid(&b).await);
    let mut expected = vec![a_pool, b_pool, u64::from(worker.id())];
    let mut seen = pids.clone();
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected, "{workers}");

    // A cancel through a replica that does not run the job reaches it.
    let (_, answer) = a
        .call(
            reqwest::Method::POST,
            "/v1/jobs",
            Some(json!({ "plugin": "sleep", "input": { "ms": 600000 }, "execution": "async" })),
        )
        .await;
    let id = answer["job_id"].as_str().unwrap().to_owned();
    let running = a.poll_job(&id, |j| j["status"] == "running").await;
    let owner = owner_pid(&a, &running).await;
    let other = if owner == a_pool { &b } else { &a };
    let (status, answer) = other.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/cancel"), None).await;
    assert_eq!(status, 202, "{answer}");
    let done = other.poll_job(&id, |j| j["status"] == "cancelled").await;
    assert_eq!(done["error_kind"], "cancelled", "{done}");

    for mut server in [a, b] {
        stop(&mut server.child);
    }
    stop(&mut worker);
}

/// The pid of the pool that runs `job`.
/// The pid of a server's supervised pool process.
async fn pool_pid(server: &Server) -> u64 {
    let (_, health) = server.call(reqwest::Method::GET, "/v1/health", None).await;
    health["health"]["supervision"]["pid"].as_u64().unwrap_or_else(|| panic!("no pool process: {health}"))
}

async fn owner_pid(server: &Server, job: &Value) -> u64 {
    let (_, workers) = server.call(reqwest::Method::GET, "/v1/workers", None).await;
    let owner = job["worker_id"].as_str().unwrap();
    workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == owner)
        .and_then(|w| w["pid"].as_u64())
        .unwrap_or_else(|| panic!("{owner} is not registered: {workers}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_up_is_waited_for_then_named_with_its_error() {
    // A port nothing listens on: the connection is refused at once, so
    // only the patience decides when opening gives up.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://leash:secret@127.0.0.1:{port}/jobs?connect_patience_ms=300");
    let started = Instant::now();
    let err = PostgresStore::open(&url).await.unwrap_err();
    let waited = started.elapsed();
    let message = err.to_string();
    assert!(waited >= Duration::from_millis(300), "gave up after {waited:?}: {message}");
    assert!(message.contains("waited") && message.contains("Connection refused"), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{port}")) && !message.contains("secret"), "{message}");
    assert!(err.is_transient(), "a refused connection is worth retrying later: {err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_in_the_url_are_refused_by_name() {
    for (query, says) in [("pool_size=0", "pool_size"), ("connect_patience_ms=soon", "connect_patience_ms")] {
        let err = PostgresStore::open(&format!("postgres://leash@127.0.0.1:1/jobs?{query}")).await.unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_outage_shorter_than_a_lease_kills_no_guest_and_loses_nothing() {
    let Some(cluster) = crate::support::pg::Cluster::start() else { return };
    // A lease long enough that the outage stays shorter than it even when a
    // loaded machine takes many seconds to start the server again.
    let runtime = runtime_on(cluster.url()).lease_ttl(Duration::from_secs(30)).build().await.unwrap();
    let ids = [runtime.submit(sleeper(4000)).await.unwrap(), runtime.submit(sleeper(4000)).await.unwrap()];
    for id in ids {
        wait_running(&runtime, id).await;
    }
    // Down for a while (a renewal due meanwhile fails), then back.
    cluster.crash();
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.start_again();
    succeeded_on_the_first_attempt(&runtime, ids).await;
    runtime.shutdown().await;
}

/// Poll (bounded) until the job runs; the server may be briefly away.
async fn wait_running(runtime: &Runtime, id: leash::job::JobId) {
    eventually(format!("{id} starts"), async || {
        runtime.get(id).await.is_ok_and(|j| j.status == JobStatus::Running).then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_started_while_the_server_is_down_waits_for_it() {
    let Some(cluster) = crate::support::pg::Cluster::start() else { return };
    cluster.crash();
    let url = cluster.url();
    let opening = tokio::spawn(async move { PostgresStore::open(&url).await });
    // Opening is still waiting when the server comes back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!opening.is_finished(), "opening gave up on a server that was down for 1 s");
    cluster.start_again();
    let store = opening.await.unwrap().expect("opening succeeds once the server is up");
    assert_eq!(store.queued_count().await.unwrap(), 0);
}

/// Replicas starting at once on a new schema: every one migrates it or
/// finds it migrated, none fails on the race to create the version table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_opening_a_new_schema_at_once_all_start() {
    let Some(url) = crate::support::pg::url() else { return };
    for _ in 0..20 {
        let schema = Schema::create(&url).await;
        let opens = (0..8).map(|_| PostgresStore::open(&schema.url));
        for opened in futures_util::future::join_all(opens).await {
            opened.expect("every replica starts");
        }
    }
}

/// A principal's running cap holds across replicas: claimers on two
/// stores race for its jobs while a watcher counts, in the database, how
/// many run at once; the count never passes the cap, from the moment the
/// cap is set through the other replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_cap_holds_across_replicas_claiming_at_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use leash::access::{Principal, PrincipalCeilings, Role};
    use leash::clock::Timestamp;
    use leash::store::{Finish, JobClaimParams, JobFinishParams, Principals};
    const CAP: i64 = 3;
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let replicas = [PostgresStore::open(&schema.url).await.unwrap(), PostgresStore::open(&schema.url).await.unwrap()];
    let claim = |i: usize| JobClaimParams {
        worker_id: format!("worker-{i:08}"),
        limit: 2,
        alone: false,
        lease_ttl: Duration::from_secs(60),
        now: Timestamp::now(),
        aged: 0,
    };
    // The second replica claims before any cap is set: for up to a second
    // after, it has read that no principal has one.
    assert!(replicas[1].job_claim(claim(99)).await.unwrap().is_empty());
    let ceilings = PrincipalCeilings { max_running: Some(CAP as u32), ..Default::default() };
    let tenant =
        Principal { name: "tenant".into(), roles: [Role::Submit].into(), created_at: Timestamp::now(), ceilings };
    replicas[0].principal_put(tenant, None).await.unwrap();
    let by = |who: &str| NewJob { submitted_by: Some(who.into()), ..crate::store::conformance::cases::new_job("x") };
    let jobs: Vec<NewJob> = (0..160).map(|i| by(if i % 4 == 0 { "other" } else { "tenant" })).collect();
    replicas[0].job_insert(JobInsertParams { jobs, now: Timestamp::now() }).await.unwrap();

    let (watcher, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let done = Arc::new(AtomicBool::new(false));
    let watching = tokio::spawn({
        let done = done.clone();
        async move {
            let mut most = 0;
            while !done.load(Ordering::Relaxed) {
                let sql = "SELECT COUNT(*) FROM jobs WHERE status = 'running' AND submitted_by = 'tenant'";
                most = most.max(watcher.query_one(sql, &[]).await.unwrap().get::<_, i64>(0));
            }
            most
        }
    });
    let claimed = Arc::new(AtomicUsize::new(0));
    let mut claimers = Vec::new();
    for (i, store) in replicas.iter().cycle().take(12).enumerate() {
        let (store, claimed) = (store.clone(), claimed.clone());
        claimers.push(tokio::spawn(async move {
            let claim = || claim(i);
            let count = |leases: &[leash::store::Lease]| {
                let theirs = leases.iter().filter(|l| l.job.submitted_by.as_deref() == Some("tenant")).count();
                claimed.fetch_add(theirs, Ordering::Relaxed);
            };
            let mut leases = store.job_claim(claim()).await.unwrap();
            count(&leases);
            let mut idle = 0;
            while idle < 20 {
                // The job's work: a moment in which other claimers race.
                tokio::time::sleep(Duration::from_millis(3)).await;
                let Some(lease) = leases.pop() else {
                    idle += 1;
                    leases = store.job_claim(claim()).await.unwrap();
                    count(&leases);
                    continue;
                };
                idle = 0;
                let finish = JobFinishParams {
                    id: lease.job.id,
                    token: lease.token.clone(),
                    finish: Finish::Succeeded { output: Vec::new() },
                    fuel_used: 0,
                    peak_memory_bytes: 0,
                    progress: None,
                    logs: None,
                    proposals: Vec::new(),
                    now: Timestamp::now(),
                };
                // Half the claimers finish and claim in one call.
                if i % 2 == 0 && leases.is_empty() {
                    let (finished, next) = store.job_finish_and_claim(finish, claim()).await.unwrap();
                    assert!(finished);
                    leases = next;
                    count(&leases);
                } else {
                    assert!(store.job_finish(finish).await.unwrap());
                }
            }
        }));
    }
    for claimer in claimers {
        claimer.await.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let most = watching.await.unwrap();
    assert_eq!(claimed.load(Ordering::Relaxed), 120, "every tenant job ran once");
    assert!(most <= CAP, "{most} of the tenant's jobs ran at once; its cap is {CAP}");
    assert_eq!(most, CAP, "the claimers raced up to the cap");
}

/// A capped claim counts its submitter's running jobs only once another
/// replica's capped claim has committed: run while that claim is open, the
/// count would miss the job it takes, and a cap of one would run two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_claim_waits_for_another_replica_s_capped_claim_to_commit() {
    use leash::access::{Principal, PrincipalCeilings, Role};
    use leash::clock::Timestamp;
    use leash::store::{JobClaimParams, Principals};
    let Some(url) = crate::support::pg::url() else { return };
    let schema = Schema::create(&url).await;
    let store = PostgresStore::open(&schema.url).await.unwrap();
    let ceilings = PrincipalCeilings { max_running: Some(1), ..Default::default() };
    let tenant =
        Principal { name: "tenant".into(), roles: [Role::Submit].into(), created_at: Timestamp::now(), ceilings };
    store.principal_put(tenant, None).await.unwrap();
    let job = NewJob { submitted_by: Some("tenant".into()), ..crate::store::conformance::cases::new_job("x") };
    let jobs = store.job_insert(JobInsertParams { jobs: vec![job.clone(), job], now: Timestamp::now() }).await.unwrap();

    // Another replica's capped claim, open: it holds the lock and has
    // taken the tenant's second job.
    let (other, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    other.batch_execute("BEGIN").await.unwrap();
    other
        .execute("SELECT pg_advisory_xact_lock(hashtext('leash capped claims ' || current_schema()))", &[])
        .await
        .unwrap();
    let taken = other
        .execute(
            "UPDATE jobs SET status = 'running', worker_id = 'worker-other', lease_token = 'other', \
             attempt = attempt + 1, started_at = $2::BIGINT, lease_expires_at = $2::BIGINT + 60000 WHERE job_id = $1",
            &[&jobs[1].id.to_string(), &Timestamp::now().unix_ms()],
        )
        .await
        .unwrap();
    assert_eq!(taken, 1);
    let pid: i32 = other.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);

    let claiming = tokio::spawn({
        let store = store.clone();
        async move {
            let params = JobClaimParams {
                worker_id: "worker-aaaaaaaa".into(),
                limit: 4,
                alone: false,
                lease_ttl: Duration::from_secs(60),
                now: Timestamp::now(),
                aged: 0,
            };
            store.job_claim(params).await.unwrap()
        }
    });
    eventually("the claim waits for the other replica's", async || {
        let sql = "SELECT COUNT(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))";
        (other.query_one(sql, &[&pid]).await.unwrap().get::<_, i64>(0) > 0).then_some(())
    })
    .await;
    other.batch_execute("COMMIT").await.unwrap();
    let claimed = claiming.await.unwrap();
    assert!(claimed.is_empty(), "the tenant runs its cap of one: {claimed:?}");
}
