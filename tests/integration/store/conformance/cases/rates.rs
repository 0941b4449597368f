//! Rate limits: a claim gives due jobs naming a limit their slots first,
//! and a job waits for its slot (`run_after` and `rate_slot` set, still
//! queued) instead of running over the limit; buckets by key; a slot held
//! up past its grace is given again; limits are set, read and removed,
//! audited.

use std::sync::Arc;
use std::time::Duration;

use leash::clock::Timestamp;
use leash::job::rate::{HOSTS_BUCKET, RESERVATION_GRACE, RateLimit, Reservation};
use leash::job::{Job, JobStatus, NewJob};
use leash::store::{AuditListParams, JobStore, RateLimitRemoveParams, RateReserveParams};

use super::{T0, claim, get, insert, new_job};

fn limited(input: &str, limit: &str, key: &str) -> NewJob {
    NewJob { rate_limit: Some(limit.into()), rate_key: key.into(), ..new_job(input) }
}

/// Insert `jobs` a millisecond apart, before `T0`: due order is their
/// order.
async fn insert_in_order(store: &dyn JobStore, jobs: Vec<NewJob>) -> Vec<Job> {
    let mut inserted = Vec::new();
    let first = T0.minus(Duration::from_millis(100));
    for (i, job) in jobs.into_iter().enumerate() {
        inserted.extend(insert(store, vec![job], first.plus(Duration::from_millis(i as u64))).await);
    }
    inserted
}

async fn set(store: &dyn JobStore, name: &str, rate: &str, burst: u32) -> RateLimit {
    let limit = RateLimit::new(name, rate.parse().unwrap(), burst, Some("ops".into()), T0).unwrap();
    store.rate_limit_set(limit).await.unwrap()
}

fn ms(n: u64) -> Timestamp {
    T0.plus(Duration::from_millis(n))
}

async fn inputs_claimed(store: &dyn JobStore, now: Timestamp) -> Vec<String> {
    claim(store, "worker-aaaaaaaa", 10, now)
        .await
        .iter()
        .map(|l| String::from_utf8(l.job.input.clone()).unwrap())
        .collect()
}

pub(crate) async fn a_backlog_over_its_limit_waits_for_evenly_spaced_slots(store: Arc<dyn JobStore>) {
    set(&*store, "api", "2/s", 1).await;
    let jobs = insert_in_order(&*store, (0..5).map(|i| limited(&format!("j{i}"), "api", "")).collect()).await;
    assert_eq!(inputs_claimed(&*store, T0).await, ["j0"], "one start now; the rest are over the limit");
    for (i, job) in jobs.iter().enumerate().skip(1) {
        let job = get(&*store, job.id).await;
        let slot = ms(500 * i as u64);
        assert_eq!(job.status, JobStatus::Queued, "over the limit it waits, it does not fail");
        assert_eq!((job.rate_slot, job.run_after), (Some(slot), slot), "j{i} waits for its slot");
        assert!(job.waiting_rate(T0) && !job.waiting_rate(slot));
        assert_eq!((job.attempt, job.retries), (0, 0), "waiting spends no attempt");
    }
    assert!(inputs_claimed(&*store, ms(499)).await.is_empty(), "not a moment early");
    assert_eq!(inputs_claimed(&*store, ms(500)).await, ["j1"]);
    // Claimed late (within the grace), j2 still starts on its slot.
    assert_eq!(inputs_claimed(&*store, ms(2000)).await, ["j2", "j3", "j4"]);
    assert_eq!(get(&*store, jobs[4].id).await.rate_slot, None, "a claim spends the slot");
}

pub(crate) async fn each_key_has_its_own_bucket_and_unlimited_jobs_pass_by(store: Arc<dyn JobStore>) {
    set(&*store, "per-org", "1/min", 1).await;
    let jobs = vec![
        limited("acme-1", "per-org", "acme"),
        limited("acme-2", "per-org", "acme"),
        limited("globex-1", "per-org", "globex"),
        new_job("free"),
    ];
    let jobs = insert_in_order(&*store, jobs).await;
    let mut now = inputs_claimed(&*store, T0).await;
    now.sort();
    assert_eq!(now, ["acme-1", "free", "globex-1"]);
    let waiting = get(&*store, jobs[1].id).await;
    assert_eq!(waiting.rate_slot, Some(T0.plus(Duration::from_secs(60))), "acme's second start, a minute on");
    assert_eq!(inputs_claimed(&*store, T0.plus(Duration::from_secs(60))).await, ["acme-2"]);
}

