//! Conformance cases for [`Jobs`](leash::store::Jobs): inserting, reading,
//! listing, counting, cancelling, and decisions on gates.

use std::sync::Arc;
use std::time::Duration;

use leash::job::{
    Digest, Duties, ErrorKind, ExecutionMode, Gate, GateSource, Grants, JobId, JobStatus, NewJob, PluginName, Target,
    Verdict,
};
use leash::store::{
    CancelResult, DecideRefusal, Finish, JobDecision, JobInsertParams, JobListParams, JobStore, JobsDeleteParams,
    JobsExpireParams, StoreError,
};

use super::{
    APPROVAL_TTL, KEEP_EVENTS, QUEUE_TTL, T0, at, claim, claim_one, decide, decide_params, finish_params, gated_job,
    get, insert, insert_one, new_job, succeed,
};

pub(crate) async fn insert_then_get_round_trips_every_field(store: Arc<dyn JobStore>) {
    let mut job = new_job("in");
    job.target = Target::action("export").unwrap();
    job.max_attempts = 3;
    job.concurrency_key = Some("plan-7".into());
    job.plan_id = Some("01PLAN".into());
    let inserted = insert_one(&*store, job.clone(), T0).await;
    let got = get(&*store, inserted.id).await;
    assert_eq!(got, inserted);
    assert_eq!(got.status, JobStatus::Queued);
    assert_eq!(got.target, job.target);
    assert_eq!(got.input, b"in");
    assert_eq!(got.limits, job.limits);
    assert_eq!((got.max_attempts, got.attempt, got.lost_leases), (3, 0, 0));
    assert_eq!(got.concurrency_key.as_deref(), Some("plan-7"));
    assert_eq!(got.plan_id.as_deref(), Some("01PLAN"));
    assert_eq!(got.created_at, T0);
    assert_eq!(got.expires_at, T0.plus(QUEUE_TTL));
    assert_eq!(got.schema_version, leash::job::SCHEMA_VERSION);
    assert!(got.started_at.is_none() && got.finished_at.is_none() && got.lease_token.is_none());
    assert!(got.error_kind.is_none() && got.output.is_none());
}

/// What an insert answers is what a read of the stored row returns, for a
/// job with every optional field set, a gated one and a delayed one (a
/// store may build the answer rather than read it back).
pub(crate) async fn an_insert_answers_the_rows_as_stored(store: Arc<dyn JobStore>) {
    let mut grants = Grants::default();
    grants.http.hosts = vec!["GET https://api.example.com".parse().unwrap()];
    grants.http.limits.requests = 3;
    let full = NewJob {
        plugin_name: Some(PluginName::new("tool", "2.0.0").unwrap()),
        grants,
        max_attempts: 4,
        free_rerun_limit: 2,
        concurrency_key: Some("k".into()),
        idempotency: Some(leash::job::IdempotencyKey::new("full-1", "digest-1".to_owned()).unwrap()),
        deadline: Some(Duration::from_secs(20)),
        backoff: leash::job::Backoff { base: Duration::from_millis(250), cap: Duration::from_millis(9_000) },
        priority: 7,
        schedule_id: Some(leash::job::JobId::new(T0)),
        tags: vec!["env:prod".into(), "team/payments".into()],
        metadata: serde_json::json!({ "customer": "acme", "batch": 42 }).as_object().unwrap().clone(),
        ..new_job("full")
    };
    let gate = Gate {
        source: GateSource::Policy,
        run_on_approve: false,
        execution: ExecutionMode::Sync,
        deadline: Some(Duration::from_millis(15_000)),
        duties: Duties::default(),
    };
    let gated = NewJob { approval: Some(gate), ..new_job("gated") };
    let delayed = NewJob { run_at: Some(at(90)), ..new_job("delayed") };
    let answered = insert(&*store, vec![full, gated, delayed], T0).await;
    assert_eq!(
        answered.iter().map(|j| j.status).collect::<Vec<_>>(),
        [JobStatus::Queued, JobStatus::PendingApproval, JobStatus::Queued]
    );
    for job in &answered {
        assert_eq!(*job, get(&*store, job.id).await, "answered as stored");
    }
    assert!(answered[1].approval.is_some() && !answered[0].grants.is_none());
    assert_eq!(answered[2].run_after, at(90));
    assert_eq!(answered[0].deadline_at, Some(T0.plus(Duration::from_secs(20))));
}

