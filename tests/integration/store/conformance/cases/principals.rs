//! Conformance cases for [`Principals`](leash::store::Principals):
//! principals and their tokens.

use std::sync::Arc;

use leash::access::{NewToken, Principal, PrincipalCeilings, Role, TokenRecord, secret_matches, token_parts};
use leash::store::{AuditListParams, JobStore, StoreError, verify_chain};

use leash::job::NewJob;

use super::{T0, at, get, insert, new_job};

fn principal(name: &str, roles: &[Role], created_at: leash::clock::Timestamp) -> Principal {
    Principal { name: name.into(), roles: roles.iter().copied().collect(), created_at, ceilings: Default::default() }
}

pub(crate) async fn principals_hold_roles_and_tokens_that_end_with_them(store: Arc<dyn JobStore>) {
    let bot = store.principal_put(principal("ci-bot", &[Role::Submit], T0), None).await.unwrap();
    assert_eq!(bot, principal("ci-bot", &[Role::Submit], T0));
    store.principal_put(principal("alice", &[Role::Approve, Role::Operate], at(1)), None).await.unwrap();
    let changed = store.principal_put(principal("ci-bot", &[Role::Submit, Role::Approve], at(2)), None).await.unwrap();
    assert_eq!(changed, principal("ci-bot", &[Role::Submit, Role::Approve], T0), "roles change; it keeps its age");
    let names: Vec<String> = store.principal_list().await.unwrap().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["alice", "ci-bot"]);
    let ceilings = PrincipalCeilings {
        max_timeout_ms: Some(1_000),
        max_attempts: Some(2),
        max_queue_ttl_ms: None,
        max_running: Some(3),
    };
    let capped = Principal { ceilings, ..principal("alice", &[Role::Approve, Role::Operate], at(1)) };
    assert_eq!(store.principal_put(capped.clone(), None).await.unwrap(), capped, "ceilings are kept");
    assert_eq!(store.principal_get("alice".into()).await.unwrap(), Some(capped));
    assert_eq!(store.principal_get("nobody".into()).await.unwrap(), None);

    let minted = NewToken::generate().unwrap();
    let record = TokenRecord {
        id: minted.id.clone(),
        principal: "ci-bot".into(),
        label: Some("deploys".into()),
        created_at: at(3),
        expires_at: Some(at(100)),
        revoked_at: None,
    };
    store.token_insert(record.clone(), minted.hash.clone(), None).await.unwrap();
    let stranger = TokenRecord { id: "00".repeat(8), principal: "nobody".into(), ..record.clone() };
    assert!(matches!(store.token_insert(stranger, minted.hash.clone(), None).await, Err(StoreError::Invalid(_))));
    let found = store.token_find(minted.id.clone()).await.unwrap().expect("stored");
    assert_eq!((found.record.clone(), found.principal.name.as_str()), (record.clone(), "ci-bot"));
    let (_, secret) = token_parts(&minted.token).unwrap();
    assert!(secret_matches(secret, &found.hash), "the hash of the secret shown once");
    assert!(!found.hash.contains(secret), "never the secret itself");
    assert_eq!(store.token_list(Some("ci-bot".into())).await.unwrap(), std::slice::from_ref(&record));
    assert!(store.token_list(Some("alice".into())).await.unwrap().is_empty());
    assert_eq!(store.token_find("ff".repeat(8)).await.unwrap(), None);

    assert!(store.token_revoke(minted.id.clone(), at(4), None).await.unwrap());
    assert!(!store.token_revoke(minted.id.clone(), at(5), None).await.unwrap(), "revoked once");
    let revoked = store.token_find(minted.id.clone()).await.unwrap().unwrap().record;
    assert_eq!(revoked.revoked_at, Some(at(4)));
    assert!(!revoked.live(at(4)));

    // Removing a principal revokes its live tokens and ends their use.
    let second = NewToken::generate().unwrap();
    store.token_insert(TokenRecord { id: second.id.clone(), ..record }, second.hash, None).await.unwrap();
    assert!(store.principal_remove("ci-bot".into(), at(6), None).await.unwrap());
    assert!(!store.principal_remove("ci-bot".into(), at(6), None).await.unwrap());
    assert_eq!(store.token_find(second.id.clone()).await.unwrap(), None, "its principal is gone");
    let listed = store.token_list(None).await.unwrap();
    assert!(listed.iter().all(|t| t.revoked_at.is_some()), "{listed:?}");
    assert_eq!(listed.iter().find(|t| t.id == second.id).unwrap().revoked_at, Some(at(6)));
}