pub(crate) async fn a_burst_starts_at_once_then_the_rate(store: Arc<dyn JobStore>) {
    set(&*store, "api", "10/s", 3).await;
    insert_in_order(&*store, (0..5).map(|i| limited(&format!("j{i}"), "api", "")).collect()).await;
    assert_eq!(inputs_claimed(&*store, T0).await, ["j0", "j1", "j2"]);
    assert_eq!(inputs_claimed(&*store, ms(100)).await, ["j3"]);
    assert_eq!(inputs_claimed(&*store, ms(200)).await, ["j4"]);
}

/// Slots no claimer took within their grace (the workers were down) are
/// given again from the time a claim comes, so the held-up jobs do not
/// all start at once.
pub(crate) async fn slots_held_up_past_their_grace_are_given_again(store: Arc<dyn JobStore>) {
    set(&*store, "api", "1/s", 1).await;
    insert_in_order(&*store, (0..3).map(|i| limited(&format!("j{i}"), "api", "")).collect()).await;
    assert_eq!(claim(&*store, "worker-aaaaaaaa", 1, T0).await.len(), 1);
    let late = T0.plus(Duration::from_secs(10));
    assert!(Duration::from_secs(8) > RESERVATION_GRACE, "j1's and j2's slots are past their grace");
    assert_eq!(inputs_claimed(&*store, late).await, ["j1"], "one start at the late claim, not two");
    assert_eq!(inputs_claimed(&*store, late.plus(Duration::from_secs(1))).await, ["j2"]);
}

pub(crate) async fn limits_are_set_read_and_removed_audited_and_a_removed_one_limits_nothing(store: Arc<dyn JobStore>) {
    let first = set(&*store, "api", "2/s", 1).await;
    assert_eq!((first.rate.as_str(), first.count, first.per_ms, first.burst), ("2/s", 2, 1000, 1));
    let changed = set(&*store, "api", "100/min", 5).await;
    assert_eq!(store.rate_limit_get("api").await.unwrap(), Some(changed.clone()));
    set(&*store, "billing", "1/min", 1).await;
    let names: Vec<String> = store.rate_limits().await.unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["api", "billing"]);

    insert_in_order(&*store, (0..2).map(|i| limited(&format!("j{i}"), "billing", "")).collect()).await;
    assert_eq!(inputs_claimed(&*store, T0).await, ["j0"]);
    let remove = |name: &str| RateLimitRemoveParams { name: name.into(), actor: Some("ops".into()), now: ms(1) };
    assert!(store.rate_limit_remove(remove("billing")).await.unwrap());
    assert!(!store.rate_limit_remove(remove("billing")).await.unwrap(), "gone already");
    assert_eq!(store.rate_limit_get("billing").await.unwrap(), None);
    // j1's slot (a minute away) stands; past its grace, it is given a
    // slot again, now, with no limit left to count against.
    assert!(inputs_claimed(&*store, ms(2)).await.is_empty());
    let later = T0.plus(Duration::from_secs(60) + RESERVATION_GRACE + Duration::from_secs(1));
    assert_eq!(inputs_claimed(&*store, later).await, ["j1"]);

    let params = AuditListParams { after: None, principal: None, action: None, target: None, limit: 50 };
    let audit = store.audit_list(params).await.unwrap();
    let actions: Vec<(&str, &str)> = audit.iter().map(|r| (r.action.as_str(), r.target.as_str())).collect();
    for expected in [("rate_limit.set", "api"), ("rate_limit.set", "billing"), ("rate_limit.remove", "billing")] {
        assert!(actions.contains(&expected), "{expected:?} audited: {actions:?}");
    }
    let detail = |r: &leash::store::AuditRecord| serde_json::from_str::<serde_json::Value>(&r.detail).unwrap();
    let change = audit.iter().find(|r| r.action == "rate_limit.set" && detail(r)["before"]["rate"] == "2/s").unwrap();
    assert_eq!(detail(change)["after"]["rate"], "100/min");
    assert_eq!(change.principal.as_deref(), Some("ops"));
}