pub(crate) async fn insert_refuses_zero_attempts_and_writes_nothing(store: Arc<dyn JobStore>) {
    let mut bad = new_job("bad");
    bad.max_attempts = 0;
    let err = store.job_insert(JobInsertParams { jobs: vec![new_job("ok"), bad], now: T0 }).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert_eq!(store.counts_snapshot().await.unwrap().total(), 0, "all or nothing");
}

pub(crate) async fn a_large_insert_returns_every_job_in_order(store: Arc<dyn JobStore>) {
    // Large enough for a store to split it (SQLite: statements of 256 rows, the rest one by one).
    let jobs: Vec<NewJob> = (0..600).map(|i| new_job(&i.to_string())).collect();
    let inserted = insert(&*store, jobs, T0).await;
    assert_eq!(inserted.len(), 600);
    for (i, job) in inserted.iter().enumerate() {
        assert_eq!(job.input, i.to_string().into_bytes(), "returned in the order given");
        assert_eq!(*job, get(&*store, job.id).await, "returned as stored");
    }
    let ids: std::collections::HashSet<JobId> = inserted.iter().map(|j| j.id).collect();
    assert_eq!(ids.len(), 600, "600 distinct jobs");
}

pub(crate) async fn an_idempotency_key_belongs_to_one_job_while_it_is_kept(store: Arc<dyn JobStore>) {
    let keyed = |digest: &str| NewJob {
        idempotency: Some(leash::job::IdempotencyKey::new("order-42", digest.to_owned()).unwrap()),
        ..new_job("keyed")
    };
    let first = insert_one(&*store, keyed("d1"), at(1)).await;
    for (digest, same) in [("d1", true), ("d2", false)] {
        let err = store.job_insert(JobInsertParams { jobs: vec![new_job("other"), keyed(digest)], now: at(2) }).await;
        match err {
            Err(StoreError::IdempotencyKeyTaken { key, job, same_request }) => {
                assert_eq!((key.as_str(), job, same_request), ("order-42", first.id, same));
            }
            other => panic!("expected the key to be taken, got {other:?}"),
        }
    }
    let counts = store.counts_snapshot().await.unwrap();
    assert_eq!(counts.total(), 1, "a refused insert wrote nothing");
    // A batch's replay finds its jobs by their keys; unknown keys are left out.
    let found = store.jobs_by_idempotency_key(vec!["order-42".into(), "order-43".into()]).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found["order-42"], (first.id, JobStatus::Queued));
    // Retention deletes the job and, with it, the key.
    let lease = claim_one(&*store, at(3)).await;
    assert!(store.job_finish(succeed(&lease, at(4))).await.unwrap());
    store
        .jobs_delete_expired(JobsDeleteParams {
            finished_before: at(5),
            events_before: KEEP_EVENTS,
            audit_before: None,
        })
        .await
        .unwrap();
    let again = insert_one(&*store, keyed("d2"), at(6)).await;
    assert_ne!(again.id, first.id);
}

