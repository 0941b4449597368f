//! Conformance cases for [`Principals`](leash::store::Principals):
//! principals and their tokens.

use std::sync::Arc;

use leash::access::{NewToken, Principal, PrincipalCeilings, Role, TokenRecord, secret_matches, token_parts};
use leash::store::{AuditListParams, JobStore, StoreError, verify_chain};

use leash::job::NewJob;

use super::{T0, at, insert, new_job};

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
    let ceilings = PrincipalCeilings { max_timeout_ms: Some(1_000), max_attempts: Some(2), max_queue_ttl_ms: None };
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
