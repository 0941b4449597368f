//! Conformance cases for [`Plans`](leash::store::Plans): a plan and its phases.

use std::sync::Arc;

use leash::job::{
    ApplyInput, ApplyMode, ApprovalPolicy, ErrorKind, GateSource, IdempotencyKey, JobStatus, NewJob, PluginName, Target,
};
use leash::store::{
    Finish, JobDecision, JobStore, JobsDeleteParams, PlanInsertParams, PlanListParams, PluginPolicyParams, StoreError,
};

use super::{
    KEEP_EVENTS, T0, advance, at, claim, claim_one, decide, get, new_job, new_plan, put_named, run_to, succeed,
};

pub(crate) async fn a_plan_is_stored_with_its_execute_job(store: Arc<dyn JobStore>) {
    let execute = new_plan(&*store, "01PLANA0000000000000000000", ApplyMode::Approval, T0).await;
    assert_eq!((execute.target.clone(), execute.status), (Target::Execute, JobStatus::Queued));
    assert_eq!(execute.plan_id.as_deref(), Some("01PLANA0000000000000000000"));
    let plan = store.plan_get("01PLANA0000000000000000000".into()).await.unwrap().unwrap();
    assert_eq!((plan.apply_mode, plan.input.as_slice(), plan.created_at), (ApplyMode::Approval, &b"want"[..], T0));
    new_plan(&*store, "01PLANB0000000000000000000", ApplyMode::Auto, at(1)).await;
    let listed = store.plan_list(PlanListParams { before: None, submitted_by: None, limit: 10 }).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|p| p.plan_id.as_str()).collect();
    assert_eq!(ids, ["01PLANB0000000000000000000", "01PLANA0000000000000000000"], "newest first");
    let page =
        store.plan_list(PlanListParams { before: Some(ids[0].into()), submitted_by: None, limit: 10 }).await.unwrap();
    assert_eq!(page.len(), 1);
    // A plan a principal submitted is listed for it, and only for it.
    let execute =
        NewJob { plan_id: Some("01PLANC0000000000000000000".into()), submitted_by: Some("sam".into()), ..new_job("c") };
    let params = PlanInsertParams {
        plan_id: "01PLANC0000000000000000000".into(),
        apply_mode: ApplyMode::Approval,
        input: b"c".to_vec(),
        execute,
        now: at(1),
    };
    store.plan_insert(params).await.unwrap();
    let by = |who: &str| PlanListParams { before: None, submitted_by: Some(who.into()), limit: 10 };
    let sams = store.plan_list(by("sam")).await.unwrap();
    assert_eq!(sams.iter().map(|p| p.plan_id.as_str()).collect::<Vec<_>>(), ["01PLANC0000000000000000000"]);
    assert!(store.plan_list(by("sue")).await.unwrap().is_empty());
    assert!(store.plan_get("01NOPE00000000000000000000".into()).await.unwrap().is_none());
    assert!(advance(&*store, None, at(2)).await.is_empty(), "nothing to advance before execute succeeds");
}

pub(crate) async fn a_succeeded_execute_leads_to_one_apply_job_with_its_output(store: Arc<dyn JobStore>) {
    let plan_id = "01PLANC0000000000000000000";
    let execute = new_plan(&*store, plan_id, ApplyMode::Approval, T0).await;
    run_to(&*store, Finish::Succeeded { output: br#"{"diff":["+a"]}"#.to_vec() }, at(1)).await;
    let created = advance(&*store, Some(plan_id), at(2)).await;
    assert_eq!(created.len(), 1);
    let apply = &created[0];
    assert_eq!((apply.target.clone(), apply.status), (Target::Apply, JobStatus::PendingApproval));
    assert_eq!(apply.approval.as_ref().unwrap().required_by, GateSource::Plan);
    assert_eq!((apply.plan_id.as_deref(), apply.concurrency_key.as_deref()), (Some(plan_id), Some(plan_id)));
    assert_eq!((apply.plugin, apply.max_attempts, &apply.limits), (execute.plugin, 2, &execute.limits));
    let input: ApplyInput = serde_json::from_slice(&get(&*store, apply.id).await.input).unwrap();
    assert_eq!(input.execute_job_id, execute.id);
    assert_eq!(input.execute_output, Some(serde_json::json!({"diff": ["+a"]})));
    assert_eq!(input.input_base64, "d2FudA==", "the plan's own input rides along");
    assert_eq!(store.plan_get(plan_id.into()).await.unwrap().unwrap().apply_job, Some(apply.id));
    assert!(advance(&*store, None, at(3)).await.is_empty(), "at most one apply job per plan");
    let (a, b) = tokio::join!(advance(&*store, None, at(4)), advance(&*store, Some(plan_id), at(4)));
    assert!(a.is_empty() && b.is_empty());

    // `auto`: queued at once, claimable only once execute has ended.
    let auto = "01PLAND0000000000000000000";
    new_plan(&*store, auto, ApplyMode::Auto, at(5)).await;
    run_to(&*store, Finish::Succeeded { output: b"plan".to_vec() }, at(6)).await;
    let created = advance(&*store, None, at(7)).await;
    assert_eq!(created.len(), 1);
    assert_eq!((created[0].status, created[0].approval.is_none()), (JobStatus::Queued, true));
    assert_eq!(claim_one(&*store, at(8)).await.job.id, created[0].id);
}

/// An `auto` plan's apply phase is gated when its plugin's registration
/// gates `apply` by the time execute succeeds, though it did not when the
/// plan was created.
pub(crate) async fn a_policy_set_while_an_auto_plan_runs_gates_its_apply_phase(store: Arc<dyn JobStore>) {
    let digest = put_named(&*store, b"gated later", "deploy", "1.0.0", T0).await;
    let name = PluginName::new("deploy", "1.0.0").unwrap();
    let plan_id = "01PLANG0000000000000000000";
    let execute = NewJob {
        plugin: digest,
        plugin_name: Some(name.clone()),
        plan_id: Some(plan_id.into()),
        concurrency_key: Some(plan_id.into()),
        ..new_job("want")
    };
    let params = PlanInsertParams {
        plan_id: plan_id.into(),
        apply_mode: ApplyMode::Auto,
        input: b"want".to_vec(),
        execute,
        now: T0,
    };
    store.plan_insert(params).await.unwrap();
    let policy = ApprovalPolicy { require: vec!["apply".parse().unwrap()], ..ApprovalPolicy::default() };
    store
        .plugin_policy_set(PluginPolicyParams { name, policy, actor: None, now: T0 })
        .await
        .unwrap()
        .expect("registered");
    run_to(&*store, Finish::Succeeded { output: b"plan".to_vec() }, at(1)).await;
    let created = advance(&*store, Some(plan_id), at(2)).await;
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].status, JobStatus::PendingApproval, "the policy holds the apply phase");
    assert_eq!(created[0].approval.as_ref().unwrap().required_by, GateSource::Policy);
    assert!(claim(&*store, "w", 10, at(3)).await.is_empty(), "nothing runs unapproved");
}