pub(crate) async fn cancel_has_three_windows(store: Arc<dyn JobStore>) {
    let queued = insert_one(&*store, new_job("q"), T0).await;
    assert_eq!(store.job_cancel(queued.id, at(1), None).await.unwrap(), CancelResult::Cancelled);
    let got = get(&*store, queued.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Cancelled, Some(ErrorKind::Cancelled)));
    assert_eq!(got.finished_at, Some(at(1)));

    insert_one(&*store, new_job("r"), at(2)).await;
    let lease = claim_one(&*store, at(3)).await;
    assert_eq!(store.job_cancel(lease.job.id, at(4), None).await.unwrap(), CancelResult::Requested);
    let got = get(&*store, lease.job.id).await;
    assert_eq!(got.status, JobStatus::Running, "only the owner moves a running job");
    assert!(got.cancel_requested);
    assert_eq!(store.job_cancel(lease.job.id, at(5), None).await.unwrap(), CancelResult::Requested, "idempotent");
    let finish = Finish::Cancelled { message: "Cancelled: the plugin stopped when asked".into() };
    assert!(store.job_finish(finish_params(&lease, finish, at(6))).await.unwrap());

    assert_eq!(
        store.job_cancel(lease.job.id, at(7), None).await.unwrap(),
        CancelResult::AlreadyTerminal(JobStatus::Cancelled)
    );
    assert_eq!(
        store.job_cancel(queued.id, at(7), None).await.unwrap(),
        CancelResult::AlreadyTerminal(JobStatus::Cancelled)
    );
}

pub(crate) async fn cancel_of_an_unknown_job_is_not_found(store: Arc<dyn JobStore>) {
    assert_eq!(store.job_cancel(JobId::new(T0), at(1), None).await.unwrap(), CancelResult::NotFound);
    assert!(store.job_get(JobId::new(T0)).await.unwrap().is_none());
}

pub(crate) async fn counts_snapshot_matches_the_states(store: Arc<dyn JobStore>) {
    insert(&*store, (0..6).map(|i| new_job(&i.to_string())).collect(), T0).await;
    let leases = claim(&*store, "w", 4, at(1)).await;
    assert!(store.job_finish(succeed(&leases[0], at(2))).await.unwrap());
    let failed = Finish::Failed { kind: ErrorKind::GuestError, message: "Failed: x".into(), backtrace: None };
    assert!(store.job_finish(finish_params(&leases[1], failed, at(2))).await.unwrap());
    let counts = store.counts_snapshot().await.unwrap();
    assert_eq!((counts.queued, counts.running, counts.succeeded, counts.failed, counts.cancelled), (2, 2, 1, 1, 0));
    assert_eq!(counts.total(), 6);
}

pub(crate) async fn list_filters_pages_newest_first_without_payloads(store: Arc<dyn JobStore>) {
    let named = |input: &str, name: &str, version: &str| NewJob {
        plugin_name: Some(PluginName::new(name, version).unwrap()),
        plan_id: Some(format!("plan-{name}")),
        ..new_job(input)
    };
    let mut ids = Vec::new();
    for (i, job) in [
        named("a", "alpha", "1"),
        named("b", "alpha", "2"),
        named("c", "beta", "1"),
        NewJob { concurrency_key: Some("k".into()), ..new_job("d") },
        new_job("e"),
    ]
    .into_iter()
    .enumerate()
    {
        ids.push(insert_one(&*store, job, at(i as u64)).await.id);
    }
    store.job_finish(succeed(&claim_one(&*store, at(10)).await, at(11))).await.unwrap();
    let list = |params: JobListParams| {
        let store = store.clone();
        async move { store.job_list(params).await.unwrap().into_iter().map(|j| j.id).collect::<Vec<_>>() }
    };
    let all = list(JobListParams { limit: 100, ..Default::default() }).await;
    assert_eq!(all, ids.iter().rev().copied().collect::<Vec<_>>(), "newest first");
    let rows = store.job_list(JobListParams { limit: 100, ..Default::default() }).await.unwrap();
    assert!(rows.iter().all(|j| j.input.is_empty() && j.output.is_none()), "no payload bytes in lists");
    let page1 = list(JobListParams { limit: 2, ..Default::default() }).await;
    let page2 = list(JobListParams { limit: 2, before: page1.last().copied(), ..Default::default() }).await;
    assert_eq!([page1, page2].concat(), all[..4].to_vec(), "keyset pages join up");
    let by = |plugin: &str| JobListParams { plugin: Some(plugin.parse().unwrap()), limit: 100, ..Default::default() };
    assert_eq!(list(by("alpha")).await, vec![ids[1], ids[0]], "a name matches every version");
    assert_eq!(list(by("alpha@2")).await, vec![ids[1]]);
    assert_eq!(list(by(&Digest::of(b"plugin").to_string())).await.len(), 5);
    let status = JobListParams { status: vec![JobStatus::Succeeded], limit: 100, ..Default::default() };
    assert_eq!(list(status).await, vec![ids[0]], "the oldest job was claimed and finished");
    let running = claim_one(&*store, at(12)).await.job.id;
    let either =
        JobListParams { status: vec![JobStatus::Running, JobStatus::Succeeded], limit: 100, ..Default::default() };
    assert_eq!(list(either).await, vec![running, ids[0]], "any of several states");
    let neither =
        JobListParams { status: vec![JobStatus::Failed, JobStatus::Cancelled], limit: 100, ..Default::default() };
    assert!(list(neither).await.is_empty());
    let plan = JobListParams { plan_id: Some("plan-beta".into()), limit: 100, ..Default::default() };
    assert_eq!(list(plan).await, vec![ids[2]]);
    let key = JobListParams { concurrency_key: Some("k".into()), limit: 100, ..Default::default() };
    assert_eq!(list(key).await, vec![ids[3]]);
}

