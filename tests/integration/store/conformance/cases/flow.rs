//! Flow control in the claim: priorities (highest first, due order within
//! one, jobs due later never in the way), the aged share that bounds
//! starvation, and paused plugins whose jobs wait.

use std::sync::Arc;

use leash::job::{ErrorKind, JobId, JobStatus, NewJob};
use leash::store::{AGED_AFTER, JobClaimParams, JobInsertParams, JobStore};

use super::{T0, TTL, at, claim, insert, insert_one, new_job};

fn with_priority(input: &str, priority: u8) -> NewJob {
    NewJob { priority, ..new_job(input) }
}

fn ids(leases: &[leash::store::Lease]) -> Vec<JobId> {
    leases.iter().map(|l| l.job.id).collect()
}

pub(crate) async fn under_a_ten_thousand_job_backlog_the_first_claims_take_the_highest_priority(
    store: Arc<dyn JobStore>,
) {
    // 10,000 queued jobs, priorities spread 0 to 9 (a stride that visits
    // each level in turn), inserted in batches a second apart: the job
    // order within one priority is its due order.
    let mut jobs = Vec::new();
    for batch in 0..10u64 {
        let batch_jobs: Vec<NewJob> =
            (0..1000u64).map(|i| with_priority(&format!("{batch}-{i}"), ((i * 7 + batch) % 10) as u8)).collect();
        jobs.extend(insert(&*store, batch_jobs, at(batch)).await);
    }
    let mut expected: Vec<_> = jobs.iter().filter(|j| j.priority == 0).map(|j| (j.run_after, j.id)).collect();
    expected.sort();
    let expected: Vec<JobId> = expected.into_iter().take(100).map(|(_, id)| id).collect();
    let mut claimed = Vec::new();
    for round in 0..10 {
        claimed.extend(ids(&claim(&*store, &format!("worker-{round:08}"), 10, at(20)).await));
    }
    assert_eq!(claimed, expected, "the first 100 claimed are priority 0's first 100, in due order");
}

pub(crate) async fn a_job_due_later_holds_back_no_lower_priority(store: Arc<dyn JobStore>) {
    let refused = store.job_insert(JobInsertParams { jobs: vec![with_priority("ten", 10)], now: T0 }).await;
    assert!(refused.unwrap_err().to_string().contains("priority 10 is out of range"), "0 to 9 only");

    // Priority 0, but delayed: it is not in the way of a due priority 9.
    let later = insert_one(&*store, NewJob { run_at: Some(at(100)), ..with_priority("later", 0) }, T0).await;
    let low = insert_one(&*store, with_priority("low", 9), T0).await;
    let middle = insert_one(&*store, with_priority("middle", 4), at(1)).await;
    assert_eq!(ids(&claim(&*store, "worker-aaaaaaaa", 1, at(2)).await), [middle.id], "priority before age");
    assert_eq!(ids(&claim(&*store, "worker-aaaaaaaa", 5, at(2)).await), [low.id], "the delayed one waits");
    assert_eq!(ids(&claim(&*store, "worker-aaaaaaaa", 5, at(100)).await), [later.id]);
}

pub(crate) async fn an_aged_job_takes_the_aged_share_whatever_its_priority(store: Arc<dyn JobStore>) {
    let aged = AGED_AFTER.as_secs();
    let old = insert_one(&*store, with_priority("old", 9), T0).await;
    let mut urgent = Vec::new();
    for i in 0..6 {
        urgent.push(insert_one(&*store, with_priority(&format!("u{i}"), 0), at(1 + i)).await.id);
    }
    let claim_with = async |share: u32, now| {
        let params = JobClaimParams {
            worker_id: "worker-aaaaaaaa".into(),
            limit: 2,
            alone: false,
            lease_ttl: TTL,
            now,
            aged: share,
        };
        ids(&store.job_claim(params).await.unwrap())
    };
    // Due for less than the aged time: the share finds nothing aged.
    assert_eq!(claim_with(1, at(aged - 1)).await, urgent[..2], "priority order");
    // Aged, but this claim has no share: priority order still.
    assert_eq!(claim_with(0, at(aged + 1)).await, urgent[2..4]);
    // A claim with a share takes the aged job first, then priority order.
    assert_eq!(claim_with(1, at(aged + 1)).await, [old.id, urgent[4]], "the aged share, then the rest");
}