/// A job whose slot has come starts at it, before older jobs that were
/// not given one yet (they would only get later ones).
pub(crate) async fn a_slot_that_has_come_goes_before_older_jobs_given_none(store: Arc<dyn JobStore>) {
    set(&*store, "api", "1/s", 1).await;
    let jobs = insert_in_order(&*store, (0..2).map(|i| limited(&format!("j{i}"), "api", "")).collect()).await;
    assert_eq!(claim(&*store, "worker-aaaaaaaa", 2, T0).await.len(), 1, "j0 now; j1 is given the slot at 1 s");
    assert_eq!(get(&*store, jobs[1].id).await.rate_slot, Some(T0.plus(Duration::from_secs(1))));
    // Six older jobs, queued since before j1 and not given slots yet.
    let older = T0.minus(Duration::from_secs(10));
    for i in 0..6 {
        insert(&*store, vec![limited(&format!("old{i}"), "api", "")], older.plus(Duration::from_millis(i))).await;
    }
    let claimed = claim(&*store, "worker-aaaaaaaa", 1, T0.plus(Duration::from_secs(1))).await;
    let inputs: Vec<String> = claimed.iter().map(|l| String::from_utf8(l.job.input.clone()).unwrap()).collect();
    assert_eq!(inputs, ["j1"], "j1's slot came");
}

async fn reserve(store: &dyn JobStore, buckets: &[(&str, &str)], now: Timestamp, latest: Timestamp) -> Reservation {
    let buckets = buckets.iter().map(|(l, b)| (l.to_string(), b.to_string())).collect();
    store.rate_reserve(RateReserveParams { buckets, now, latest }).await.unwrap()
}

/// An outbound request takes its slot in every bucket that applies to it
/// together, the latest any gives; one whose slot is past the latest it
/// may wait for takes none; a bucket of a limit that is gone limits
/// nothing.
pub(crate) async fn outbound_requests_take_slots_together_and_a_late_one_takes_none(store: Arc<dyn JobStore>) {
    set(&*store, "slow", "2/s", 1).await;
    set(&*store, "fast", "10/s", 1).await;
    let key = ("fast", "egress:secret:KEY");
    let both = [key, ("slow", HOSTS_BUCKET)];
    let far = T0.plus(Duration::from_secs(60));
    assert_eq!(reserve(&*store, &both, T0, far).await, Reservation::At(T0));
    assert_eq!(reserve(&*store, &both, T0, far).await, Reservation::At(ms(500)), "the slow limit's slot");
    // The fast bucket was moved as if the request came at 500 ms.
    assert_eq!(reserve(&*store, &[key], T0, far).await, Reservation::At(ms(600)));
    assert_eq!(reserve(&*store, &both, T0, ms(999)).await, Reservation::TooLate(ms(1000)));
    assert_eq!(reserve(&*store, &both, T0, far).await, Reservation::At(ms(1000)), "the late one took nothing");
    assert_eq!(reserve(&*store, &[("gone", HOSTS_BUCKET)], T0, T0).await, Reservation::At(T0));
    store.rate_limit_remove(RateLimitRemoveParams { name: "slow".into(), actor: None, now: T0 }).await.unwrap();
    assert_eq!(reserve(&*store, &both, T0, far).await, Reservation::At(ms(1100)), "only the fast limit is left");
}

pub(crate) async fn a_limit_keeps_its_hosts_and_secrets(store: Arc<dyn JobStore>) {
    let limit = RateLimit::new("github", "5000/h".parse().unwrap(), 10, Some("ops".into()), T0)
        .unwrap()
        .with_egress(
            vec!["https://api.github.com".parse().unwrap(), "GET https://*.githubusercontent.com".parse().unwrap()],
            vec!["GH_TOKEN".parse().unwrap()],
        )
        .unwrap();
    assert_eq!(store.rate_limit_set(limit.clone()).await.unwrap(), limit);
    assert_eq!(store.rate_limit_get("github").await.unwrap(), Some(limit.clone()));
    assert_eq!(store.rate_limits().await.unwrap(), std::slice::from_ref(&limit));
    // Set again without them, it limits job starts only.
    let plain = set(&*store, "github", "5000/h", 10).await;
    let read = store.rate_limit_get("github").await.unwrap().unwrap();
    assert_eq!((read.hosts.len(), read.secrets.len()), (0, 0));
    assert_eq!(read, plain);
    let params = AuditListParams { after: None, principal: None, action: None, target: None, limit: 10 };
    let audit = store.audit_list(params).await.unwrap();
    let detail = |r: &leash::store::AuditRecord| serde_json::from_str::<serde_json::Value>(&r.detail).unwrap();
    let change = audit.iter().find(|r| detail(r)["before"].is_object()).expect("the second set is audited");
    assert_eq!(
        detail(change)["before"]["hosts"],
        serde_json::json!(["https://api.github.com", "GET https://*.githubusercontent.com"])
    );
    assert_eq!(detail(change)["before"]["secrets"], serde_json::json!(["GH_TOKEN"]));
    assert_eq!(detail(change)["after"]["hosts"], serde_json::json!([]));
}