/// The dashboard's search: error text (in any case, `%` and `_` taken as
/// themselves), and a creation-time window.
pub(crate) async fn list_filters_by_error_text_kind_and_creation_time(store: Arc<dyn JobStore>) {
    let ids: Vec<JobId> = [
        insert_one(&*store, new_job("a"), at(0)).await,
        insert_one(&*store, NewJob { max_attempts: 2, ..new_job("b") }, at(1)).await,
    ]
    .into_iter()
    .chain([insert_one(&*store, new_job("c"), at(2)).await])
    .map(|j| j.id)
    .collect();
    let failed = claim_one(&*store, at(3)).await;
    let finish = Finish::Failed { kind: ErrorKind::Trap, message: "Trap: Boom at 100%_done".into(), backtrace: None };
    assert!(store.job_finish(finish_params(&failed, finish, at(4))).await.unwrap());
    let retried = claim_one(&*store, at(5)).await;
    assert!(store.job_retry(super::retry_params(&retried, at(60), at(6))).await.unwrap());
    assert_eq!((failed.job.id, retried.job.id), (ids[0], ids[1]));
    let list = |error: Option<&str>, after: Option<u64>, before: Option<u64>| {
        let store = store.clone();
        let params = JobListParams {
            error_contains: error.map(str::to_owned),
            created_after: after.map(at),
            created_before: before.map(at),
            limit: 100,
            ..Default::default()
        };
        async move { store.job_list(params).await.unwrap().into_iter().map(|j| j.id).collect::<Vec<_>>() }
    };
    assert_eq!(list(Some("boom"), None, None).await, [ids[0]], "any case");
    assert_eq!(list(Some("UPSTREAM IS DOWN"), None, None).await, [ids[1]], "a retried attempt's error");
    assert_eq!(list(Some("100%_d"), None, None).await, [ids[0]]);
    assert_eq!(list(Some("1_0"), None, None).await, Vec::<JobId>::new(), "`_` is no wildcard");
    assert_eq!(list(Some("m%d"), None, None).await, Vec::<JobId>::new(), "`%` is no wildcard");
    assert_eq!(list(None, Some(1), None).await, [ids[2], ids[1]], "created at or after");
    assert_eq!(list(None, None, Some(1)).await, [ids[0]], "created before");
    assert_eq!(list(None, Some(1), Some(2)).await, [ids[1]]);
    assert_eq!(list(Some("trap"), Some(1), None).await, Vec::<JobId>::new(), "filters combine");
    let kind = |kind: ErrorKind| {
        let store = store.clone();
        let params = JobListParams { error_kind: Some(kind), limit: 100, ..Default::default() };
        async move { store.job_list(params).await.unwrap().into_iter().map(|j| j.id).collect::<Vec<_>>() }
    };
    assert_eq!(kind(ErrorKind::Trap).await, [ids[0]], "by error kind");
    assert_eq!(kind(ErrorKind::Timeout).await, Vec::<JobId>::new());
}