pub(crate) async fn a_capped_submitter_s_jobs_go_by_priority_too(store: Arc<dyn JobStore>) {
    use leash::access::{Principal, PrincipalCeilings, Role};
    let tenant = Principal {
        name: "tenant".into(),
        roles: [Role::Submit].into(),
        created_at: T0,
        ceilings: PrincipalCeilings { max_running: Some(2), ..Default::default() },
    };
    store.principal_put(tenant, None).await.unwrap();
    let theirs =
        |input: &str, priority| NewJob { submitted_by: Some("tenant".into()), ..with_priority(input, priority) };
    let first = insert_one(&*store, theirs("first", 5), T0).await;
    let urgent = insert_one(&*store, theirs("urgent", 0), at(1)).await;
    let middle = insert_one(&*store, theirs("middle", 3), at(2)).await;
    let claimed = ids(&claim(&*store, "worker-aaaaaaaa", 10, at(3)).await);
    assert_eq!(claimed, [urgent.id, middle.id], "its two highest, within its cap of two");
    assert_eq!(ids(&claim(&*store, "worker-aaaaaaaa", 10, at(4)).await), [], "at its cap");
    let _ = first;
}

pub(crate) async fn a_paused_plugin_s_jobs_wait_and_a_resume_frees_them_in_due_order(store: Arc<dyn JobStore>) {
    use leash::job::PluginName;
    use leash::store::{AuditListParams, PauseParams, ResumeParams};
    let named = |input: &str, name: &str| NewJob {
        plugin_name: Some(PluginName::new(name, "1").unwrap()),
        max_attempts: 2,
        ..new_job(input)
    };
    let first = insert_one(&*store, named("a1", "a"), T0).await;
    let waiting = insert_one(&*store, named("a-queued", "a"), at(1)).await;
    let other = insert_one(&*store, named("b1", "b"), at(2)).await;
    let running = claim(&*store, "worker-aaaaaaaa", 1, at(3)).await.pop().unwrap();
    assert_eq!(running.job.id, first.id);

    let pause = |reason: &str, now| PauseParams {
        name: "a".into(),
        actor: Some("olive".into()),
        reason: Some(reason.into()),
        now,
    };
    let paused = store.plugin_pause(pause("quota spent", at(4))).await.unwrap();
    assert_eq!((paused.paused_at, paused.paused_by.as_deref()), (at(4), Some("olive")));
    // Queued while paused, and queued again (a retry) while paused.
    let later = insert_one(&*store, named("a-later", "a"), at(5)).await;
    assert!(store.job_retry(super::retry_params(&running, at(6), at(6))).await.unwrap());
    assert_eq!(ids(&claim(&*store, "worker-aaaaaaaa", 10, at(7)).await), [other.id], "only the other plugin's");
    assert!(claim(&*store, "worker-aaaaaaaa", 10, at(7)).await.is_empty(), "nothing of a paused plugin");

    // A held job's queue TTL keeps counting.
    let short = NewJob { queue_ttl: std::time::Duration::from_secs(2), ..named("a-short", "a") };
    let short = insert_one(&*store, short, at(7)).await;
    store.jobs_expire_queued(leash::store::JobsExpireParams { now: at(9) }).await.unwrap();
    let expired = super::get(&*store, short.id).await;
    assert_eq!((expired.status, expired.error_kind), (JobStatus::Failed, Some(ErrorKind::Expired)));

    // Pausing again keeps the first pause.
    let again = store.plugin_pause(pause("second", at(8))).await.unwrap();
    assert_eq!(again, paused, "the first pause stands");
    assert_eq!(store.plugin_pauses().await.unwrap(), vec![paused]);

    let resume = |now| ResumeParams { name: "a".into(), actor: Some("olive".into()), now };
    assert!(store.plugin_resume(resume(at(9))).await.unwrap());
    assert!(store.plugin_pauses().await.unwrap().is_empty());
    let freed = ids(&claim(&*store, "worker-aaaaaaaa", 10, at(10)).await);
    assert_eq!(freed, [waiting.id, later.id, first.id], "in due order: the retry is due last");
    assert!(!store.plugin_resume(resume(at(11))).await.unwrap(), "not paused: nothing to resume");

    let audited =
        store.audit_list(AuditListParams { target: Some("a".into()), limit: 10, ..Default::default() }).await.unwrap();
    let actions: Vec<(&str, Option<&str>)> =
        audited.iter().map(|r| (r.action.as_str(), r.principal.as_deref())).collect();
    assert_eq!(actions, [("plugin.pause", Some("olive")), ("plugin.resume", Some("olive"))], "once each");
    assert!(audited[0].detail.contains("quota spent"), "{}", audited[0].detail);
}