/// Audited changes made at once from many connections (replicas, on
/// PostgreSQL) append to one chain in one order: every row follows the
/// one before, and the chain verifies up to its head.
pub(crate) async fn audited_changes_at_once_form_one_unbroken_chain(store: Arc<dyn JobStore>) {
    let writers: Vec<_> = (0..16)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let p = principal(&format!("p{n}"), &[Role::Submit], at(n));
                store.principal_put(p, Some(format!("admin-{n}"))).await.unwrap();
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let head = store.audit_head().await.unwrap();
    assert_eq!(head.seq, 16);
    let rows = store.audit_list(AuditListParams { limit: 100, ..AuditListParams::default() }).await.unwrap();
    assert_eq!(rows.len(), 16);
    let verdict = verify_chain(&head, |after| {
        store.audit_list(AuditListParams { after: Some(after), limit: 5, ..AuditListParams::default() })
    })
    .await
    .unwrap();
    assert_eq!(verdict, Ok(head));
    let by: Vec<_> = rows.iter().filter(|r| r.principal.as_deref() == Some("admin-3")).collect();
    assert_eq!((by.len(), by[0].action.as_str(), by[0].target.as_str()), (1, "principal.put", "p3"));
    let filtered = store
        .audit_list(AuditListParams { target: Some("p7".into()), limit: 10, ..AuditListParams::default() })
        .await
        .unwrap();
    assert_eq!(filtered.len(), 1);
}

/// A principal's submit appends one `job.submit` row per job, in the
/// batch's order, chained as any other; an embedder's (no principal)
/// appends none.
pub(crate) async fn a_principal_s_submits_append_one_row_per_job_in_order(store: Arc<dyn JobStore>) {
    let by_sam = |input: &str| NewJob { submitted_by: Some("sam".into()), ..new_job(input) };
    let jobs = insert(&*store, vec![by_sam("a"), by_sam("b"), by_sam("c")], T0).await;
    insert(&*store, vec![new_job("embedded")], at(1)).await;
    let one = insert(&*store, vec![by_sam("d")], at(2)).await;
    let rows = store.audit_list(AuditListParams { limit: 100, ..AuditListParams::default() }).await.unwrap();
    let said: Vec<(&str, &str, Option<&str>)> =
        rows.iter().map(|r| (r.action.as_str(), r.target.as_str(), r.principal.as_deref())).collect();
    let ids: Vec<String> = jobs.iter().chain(&one).map(|j| j.id.to_string()).collect();
    let expected: Vec<(&str, &str, Option<&str>)> =
        ids.iter().map(|id| ("job.submit", id.as_str(), Some("sam"))).collect();
    assert_eq!(said, expected);
    let head = store.audit_head().await.unwrap();
    let verdict = verify_chain(&head, |after| {
        store.audit_list(AuditListParams { after: Some(after), limit: 2, ..AuditListParams::default() })
    })
    .await
    .unwrap();
    assert_eq!(verdict, Ok(head));
}

