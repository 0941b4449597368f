//! Conformance cases for [`Effects`](leash::store::Effects): the effect
//! ledger and what it decides about lost attempts.

use std::sync::Arc;
use std::time::Duration;

use leash::clock::Timestamp;
use leash::job::{EffectOutcome, ErrorKind, JobStatus, NewJob, Proposal};
use leash::store::{
    EffectBeginParams, EffectEndParams, Finish, JobClaimParams, JobFinishParams, JobStore, JobsDeleteParams,
    ReclaimReport,
};

use super::{
    KEEP_EVENTS, T0, TTL, answered, at, claim, claim_one, finish_params, get, insert_one, intent, new_job, reclaim,
    release_params, retry_params, succeed,
};

pub(crate) async fn a_lost_lease_without_effects_reruns_free_until_its_limit(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, NewJob { free_rerun_limit: 2, ..new_job("free") }, T0).await;
    let mut now = at(1);
    for n in 1..=2 {
        claim_one(&*store, now).await;
        now = now.plus(TTL);
        assert_eq!(
            reclaim(&*store, now).await,
            ReclaimReport { requeued: 1, failed: 0, quarantined: 0 },
            "free re-run {n}"
        );
        let got = get(&*store, job.id).await;
        assert_eq!((got.status, got.attempt, got.lost_leases, got.free_reruns), (JobStatus::Queued, n, 0, n));
        let last_error = got.last_error.unwrap();
        assert!(
            last_error.contains("no effect was recorded") && last_error.contains(&format!("{n} of 2")),
            "{last_error}"
        );
        now = now.plus(Duration::from_secs(301)); // past any backoff
    }
    claim_one(&*store, now).await;
    now = now.plus(TTL);
    assert_eq!(
        reclaim(&*store, now).await,
        ReclaimReport { requeued: 0, failed: 1, quarantined: 0 },
        "the limit is reached"
    );
    let got = get(&*store, job.id).await;
    assert_eq!(
        (got.status, got.error_kind, got.attempt, got.lost_leases),
        (JobStatus::Failed, Some(ErrorKind::LeaseLost), 3, 1)
    );
    let message = got.error_message.unwrap();
    assert!(message.contains("Heartbeat timeout") && message.contains("re-run 2 times"), "{message}");
}

pub(crate) async fn a_lost_lease_after_an_effect_spends_the_attempt_and_names_the_effect(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, NewJob { free_rerun_limit: 3, ..new_job("fx") }, T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let sent = intent(&*store, &lease, "sent", at(2)).await;
    answered(&*store, job.id, &sent, 202, at(3)).await;
    intent(&*store, &lease, "in-flight", at(4)).await;
    intent(&*store, &lease, "also-in-flight", at(5)).await;
    assert_eq!(reclaim(&*store, at(5).plus(TTL)).await, ReclaimReport { requeued: 0, failed: 1, quarantined: 0 });
    let got = get(&*store, job.id).await;
    assert_eq!(
        (got.status, got.error_kind, got.free_reruns, got.lost_leases),
        (JobStatus::Failed, Some(ErrorKind::LeaseLost), 0, 1)
    );
    let message = got.error_message.unwrap();
    assert!(
        message.contains(
            "effect #2 (POST https://api.example.com/in-flight) (and 1 more) was in flight: its outcome is unknown"
        ),
        "{message}"
    );
    assert!(claim(&*store, "w", 10, at(1000)).await.is_empty(), "never run again");

    // With attempts left it runs again, the attempt spent, and an effect
    // whose outcome is known is named as the last one.
    let job = insert_one(&*store, NewJob { max_attempts: 2, free_rerun_limit: 3, ..new_job("fx2") }, at(1000)).await;
    let lease = claim_one(&*store, at(1001)).await;
    let sent = intent(&*store, &lease, "done", at(1002)).await;
    answered(&*store, job.id, &sent, 200, at(1003)).await;
    assert_eq!(reclaim(&*store, at(1003).plus(TTL)).await, ReclaimReport { requeued: 1, failed: 0, quarantined: 0 });
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.lost_leases, got.free_reruns), (JobStatus::Queued, 1, 0));
    let last_error = got.last_error.unwrap();
    assert!(
        last_error.contains("its last effect, #1 (POST https://api.example.com/done), answered 200"),
        "{last_error}"
    );
}