/// A plan's execute job carries the plan's idempotency key: a second
/// plan under the key is refused, naming the first plan's job and whether
/// it was the same request, and nothing of it is stored.
pub(crate) async fn a_plan_key_is_taken_once(store: Arc<dyn JobStore>) {
    let key = |digest: &str| IdempotencyKey::new("plan-key", digest.into()).unwrap();
    let plan = |id: &str, digest: &str| {
        let execute = NewJob {
            plan_id: Some(id.into()),
            concurrency_key: Some(id.into()),
            idempotency: Some(key(digest)),
            ..new_job("want")
        };
        PlanInsertParams { plan_id: id.into(), apply_mode: ApplyMode::Auto, input: b"want".to_vec(), execute, now: T0 }
    };
    let (_, first) = store.plan_insert(plan("01PLANK0000000000000000000", "d1")).await.unwrap();
    for (digest, same) in [("d1", true), ("d2", false)] {
        match store.plan_insert(plan("01PLANL0000000000000000000", digest)).await {
            Err(StoreError::IdempotencyKeyTaken { job, same_request, .. }) => {
                assert_eq!((job, same_request), (first.id, same));
            }
            other => panic!("a second plan under the key: {other:?}"),
        }
    }
    assert!(store.plan_get("01PLANL0000000000000000000".into()).await.unwrap().is_none(), "nothing stored");
}

pub(crate) async fn a_failed_or_cancelled_plan_never_gets_an_apply_job(store: Arc<dyn JobStore>) {
    new_plan(&*store, "01PLANE0000000000000000000", ApplyMode::Auto, T0).await;
    let failure = Finish::Failed { kind: ErrorKind::GuestError, message: "GuestError: no".into(), backtrace: None };
    run_to(&*store, failure, at(1)).await;
    assert!(advance(&*store, None, at(2)).await.is_empty(), "a failed execute ends the plan");

    let plan_id = "01PLANF0000000000000000000";
    new_plan(&*store, plan_id, ApplyMode::Auto, at(3)).await;
    let lease = claim_one(&*store, at(4)).await;
    let cancelled = store.plan_cancel(plan_id.into(), at(5), None).await.unwrap().unwrap();
    assert_eq!(cancelled.cancelled_at, Some(at(5)));
    let again = store.plan_cancel(plan_id.into(), at(6), None).await.unwrap().unwrap();
    assert_eq!(again.cancelled_at, Some(at(5)), "the first cancel's time is kept");
    // Its execute finished anyway (the guest returned first): still no apply.
    assert!(store.job_finish(succeed(&lease, at(7))).await.unwrap());
    assert!(advance(&*store, None, at(8)).await.is_empty(), "a cancelled plan is not advanced");
    assert!(store.plan_cancel("01NOPE00000000000000000000".into(), at(9), None).await.unwrap().is_none());
}

pub(crate) async fn retention_keeps_a_plans_phases_until_the_last_ends(store: Arc<dyn JobStore>) {
    let plan_id = "01PLANG0000000000000000000";
    let execute = new_plan(&*store, plan_id, ApplyMode::Approval, T0).await;
    run_to(&*store, Finish::Succeeded { output: b"diff".to_vec() }, at(1)).await;
    let delete = |cutoff| {
        store.jobs_delete_expired(JobsDeleteParams {
            finished_before: cutoff,
            events_before: KEEP_EVENTS,
            audit_before: None,
        })
    };
    assert_eq!(delete(at(100)).await.unwrap(), 0, "an execute job whose apply is still to be created is kept");
    let apply = advance(&*store, None, at(2)).await.remove(0);
    assert_eq!(delete(at(100)).await.unwrap(), 0, "an execute job whose apply waits is kept");
    decide(&*store, apply.id, JobDecision::Approve, "alice", at(3)).await.unwrap();
    run_to(&*store, Finish::Succeeded { output: b"done".to_vec() }, at(4)).await;
    assert_eq!(delete(at(100)).await.unwrap(), 2, "both phases go once the last has ended");
    assert!(store.job_get(execute.id).await.unwrap().is_none());
    assert!(store.plan_get(plan_id.into()).await.unwrap().is_none(), "and the plan with them");
}