pub(crate) async fn queued_count_matches_the_snapshot(store: Arc<dyn JobStore>) {
    assert_eq!(store.queued_count().await.unwrap(), 0);
    assert_eq!(store.oldest_queued_due().await.unwrap(), None, "nothing queued");
    insert(&*store, vec![new_job("a"), new_job("b"), new_job("c")], T0).await;
    let lease = claim_one(&*store, at(1)).await;
    store.job_finish(succeed(&lease, at(2))).await.unwrap();
    claim_one(&*store, at(3)).await;
    assert_eq!(store.queued_count().await.unwrap(), 1);
    assert_eq!(store.counts_snapshot().await.unwrap().queued, 1);
    assert_eq!(store.oldest_queued_due().await.unwrap(), Some(T0), "the one left could run from its submit");
    claim_one(&*store, at(4)).await;
    assert_eq!(store.oldest_queued_due().await.unwrap(), None, "running jobs are not queued");
}

pub(crate) async fn a_gated_job_waits_unclaimed_and_uncounted_as_queued(store: Arc<dyn JobStore>) {
    let gated = insert_one(&*store, gated_job("g", true), T0).await;
    assert_eq!(gated.status, JobStatus::PendingApproval);
    assert_eq!(gated.expires_at, T0.plus(APPROVAL_TTL), "it waits for its approval TTL");
    assert_eq!(gated.approval.as_ref().unwrap().required_by, GateSource::Request);
    assert!(claim(&*store, "w", 10, at(1)).await.is_empty(), "a job waiting for approval is never claimed");
    let counts = store.counts_snapshot().await.unwrap();
    assert_eq!((counts.pending_approval, counts.queued), (1, 0));
    assert_eq!(store.queued_count().await.unwrap(), 0);
    let listed = store
        .job_list(JobListParams { status: vec![JobStatus::PendingApproval], limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![gated.id], "listed by its state");
}

pub(crate) async fn approval_queues_the_job_and_records_the_decision(store: Arc<dyn JobStore>) {
    let gated = insert_one(&*store, gated_job("g", true), T0).await;
    let approved = decide(&*store, gated.id, JobDecision::Approve, "alice", at(10)).await.unwrap();
    assert_eq!(approved.status, JobStatus::Queued);
    assert_eq!(approved.expires_at, at(10).plus(QUEUE_TTL), "its queue TTL counts from the approval");
    let record = approved.approval.clone().unwrap();
    let decision = record.decision.unwrap();
    assert_eq!(
        (decision.verdict, decision.by.as_str(), decision.comment.as_deref(), decision.at),
        (Verdict::Approved, "alice", Some("alice says so"), at(10))
    );
    assert_eq!(record.triggered_at, Some(at(10)));
    assert_eq!(get(&*store, gated.id).await, approved, "the answer is the row as stored");
    let lease = claim_one(&*store, at(11)).await;
    assert_eq!(lease.job.id, gated.id);
    assert!(store.job_finish(succeed(&lease, at(12))).await.unwrap());
    assert_eq!(get(&*store, gated.id).await.approval.unwrap().decision.unwrap().by, "alice", "kept to the end");
}

pub(crate) async fn a_held_approval_waits_for_its_run_trigger(store: Arc<dyn JobStore>) {
    let gated = insert_one(&*store, gated_job("g", false), T0).await;
    let approved = decide(&*store, gated.id, JobDecision::Approve, "alice", at(10)).await.unwrap();
    assert_eq!(approved.status, JobStatus::Approved);
    assert_eq!(approved.expires_at, at(10).plus(APPROVAL_TTL), "it waits for its trigger up to the approval TTL");
    assert!(claim(&*store, "w", 10, at(11)).await.is_empty(), "approved but not triggered: never claimed");
    assert_eq!(store.counts_snapshot().await.unwrap().approved, 1);
    let run = decide(&*store, gated.id, JobDecision::Run, "-", at(20)).await.unwrap();
    assert_eq!(run.status, JobStatus::Queued);
    assert_eq!(run.approval.as_ref().unwrap().triggered_at, Some(at(20)), "queued at trigger time");
    assert_eq!(run.approval.unwrap().decision.unwrap().at, at(10), "the decision keeps its own time");
    assert_eq!(claim_one(&*store, at(21)).await.job.id, gated.id);
}

pub(crate) async fn a_rejection_cancels_with_kind_rejected(store: Arc<dyn JobStore>) {
    let gated = insert_one(&*store, gated_job("g", true), T0).await;
    let rejected = decide(&*store, gated.id, JobDecision::Reject, "bob", at(5)).await.unwrap();
    assert_eq!(rejected.status, JobStatus::Cancelled);
    assert_eq!(rejected.error_kind, Some(ErrorKind::Rejected));
    assert_eq!(rejected.error_message.as_deref(), Some("Rejected: by bob: bob says so"));
    assert_eq!(rejected.finished_at, Some(at(5)));
    assert_eq!(rejected.approval.unwrap().decision.unwrap().verdict, Verdict::Rejected);
    assert_eq!(rejected.attempt, 0, "it never ran");
    assert!(claim(&*store, "w", 10, at(6)).await.is_empty());
}

pub(crate) async fn decisions_the_state_does_not_allow_are_refused_and_change_nothing(store: Arc<dyn JobStore>) {
    // Approve twice: the second is refused.
    let gated = insert_one(&*store, gated_job("a", true), T0).await;
    decide(&*store, gated.id, JobDecision::Approve, "alice", at(1)).await.unwrap();
    let before = get(&*store, gated.id).await;
    for (decision, by) in [(JobDecision::Approve, "bob"), (JobDecision::Reject, "bob"), (JobDecision::Run, "-")] {
        let refused = decide(&*store, gated.id, decision, by, at(2)).await.unwrap_err();
        assert_eq!(refused, DecideRefusal::AlreadyDecided(JobStatus::Queued), "{decision:?}");
    }
    assert_eq!(get(&*store, gated.id).await, before, "a refused decision changes nothing");
    // A run before the approval.
    let waiting = insert_one(&*store, gated_job("b", false), T0).await;
    assert_eq!(
        decide(&*store, waiting.id, JobDecision::Run, "-", at(2)).await.unwrap_err(),
        DecideRefusal::NotApproved(JobStatus::PendingApproval)
    );
    // A rejection of an approved job that waits for its trigger.
    decide(&*store, waiting.id, JobDecision::Approve, "alice", at(3)).await.unwrap();
    assert_eq!(
        decide(&*store, waiting.id, JobDecision::Reject, "bob", at(4)).await.unwrap_err(),
        DecideRefusal::AlreadyDecided(JobStatus::Approved)
    );
    // A cancelled job, a job never gated, a job that does not exist.
    let cancelled = insert_one(&*store, gated_job("c", true), T0).await;
    assert_eq!(store.job_cancel(cancelled.id, at(1), None).await.unwrap(), CancelResult::Cancelled);
    assert_eq!(
        decide(&*store, cancelled.id, JobDecision::Approve, "alice", at(2)).await.unwrap_err(),
        DecideRefusal::Terminal(JobStatus::Cancelled)
    );
    let plain = insert_one(&*store, new_job("d"), T0).await;
    assert_eq!(
        decide(&*store, plain.id, JobDecision::Approve, "alice", at(2)).await.unwrap_err(),
        DecideRefusal::NotGated(JobStatus::Queued)
    );
    assert_eq!(
        decide(&*store, JobId::new(T0), JobDecision::Approve, "alice", at(2)).await.unwrap_err(),
        DecideRefusal::NotFound
    );
}

pub(crate) async fn two_approvals_racing_one_wins(store: Arc<dyn JobStore>) {
    for round in 0..5 {
        let gated = insert_one(&*store, gated_job(&format!("race {round}"), true), T0).await;
        let (a, b) = tokio::join!(
            store.job_decide(decide_params(gated.id, JobDecision::Approve, "alice", at(1))),
            store.job_decide(decide_params(gated.id, JobDecision::Reject, "bob", at(1)))
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(a.is_ok() != b.is_ok(), "exactly one decision wins: {a:?} / {b:?}");
        let winner = a.or(b).unwrap();
        assert_eq!(get(&*store, gated.id).await, winner, "the row is the winner's");
    }
}

pub(crate) async fn cancel_of_a_gated_job_is_immediate(store: Arc<dyn JobStore>) {
    let pending = insert_one(&*store, gated_job("p", true), T0).await;
    let held = insert_one(&*store, gated_job("h", false), T0).await;
    decide(&*store, held.id, JobDecision::Approve, "alice", at(1)).await.unwrap();
    for (id, message) in [
        (pending.id, "Cancelled: cancelled while waiting for approval"),
        (held.id, "Cancelled: cancelled after its approval, before its run was triggered"),
    ] {
        assert_eq!(store.job_cancel(id, at(2), None).await.unwrap(), CancelResult::Cancelled);
        let job = get(&*store, id).await;
        assert_eq!((job.status, job.error_kind), (JobStatus::Cancelled, Some(ErrorKind::Cancelled)));
        assert_eq!(job.error_message.as_deref(), Some(message));
    }
}

/// A cancel whose clock was read before an approval took the row (a busy
/// replica) is stamped no earlier than that approval, and says what it
/// cancelled: the approved job, not one still waiting.
pub(crate) async fn a_cancel_that_follows_a_decision_is_stamped_after_it(store: Arc<dyn JobStore>) {
    let held = insert_one(&*store, gated_job("h", false), T0).await;
    let queued = insert_one(&*store, gated_job("q", true), T0).await;
    decide(&*store, held.id, JobDecision::Approve, "alice", at(50)).await.unwrap();
    decide(&*store, queued.id, JobDecision::Approve, "alice", at(60)).await.unwrap();
    for (id, decided, message) in [
        (held.id, at(50), "Cancelled: cancelled after its approval, before its run was triggered"),
        (queued.id, at(60), "Cancelled: cancelled while queued"),
    ] {
        assert_eq!(store.job_cancel(id, at(40), None).await.unwrap(), CancelResult::Cancelled);
        let job = get(&*store, id).await;
        assert_eq!(job.finished_at, Some(decided), "stamped at the decision it followed, not before");
        assert_eq!(job.error_message.as_deref(), Some(message));
    }
}

pub(crate) async fn a_pending_approval_expires_after_its_ttl(store: Arc<dyn JobStore>) {
    let pending = insert_one(&*store, gated_job("p", true), T0).await;
    let held = insert_one(&*store, gated_job("h", false), T0).await;
    decide(&*store, held.id, JobDecision::Approve, "alice", at(100)).await.unwrap();
    let before_ttl = T0.plus(APPROVAL_TTL).minus(Duration::from_millis(1));
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: before_ttl }).await.unwrap(), 0);
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: T0.plus(APPROVAL_TTL) }).await.unwrap(), 1);
    let expired = get(&*store, pending.id).await;
    assert_eq!((expired.status, expired.error_kind), (JobStatus::Failed, Some(ErrorKind::Expired)));
    assert_eq!(expired.error_message.as_deref(), Some("Expired: no decision came within its approval TTL"));
    assert_eq!(get(&*store, held.id).await.status, JobStatus::Approved, "its TTL counts from its approval");
    let later = at(100).plus(APPROVAL_TTL);
    assert_eq!(store.jobs_expire_queued(JobsExpireParams { now: later }).await.unwrap(), 1);
    let expired = get(&*store, held.id).await;
    assert_eq!(expired.error_message.as_deref(), Some("Expired: approved, but its run was never triggered"));
}