pub(crate) async fn a_release_after_an_effect_spends_an_attempt(store: Arc<dyn JobStore>) {
    // No effect: a release costs nothing, as ever.
    let quiet = insert_one(&*store, new_job("quiet"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    assert!(store.job_release(release_params(&lease, at(1), at(1))).await.unwrap());
    let got = get(&*store, quiet.id).await;
    assert_eq!((got.status, got.releases, got.retries), (JobStatus::Queued, 1, 0));
    store.job_cancel(quiet.id, at(2), None).await.unwrap();

    // An effect with attempts left: queued again, an attempt spent.
    let job = insert_one(&*store, NewJob { max_attempts: 2, ..new_job("loud") }, at(3)).await;
    let lease = claim_one(&*store, at(4)).await;
    intent(&*store, &lease, "charge", at(5)).await;
    assert!(store.job_release(release_params(&lease, at(6), at(6))).await.unwrap());
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.releases, got.retries), (JobStatus::Queued, 0, 1));
    assert!(got.last_error.unwrap().starts_with("interrupted: "));

    // And with none left: it ends as interrupted, naming the effect.
    let lease = claim_one(&*store, at(400)).await;
    assert_eq!(lease.job.id, job.id);
    intent(&*store, &lease, "refund", at(401)).await;
    assert!(store.job_release(release_params(&lease, at(402), at(402))).await.unwrap());
    let got = get(&*store, job.id).await;
    assert_eq!((got.status, got.error_kind), (JobStatus::Failed, Some(ErrorKind::Interrupted)));
    let message = got.error_message.unwrap();
    assert!(message.contains("#1 (POST https://api.example.com/refund) was in flight"), "{message}");
    assert_eq!(got.finished_at, Some(at(402)));
    assert!(
        !store.job_release(release_params(&lease, at(403), at(403))).await.unwrap(),
        "a stale token changes nothing"
    );
}

pub(crate) async fn effects_are_recorded_only_under_the_lease_and_numbered_per_attempt(store: Arc<dyn JobStore>) {
    let job = insert_one(&*store, NewJob { max_attempts: 2, ..new_job("fx") }, T0).await;
    let begin = |token: &str, method: &str, now: Timestamp| {
        let store = store.clone();
        let params = EffectBeginParams {
            id: job.id,
            token: token.to_owned(),
            method: method.to_owned(),
            url: "https://api.example.com/charge".into(),
            proposal: None,
            now,
        };
        async move { store.effect_begin(params).await.unwrap() }
    };
    assert_eq!(begin("no-such-token", "POST", at(1)).await, None, "a queued job records nothing");
    let first = claim_one(&*store, at(1)).await;
    assert_eq!(begin("wrong", "POST", at(2)).await, None, "another token records nothing");
    let one = begin(&first.token, "POST", at(2)).await.expect("recorded under the lease");
    let two = begin(&first.token, "DELETE", at(3)).await.expect("recorded");
    assert_eq!((one.attempt, one.seq, two.seq), (1, 1, 2));
    assert_eq!(one.idempotency_key, format!("{}/1", job.id));
    assert_eq!((one.finished_at, one.status), (None, None), "an intent has no outcome yet");
    let end = |attempt: u32, seq: u32, outcome: EffectOutcome, now: Timestamp| {
        let store = store.clone();
        let params = EffectEndParams { id: job.id, attempt, seq, outcome, now };
        async move { store.effect_end(params).await.unwrap() }
    };
    end(1, 1, EffectOutcome::Status(201), at(4)).await;
    end(1, 2, EffectOutcome::Error("connection reset".into()), at(5)).await;
    end(1, 2, EffectOutcome::Status(200), at(6)).await;

    // The next attempt numbers its effects from 1 again, so a replay
    // carries the same idempotency keys; the old token is fenced out.
    store.job_retry(retry_params(&first, at(6), at(6))).await.unwrap();
    let second = claim_one(&*store, at(7)).await;
    assert_eq!(begin(&first.token, "POST", at(8)).await, None, "the old attempt can record nothing");
    let again = begin(&second.token, "POST", at(8)).await.expect("recorded");
    assert_eq!((again.attempt, again.seq, &again.idempotency_key), (2, 1, &one.idempotency_key));

    let effects = store.effects(job.id).await.unwrap();
    let summary: Vec<_> = effects
        .iter()
        .map(|e| (e.attempt, e.seq, e.method.as_str(), e.status, e.error.as_deref(), e.finished_at))
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, 1, "POST", Some(201), None, Some(at(4))),
            (1, 2, "DELETE", None, Some("connection reset"), Some(at(5))),
            (2, 1, "POST", None, None, None),
        ],
        "an outcome is recorded once"
    );
    assert_eq!(effects[0].started_at, at(2));

    // Retention takes a job's effects with it.
    store.job_finish(succeed(&second, at(9))).await.unwrap();
    let deleted = store
        .jobs_delete_expired(JobsDeleteParams {
            finished_before: at(100),
            events_before: KEEP_EVENTS,
            audit_before: None,
        })
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(store.effects(job.id).await.unwrap(), vec![]);
}

