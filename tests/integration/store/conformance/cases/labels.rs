//! Tags and metadata: kept with the job, read back whole, and listed by
//! from their own index (all tags, any tag, metadata entries), with a
//! deleted job's labels gone with it.

use std::sync::Arc;

use leash::job::NewJob;
use leash::store::{JobInsertParams, JobListParams, JobStore, JobsDeleteParams};

use super::{KEEP_EVENTS, T0, at, claim, insert, new_job, succeed};

fn labelled(input: &str, tags: &[&str], metadata: serde_json::Value) -> NewJob {
    NewJob {
        tags: tags.iter().map(|t| t.to_string()).collect(),
        metadata: metadata.as_object().unwrap().clone(),
        ..new_job(input)
    }
}

async fn listed(store: &dyn JobStore, params: JobListParams) -> Vec<String> {
    let jobs = store.job_list(JobListParams { limit: 100, ..params }).await.unwrap();
    let mut inputs: Vec<String> = jobs.iter().map(|j| j.id.to_string()).collect();
    inputs.sort();
    inputs
}

fn ids(jobs: &[&leash::job::Job]) -> Vec<String> {
    let mut ids: Vec<String> = jobs.iter().map(|j| j.id.to_string()).collect();
    ids.sort();
    ids
}

pub(crate) async fn jobs_are_listed_by_tags_and_metadata_and_lose_them_when_deleted(store: Arc<dyn JobStore>) {
    // `a` first: it is the one claimed and deleted below.
    let first = labelled("a", &["env:prod", "team/pay"], serde_json::json!({ "customer": "acme", "batch": 42 }));
    let mut jobs = insert(&*store, vec![first], T0).await;
    let rest = vec![
        labelled("b", &["env:prod"], serde_json::json!({ "customer": "globex", "dry_run": true })),
        labelled("c", &["env:test", "team/pay"], serde_json::json!({ "customer": "acme" })),
        new_job("d"),
    ];
    jobs.extend(insert(&*store, rest, T0.plus(std::time::Duration::from_millis(1))).await);
    let (a, b, c) = (&jobs[0], &jobs[1], &jobs[2]);
    let read = store.job_get(a.id).await.unwrap().unwrap();
    assert_eq!((read.tags.clone(), read.metadata.clone()), (a.tags.clone(), a.metadata.clone()), "read back whole");
    assert!(store.job_get(jobs[3].id).await.unwrap().unwrap().tags.is_empty());

    let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let meta = |m: serde_json::Value| m.as_object().unwrap().clone();
    let all = |t: &[&str]| JobListParams { tags: tags(t), ..JobListParams::default() };
    assert_eq!(listed(&*store, all(&["env:prod"])).await, ids(&[a, b]));
    assert_eq!(listed(&*store, all(&["env:prod", "team/pay"])).await, ids(&[a]), "every tag");
    let any = JobListParams { any_tag: true, ..all(&["env:test", "team/pay"]) };
    assert_eq!(listed(&*store, any).await, ids(&[a, c]), "any tag");
    let by_meta = |m| JobListParams { metadata: meta(m), ..JobListParams::default() };
    assert_eq!(listed(&*store, by_meta(serde_json::json!({ "customer": "acme" }))).await, ids(&[a, c]));
    assert_eq!(listed(&*store, by_meta(serde_json::json!({ "batch": 42 }))).await, ids(&[a]), "a number");
    assert_eq!(listed(&*store, by_meta(serde_json::json!({ "dry_run": true }))).await, ids(&[b]), "a boolean");
    assert_eq!(listed(&*store, by_meta(serde_json::json!({ "batch": "42" }))).await, ids(&[a]), "as its text");
    let both = JobListParams { metadata: meta(serde_json::json!({ "customer": "acme" })), ..all(&["env:prod"]) };
    assert_eq!(listed(&*store, both).await, ids(&[a]), "tags and metadata together");
    assert!(listed(&*store, all(&["nowhere"])).await.is_empty());

    let refused =
        store.job_insert(JobInsertParams { jobs: vec![labelled("x", &["a b"], serde_json::json!({}))], now: T0 }).await;
    assert!(refused.unwrap_err().to_string().contains("tag \"a b\" is not valid"), "refused whole");

    // Run and delete `a`: a later job with its tag is found beside `c`
    // (a label row left behind matches no job, so this cannot see one:
    // `a_deleted_job_takes_its_label_rows` counts them, per backend).
    let lease = claim(&*store, "worker-aaaaaaaa", 1, at(1)).await.pop().unwrap();
    assert_eq!(lease.job.id, a.id);
    assert!(store.job_finish(succeed(&lease, at(2))).await.unwrap());
    let params = JobsDeleteParams { finished_before: at(10), events_before: KEEP_EVENTS, audit_before: None };
    assert_eq!(store.jobs_delete_expired(params).await.unwrap(), 1);
    let later = insert(&*store, vec![labelled("e", &["team/pay"], serde_json::json!({}))], at(20)).await;
    assert_eq!(listed(&*store, all(&["team/pay"])).await, ids(&[c, &later[0]]));
}

/// A deleted job takes its label rows with it, so none are left to grow
/// with retention; `count` reads the backend's `job_labels` rows (the
/// store's API cannot see a row that matches no job).
pub(crate) async fn a_deleted_job_takes_its_label_rows(store: Arc<dyn JobStore>, count: impl AsyncFn() -> i64) {
    insert(&*store, vec![labelled("a", &["x", "y"], serde_json::json!({ "k": "v" }))], T0).await;
    assert_eq!(count().await, 3, "two tags and one entry");
    let lease = claim(&*store, "worker-aaaaaaaa", 1, at(1)).await.pop().unwrap();
    assert!(store.job_finish(succeed(&lease, at(2))).await.unwrap());
    let params = JobsDeleteParams { finished_before: at(10), events_before: KEEP_EVENTS, audit_before: None };
    assert_eq!(store.jobs_delete_expired(params).await.unwrap(), 1);
    assert_eq!(count().await, 0);
}