/// A decision or a trigger after the TTL ran out is refused and expires
/// the job in the same write, whether or not a sweep ran.
pub(crate) async fn a_decision_past_the_approval_ttl_is_refused_and_expires_the_job(store: Arc<dyn JobStore>) {
    let pending = insert_one(&*store, gated_job("p", true), T0).await;
    let held = insert_one(&*store, gated_job("h", false), T0).await;
    let rejected = insert_one(&*store, gated_job("r", true), T0).await;
    decide(&*store, held.id, JobDecision::Approve, "alice", at(100)).await.unwrap();
    let past = T0.plus(APPROVAL_TTL);
    let refused = decide(&*store, pending.id, JobDecision::Approve, "alice", past).await;
    assert_eq!(refused.unwrap_err(), DecideRefusal::Expired, "an approval 0 ms past the TTL");
    let job = get(&*store, pending.id).await;
    assert_eq!((job.status, job.error_kind), (JobStatus::Failed, Some(ErrorKind::Expired)));
    assert_eq!(job.error_message.as_deref(), Some("Expired: no decision came within its approval TTL"));
    assert_eq!(job.finished_at, Some(past));
    assert!(job.approval.unwrap().decision.is_none(), "no decision is recorded");
    assert_eq!(
        decide(&*store, rejected.id, JobDecision::Reject, "bob", past.plus(Duration::from_secs(3600))).await,
        Err(DecideRefusal::Expired)
    );
    let trigger = decide(&*store, held.id, JobDecision::Run, "-", at(100).plus(APPROVAL_TTL)).await;
    assert_eq!(trigger.unwrap_err(), DecideRefusal::Expired, "a run triggered after an approved job's wait ran out");
    let job = get(&*store, held.id).await;
    assert_eq!(job.error_message.as_deref(), Some("Expired: approved, but its run was never triggered"));
    assert!(claim(&*store, "w", 10, at(100).plus(APPROVAL_TTL)).await.is_empty(), "nothing runs");
    // Refused again as over, not expired twice.
    let again = decide(&*store, pending.id, JobDecision::Approve, "alice", past).await;
    assert_eq!(again.unwrap_err(), DecideRefusal::Terminal(JobStatus::Failed));
}

pub(crate) async fn a_sync_gate_counts_its_deadline_from_the_trigger(store: Arc<dyn JobStore>) {
    let gate = Gate {
        source: GateSource::Policy,
        run_on_approve: true,
        execution: ExecutionMode::Sync,
        deadline: Some(Duration::from_millis(30_000)),
        duties: Duties::default(),
    };
    let job = NewJob { approval: Some(gate), deadline: Some(Duration::from_secs(30)), ..new_job("s") };
    let gated = insert_one(&*store, job, T0).await;
    assert_eq!(gated.deadline_at, None, "no deadline runs while it waits for a person");
    let queued = decide(&*store, gated.id, JobDecision::Approve, "alice", at(600)).await.unwrap();
    assert_eq!(queued.deadline_at, Some(at(630)));
    assert_eq!(queued.expires_at, at(630), "the deadline caps the queue TTL");
    assert_eq!(queued.approval.unwrap().execution, ExecutionMode::Sync);
}