pub(crate) async fn proposals_land_with_a_success_and_an_answered_proposal_is_recorded_once(store: Arc<dyn JobStore>) {
    let proposal = |n: u32, body: &[u8]| Proposal {
        n,
        method: "PUT".into(),
        url: format!("https://api.example.com/records/{n}?v=1"),
        headers: vec![("content-type".into(), "text/plain".into()), ("authorization".into(), "{secret:T}".into())],
        body: body.to_vec(),
    };
    // A failure's proposals are dropped with it.
    let failed = insert_one(&*store, new_job("proposes-then-fails"), T0).await;
    let lease = claim_one(&*store, at(1)).await;
    let finish = Finish::Failed { kind: ErrorKind::GuestError, message: "GuestError: no".into(), backtrace: None };
    let params = JobFinishParams { proposals: vec![proposal(1, b"x")], ..finish_params(&lease, finish, at(2)) };
    assert!(store.job_finish(params).await.unwrap());
    assert_eq!(store.plan_proposals(failed.id).await.unwrap(), vec![], "a failure keeps none");

    // A success's, all of them, bytes as they were, by number.
    let execute = insert_one(&*store, new_job("proposes"), at(3)).await;
    let lease = claim_one(&*store, at(4)).await;
    let mut proposed: Vec<Proposal> = (1..=300).map(|n| proposal(n, format!("value {n}").as_bytes())).collect();
    proposed.push(proposal(301, &[0xff, 0x00, 0xfe]));
    let params = JobFinishParams { proposals: proposed.clone(), ..succeed(&lease, at(5)) };
    assert!(
        store
            .job_finish_and_claim(
                params,
                JobClaimParams {
                    worker_id: "worker-aaaaaaaa".into(),
                    limit: 1,
                    alone: true,
                    lease_ttl: TTL,
                    now: at(5),
                    aged: 0,
                }
            )
            .await
            .unwrap()
            .0
    );
    assert_eq!(store.plan_proposals(execute.id).await.unwrap(), proposed);

    // An apply's effect names the proposal it sends; once answered, no
    // attempt records it again; unanswered (in doubt), it may be.
    let apply = insert_one(&*store, NewJob { max_attempts: 2, ..new_job("applies") }, at(6)).await;
    let first = claim_one(&*store, at(7)).await;
    let begin = |token: &str, proposal: Option<u32>, now: Timestamp| {
        let store = store.clone();
        let params = EffectBeginParams {
            id: apply.id,
            token: token.to_owned(),
            method: "PUT".into(),
            url: "https://api.example.com/records/1".into(),
            proposal,
            now,
        };
        async move { store.effect_begin(params).await.unwrap() }
    };
    let one = begin(&first.token, Some(1), at(8)).await.expect("recorded");
    assert_eq!((one.proposal, one.idempotency_key.clone()), (Some(1), format!("{}/proposal/1", apply.id)));
    let again = begin(&first.token, Some(1), at(9)).await.expect("in doubt: recorded again");
    assert_eq!((again.seq, &again.idempotency_key), (2, &one.idempotency_key), "the same key");
    let end = EffectEndParams { id: apply.id, attempt: 1, seq: 2, outcome: EffectOutcome::Status(204), now: at(10) };
    store.effect_end(end).await.unwrap();
    assert_eq!(begin(&first.token, Some(1), at(11)).await, None, "answered: never recorded again");
    store.job_retry(retry_params(&first, at(11), at(11))).await.unwrap();
    let second = claim_one(&*store, at(12)).await;
    assert_eq!(begin(&second.token, Some(1), at(13)).await, None, "nor in a later attempt");
    assert!(begin(&second.token, Some(2), at(13)).await.is_some(), "another proposal is");
    assert!(begin(&second.token, None, at(14)).await.is_some(), "an effect that sends none is");
    let numbered: Vec<Option<u32>> = store.effects(apply.id).await.unwrap().iter().map(|e| e.proposal).collect();
    assert_eq!(numbered, [Some(1), Some(1), Some(2), None]);
}