/// A remembering approval stores its rule in the same write, audited in
/// its author's name; a decision by the rule is counted and audited as the
/// rule's; and the store refuses one, read in the decision's own write,
/// once the rule is revoked or expired or its author has lost `approve`.
pub(crate) async fn a_rule_decides_only_while_it_stands_and_its_author_may_approve(store: Arc<dyn JobStore>) {
    use leash::job::{Remember, Verdict};
    use leash::store::{DecideRefusal, JobDecision, RuleListParams, RuleRevokeParams};

    use super::{decide_params, gated_job};

    store.principal_put(principal("alice", &[Role::Approve], T0), None).await.unwrap();
    let jobs = insert(&*store, (0..5).map(|i| gated_job(&format!("{i}"), true)).collect(), T0).await;
    let remember = Remember::new(std::time::Duration::from_secs(600), true, at(1)).unwrap();
    let first = store
        .job_decide(leash::store::JobDecideParams {
            remember: Some(remember.clone()),
            ..decide_params(jobs[0].id, JobDecision::Approve, "alice", at(1))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.approval.as_ref().unwrap().approvals[0].remembered.as_deref(), Some(remember.rule.as_str()));
    let rule = store.rule_get(remember.rule.clone()).await.unwrap().expect("stored with the approval");
    assert_eq!(
        (rule.author.as_str(), rule.from_job, rule.uses, rule.submitter.clone()),
        ("alice", jobs[0].id, 0, None)
    );
    assert_eq!(rule.expires_at, at(601));

    let by_rule = |id, now| leash::store::JobDecideParams {
        rule: Some(remember.rule.clone()),
        ..decide_params(id, JobDecision::Approve, "alice", now)
    };
    let approved = store.job_decide(by_rule(jobs[1].id, at(2))).await.unwrap().unwrap();
    let decision = approved.approval.as_ref().unwrap().decision.clone().unwrap();
    assert_eq!((decision.verdict, decision.rule.as_deref()), (Verdict::Approved, Some(remember.rule.as_str())));
    assert_eq!(store.rule_get(remember.rule.clone()).await.unwrap().unwrap().uses, 1);
    // Past its expiry: refused, the job untouched.
    assert_eq!(store.job_decide(by_rule(jobs[2].id, at(601))).await.unwrap(), Err(DecideRefusal::RuleInactive));
    // Its author without `approve`: refused; given back: decided.
    store.principal_put(principal("alice", &[Role::Submit], T0), None).await.unwrap();
    assert_eq!(store.job_decide(by_rule(jobs[2].id, at(3))).await.unwrap(), Err(DecideRefusal::RuleInactive));
    store.principal_put(principal("alice", &[Role::Approve], T0), None).await.unwrap();
    assert!(store.job_decide(by_rule(jobs[2].id, at(4))).await.unwrap().is_ok());
    // Revoked: refused; revoking again changes nothing.
    let revoke = RuleRevokeParams { id: remember.rule.clone(), actor: Some("bob".into()), now: at(5) };
    let revoked = store.rule_revoke(revoke.clone()).await.unwrap().unwrap();
    assert_eq!((revoked.revoked_at, revoked.revoked_by.as_deref(), revoked.uses), (Some(at(5)), Some("bob"), 2));
    assert_eq!(
        store.rule_revoke(RuleRevokeParams { now: at(9), ..revoke }).await.unwrap().unwrap().revoked_at,
        Some(at(5))
    );
    assert_eq!(store.job_decide(by_rule(jobs[3].id, at(6))).await.unwrap(), Err(DecideRefusal::RuleInactive));
    assert_eq!(get(&*store, jobs[3].id).await.status, leash::job::JobStatus::PendingApproval);
    // An unknown rule decides nothing either.
    let unknown = leash::store::JobDecideParams { rule: Some("rule_none".into()), ..by_rule(jobs[4].id, at(6)) };
    assert_eq!(store.job_decide(unknown).await.unwrap(), Err(DecideRefusal::RuleInactive));

    let active = RuleListParams { active_at: Some(at(6)), limit: 10, ..RuleListParams::default() };
    assert_eq!(store.rule_list(active).await.unwrap(), []);
    let all = store.rule_list(RuleListParams { author: Some("alice".into()), limit: 10, ..Default::default() });
    assert_eq!(all.await.unwrap().len(), 1);
    let rows = store.audit_list(AuditListParams { limit: 100, ..AuditListParams::default() }).await.unwrap();
    let said: Vec<(&str, Option<&str>)> = rows.iter().map(|r| (r.action.as_str(), r.principal.as_deref())).collect();
    let expected = [
        ("principal.put", None),
        ("job.approve", Some("alice")),
        ("rule.create", Some("alice")),
        ("job.approve", Some("alice")),
        ("principal.put", None),
        ("principal.put", None),
        ("job.approve", Some("alice")),
        ("rule.revoke", Some("bob")),
    ];
    assert_eq!(said, expected);
}

/// Audit retention deletes the rows written before its cutoff as one
/// prefix of the chain; the head says where the kept rows start, the chain
/// still verifies from there (and a kept row edited is still caught by the
/// hashes), and appends go on after it. Without a cutoff nothing goes.
pub(crate) async fn audit_retention_deletes_a_prefix_and_the_chain_still_verifies(store: Arc<dyn JobStore>) {
    use leash::store::JobsDeleteParams;
    for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        store.principal_put(principal(name, &[Role::Submit], at(10 * i as u64)), None).await.unwrap();
    }
    let sweep = |audit_before| JobsDeleteParams { finished_before: T0, events_before: T0, audit_before };
    store.jobs_delete_expired(sweep(None)).await.unwrap();
    assert_eq!(store.audit_head().await.unwrap().pruned_seq, 0, "kept for ever by default");
    store.jobs_delete_expired(sweep(Some(at(15)))).await.unwrap();
    let head = store.audit_head().await.unwrap();
    assert_eq!((head.seq, head.pruned_seq), (4, 2), "rows 1 and 2 (at 0 s and 10 s) went");
    let kept = store.audit_list(AuditListParams { limit: 10, ..AuditListParams::default() }).await.unwrap();
    assert_eq!(kept.iter().map(|r| r.seq).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(head.pruned_hash.as_deref(), Some(kept[0].prev_hash.as_str()), "the first kept row follows it");
    let verify = async |head| {
        verify_chain(&head, |after| {
            store.audit_list(AuditListParams { after: Some(after), limit: 1, ..AuditListParams::default() })
        })
        .await
        .unwrap()
    };
    assert_eq!(verify(head.clone()).await, Ok(head.clone()));
    store.principal_put(principal("e", &[Role::Submit], at(40)), None).await.unwrap();
    let head = store.audit_head().await.unwrap();
    assert_eq!((head.seq, head.pruned_seq), (5, 2));
    assert_eq!(verify(head.clone()).await, Ok(head.clone()), "appends go on after a prune");
    // A head that claims less was pruned than was: the gap is named.
    let lying = leash::store::AuditHead { pruned_seq: 1, pruned_hash: Some(kept[0].prev_hash.clone()), ..head };
    assert_eq!(verify(lying).await.unwrap_err().seq, 2, "row 2 is missing");
}
