//! Conformance cases for [`Principals`](leash::store::Principals):
//! principals and their tokens.

use std::sync::Arc;

use leash::access::{NewToken, Principal, Role, TokenRecord, secret_matches, token_parts};
use leash::store::{JobStore, StoreError};

use super::{T0, at};

fn principal(name: &str, roles: &[Role], created_at: leash::clock::Timestamp) -> Principal {
    Principal { name: name.into(), roles: roles.iter().copied().collect(), created_at }
}

pub(crate) async fn principals_hold_roles_and_tokens_that_end_with_them(store: Arc<dyn JobStore>) {
    let bot = store.principal_put(principal("ci-bot", &[Role::Submit], T0)).await.unwrap();
    assert_eq!(bot, principal("ci-bot", &[Role::Submit], T0));
    store.principal_put(principal("alice", &[Role::Approve, Role::Operate], at(1))).await.unwrap();
    let changed = store.principal_put(principal("ci-bot", &[Role::Submit, Role::Approve], at(2))).await.unwrap();
    assert_eq!(changed, principal("ci-bot", &[Role::Submit, Role::Approve], T0), "roles change; it keeps its age");
    let names: Vec<String> = store.principal_list().await.unwrap().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["alice", "ci-bot"]);

    let minted = NewToken::generate().unwrap();
    let record = TokenRecord {
        id: minted.id.clone(),
        principal: "ci-bot".into(),
        label: Some("deploys".into()),
        created_at: at(3),
        expires_at: Some(at(100)),
        revoked_at: None,
    };
    store.token_insert(record.clone(), minted.hash.clone()).await.unwrap();
    let stranger = TokenRecord { id: "00".repeat(8), principal: "nobody".into(), ..record.clone() };
    assert!(matches!(store.token_insert(stranger, minted.hash.clone()).await, Err(StoreError::Invalid(_))));
    let found = store.token_find(minted.id.clone()).await.unwrap().expect("stored");
    assert_eq!((found.record.clone(), found.principal.name.as_str()), (record.clone(), "ci-bot"));
    let (_, secret) = token_parts(&minted.token).unwrap();
    assert!(secret_matches(secret, &found.hash), "the hash of the secret shown once");
    assert!(!found.hash.contains(secret), "never the secret itself");
    assert_eq!(store.token_list(Some("ci-bot".into())).await.unwrap(), std::slice::from_ref(&record));
    assert!(store.token_list(Some("alice".into())).await.unwrap().is_empty());
    assert_eq!(store.token_find("ff".repeat(8)).await.unwrap(), None);

    assert!(store.token_revoke(minted.id.clone(), at(4)).await.unwrap());
    assert!(!store.token_revoke(minted.id.clone(), at(5)).await.unwrap(), "revoked once");
    let revoked = store.token_find(minted.id.clone()).await.unwrap().unwrap().record;
    assert_eq!(revoked.revoked_at, Some(at(4)));
    assert!(!revoked.live(at(4)));

    // Removing a principal revokes its live tokens and ends their use.
    let second = NewToken::generate().unwrap();
    store.token_insert(TokenRecord { id: second.id.clone(), ..record }, second.hash).await.unwrap();
    assert!(store.principal_remove("ci-bot".into(), at(6)).await.unwrap());
    assert!(!store.principal_remove("ci-bot".into(), at(6)).await.unwrap());
    assert_eq!(store.token_find(second.id.clone()).await.unwrap(), None, "its principal is gone");
    let listed = store.token_list(None).await.unwrap();
    assert!(listed.iter().all(|t| t.revoked_at.is_some()), "{listed:?}");
    assert_eq!(listed.iter().find(|t| t.id == second.id).unwrap().revoked_at, Some(at(6)));
}
