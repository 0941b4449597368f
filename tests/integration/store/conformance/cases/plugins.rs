//! Conformance cases for [`Plugins`](leash::store::Plugins): plugin bytes,
//! names, grants and policies.

use std::sync::Arc;

use leash::job::grant::Requests;
use leash::job::{ApprovalPolicy, Digest, Grants, NewJob, PluginName};
use leash::store::{
    JobListParams, JobStore, PluginCodePutParams, PluginGrantsParams, PluginNameParams, PluginPolicyParams,
    PluginPutParams, StoreError,
};

use super::{T0, at, claim_one, get, insert_one, new_job, put_named, resolve};

pub(crate) async fn plugins_are_stored_by_digest_once(store: Arc<dyn JobStore>) {
    let bytes = b"\0asm component bytes".to_vec();
    let digest =
        store.plugin_put(PluginPutParams { bytes: bytes.clone(), requests: None, actor: None, now: T0 }).await.unwrap();
    assert_eq!(digest, Digest::of(&bytes));
    let again = store
        .plugin_put(PluginPutParams { bytes: bytes.clone(), requests: None, actor: None, now: at(1) })
        .await
        .unwrap();
    assert_eq!(again, digest, "idempotent");
    assert_eq!(store.plugin_get(digest).await.unwrap(), Some(bytes));
    assert_eq!(store.plugin_get(Digest::of(b"other")).await.unwrap(), None);
}

pub(crate) async fn plugin_names_resolve_to_the_newest_registration(store: Arc<dyn JobStore>) {
    let v1 = put_named(&*store, b"one", "hello", "1.0.0", T0).await;
    let v2 = put_named(&*store, b"two", "hello", "2.0.0", at(1)).await;
    let unnamed = store
        .plugin_put(PluginPutParams { bytes: b"three".to_vec(), requests: None, actor: None, now: at(2) })
        .await
        .unwrap();
    assert_eq!(resolve(&*store, "hello").await.unwrap().digest, v2, "a name alone is its newest version");
    let exact = resolve(&*store, "hello@1.0.0").await.unwrap();
    assert_eq!((exact.digest, exact.created_at), (v1, T0));
    let by_digest = resolve(&*store, &v1.to_string()).await.unwrap();
    assert_eq!(by_digest.name, Some(PluginName::new("hello", "1.0.0").unwrap()));
    assert_eq!(resolve(&*store, &unnamed.hex()).await.unwrap().name, None, "a bare hex digest resolves too");
    assert!(resolve(&*store, "hello@3.0.0").await.is_none());
    assert!(resolve(&*store, "nobody").await.is_none());
    let listed: Vec<_> = store.plugin_list().await.unwrap().into_iter().map(|p| (p.name, p.digest)).collect();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[2], (None, unnamed), "unnamed digests come last");
    let missing = PluginNameParams {
        name: PluginName::new("ghost", "1").unwrap(),
        digest: Digest::of(b"never stored"),
        policy: None,
        actor: None,
        now: at(3),
    };
    assert!(matches!(store.plugin_name_set(missing).await, Err(StoreError::Invalid(_))));
    assert!(resolve(&*store, "ghost").await.is_none(), "a refused name leaves nothing behind");
}

pub(crate) async fn replacing_a_plugin_name_does_not_change_queued_jobs(store: Arc<dyn JobStore>) {
    let old = put_named(&*store, b"old", "tool", "1", T0).await;
    let job = NewJob { plugin: old, plugin_name: Some(PluginName::new("tool", "1").unwrap()), ..new_job("x") };
    let queued = insert_one(&*store, job, T0).await;
    let new = put_named(&*store, b"new", "tool", "1", at(1)).await;
    assert_ne!(old, new);
    assert_eq!(resolve(&*store, "tool@1").await.unwrap().digest, new, "the name now points at the new bytes");
    let still = get(&*store, queued.id).await;
    assert_eq!(still.plugin, old, "the queued job keeps the digest it was pinned to");
    assert_eq!(still.plugin_name, Some(PluginName::new("tool", "1").unwrap()));
    assert_eq!(claim_one(&*store, at(2)).await.job.plugin, old);
}

pub(crate) async fn grants_belong_to_a_registration_and_are_pinned_on_jobs(store: Arc<dyn JobStore>) {
    let name = PluginName::new("fetcher", "1").unwrap();
    let grant = |rules: &[&str]| {
        let mut grants = Grants::default();
        grants.http.hosts = rules.iter().map(|r| r.parse().unwrap()).collect();
        grants.http.private_ranges = vec!["10.0.0.0/8".parse().unwrap()];
        grants.http.limits.requests = 7;
        grants
    };
    let set = |grants: Grants, name: PluginName| {
        let store = store.clone();
        async move { store.plugin_grants_set(PluginGrantsParams { name, grants, actor: None, now: T0 }).await.unwrap() }
    };
    assert!(set(grant(&["https://a.example"]), name.clone()).await.is_none(), "an unregistered pair is refused");

    let v1 = put_named(&*store, b"v1", "fetcher", "1", T0).await;
    assert!(resolve(&*store, "fetcher@1").await.unwrap().grants.is_none(), "a new registration grants nothing");
    let first = grant(&["GET https://api.example.com", "http://127.0.0.1:8080"]);
    let info = set(first.clone(), name.clone()).await.expect("registered");
    assert_eq!((info.digest, &info.grants), (v1, &first));
    assert_eq!(resolve(&*store, "fetcher").await.unwrap().grants, first);
    let listed = store.plugin_list().await.unwrap();
    assert_eq!(listed.iter().find(|p| p.name.as_ref() == Some(&name)).unwrap().grants, first);

    // A job carries the grants it was inserted with, through claim and reads.
    let job = NewJob { plugin: v1, plugin_name: Some(name.clone()), grants: first.clone(), ..new_job("g") };
    let queued = insert_one(&*store, job, at(1)).await;
    assert_eq!(queued.grants, first);
    assert_eq!(get(&*store, queued.id).await.grants, first);
    let listed = store.job_list(JobListParams { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(listed[0].grants, first);

    // New bytes under the same pair keep its grants; new grants do not
    // reach the job already queued.
    let v2 = put_named(&*store, b"v2", "fetcher", "1", at(2)).await;
    let info = resolve(&*store, "fetcher@1").await.unwrap();
    assert_eq!((info.digest, &info.grants), (v2, &first), "a replaced registration keeps its grants");
    let second = grant(&["https://other.example"]);
    set(second.clone(), name.clone()).await.unwrap();
    assert_eq!(claim_one(&*store, at(3)).await.job.grants, first, "the job keeps what it was pinned to");
    assert_eq!(resolve(&*store, "fetcher@1").await.unwrap().grants, second);

    // Revoking stores nothing; other versions are untouched.
    put_named(&*store, b"v3", "fetcher", "2", at(4)).await;
    set(Grants::default(), name.clone()).await.unwrap();
    assert!(resolve(&*store, "fetcher@1").await.unwrap().grants.is_none());
    assert!(resolve(&*store, "fetcher@2").await.unwrap().grants.is_none());
}

pub(crate) async fn approval_policy_belongs_to_a_registration(store: Arc<dyn JobStore>) {
    let name = PluginName::new("deployer", "1").unwrap();
    let digest = put_named(&*store, b"deployer", "deployer", "1", T0).await;
    let policy = ApprovalPolicy {
        require: vec!["apply".parse().unwrap(), "action:deploy".parse().unwrap()],
        ..ApprovalPolicy::default()
    };
    let set = PluginPolicyParams { name: name.clone(), policy: policy.clone(), actor: None, now: T0 };
    let info = store.plugin_policy_set(set).await.unwrap().expect("registered");
    assert_eq!(info.approval, policy);
    assert_eq!(resolve(&*store, "deployer").await.unwrap().approval, policy, "resolved with its policy");
    assert_eq!(store.plugin_list().await.unwrap()[0].approval, policy, "listed with its policy");
    // Replacing the bytes keeps the policy; naming a new policy sets it.
    let again = PluginNameParams { name: name.clone(), digest, policy: None, actor: None, now: at(1) };
    assert_eq!(store.plugin_name_set(again).await.unwrap().approval, policy);
    let cleared = PluginNameParams {
        name: name.clone(),
        digest,
        policy: Some(ApprovalPolicy::default()),
        actor: None,
        now: at(2),
    };
    assert!(store.plugin_name_set(cleared).await.unwrap().approval.is_none());
    let unknown = PluginPolicyParams { name: PluginName::new("ghost", "1").unwrap(), policy, actor: None, now: T0 };
    assert!(store.plugin_policy_set(unknown).await.unwrap().is_none());
}

/// A component's declared requests are kept with its bytes and come back
/// on every read of the plugin, by digest, by name and in the list; a
/// second put of the same bytes changes nothing.
pub(crate) async fn declared_requests_are_kept_with_the_bytes(store: Arc<dyn JobStore>) {
    let requests = Requests {
        hosts: vec!["https://api.example.com".parse().unwrap()],
        config: vec!["greeting".to_owned()],
        secrets: vec!["TOKEN".parse().unwrap()],
    };
    let bytes = b"\0asm declaring".to_vec();
    let put = PluginPutParams { bytes: bytes.clone(), requests: Some(requests.clone()), actor: None, now: T0 };
    let digest = store.plugin_put(put).await.unwrap();
    let named = PluginNameParams {
        name: PluginName::new("asker", "1").unwrap(),
        digest,
        policy: None,
        actor: None,
        now: at(1),
    };
    assert_eq!(store.plugin_name_set(named).await.unwrap().requests.as_ref(), Some(&requests), "as registered");
    assert_eq!(resolve(&*store, "asker").await.unwrap().requests.as_ref(), Some(&requests), "by name");
    assert_eq!(resolve(&*store, &digest.to_string()).await.unwrap().requests.as_ref(), Some(&requests), "by digest");
    let plain = store
        .plugin_put(PluginPutParams { bytes: b"plain".to_vec(), requests: None, actor: None, now: T0 })
        .await
        .unwrap();
    let listed = store.plugin_list().await.unwrap();
    let of = |d: Digest| listed.iter().find(|p| p.digest == d).unwrap().requests.clone();
    assert_eq!((of(digest), of(plain)), (Some(requests.clone()), None), "in the list");
    store.plugin_put(PluginPutParams { bytes, requests: None, actor: None, now: at(2) }).await.unwrap();
    assert_eq!(resolve(&*store, "asker").await.unwrap().requests, Some(requests), "kept by a second put");
    assert!(store.plugins_undeclared().await.unwrap().is_empty(), "every stored plugin's declaration is known");
}

fn code(digest: Digest, engine: &str, code: &[u8], bound: u64, now: u64) -> PluginCodePutParams {
    PluginCodePutParams { digest, engine: engine.into(), code: code.to_vec(), bound, now: at(now) }
}

async fn put(store: &dyn JobStore, bytes: &[u8]) -> Digest {
    store.plugin_put(PluginPutParams { bytes: bytes.to_vec(), requests: None, actor: None, now: T0 }).await.unwrap()
}

pub(crate) async fn compiled_code_is_kept_by_digest_and_engine(store: Arc<dyn JobStore>) {
    let digest = put(&*store, b"plugin").await;
    assert!(store.plugin_code_put(code(digest, "engine-a", b"code a", 1 << 20, 1)).await.unwrap());
    assert!(store.plugin_code_put(code(digest, "engine-b", b"code b", 1 << 20, 2)).await.unwrap());
    let get = |engine: &str| store.plugin_code_get(digest, engine.to_owned(), at(3));
    assert_eq!(get("engine-a").await.unwrap().as_deref(), Some(&b"code a"[..]));
    assert_eq!(get("engine-b").await.unwrap().as_deref(), Some(&b"code b"[..]));
    assert_eq!(get("engine-c").await.unwrap(), None, "another engine's code is never read back");
    // A new compile of the same digest and engine replaces the old code.
    assert!(store.plugin_code_put(code(digest, "engine-a", b"code a2", 1 << 20, 4)).await.unwrap());
    assert_eq!(get("engine-a").await.unwrap().as_deref(), Some(&b"code a2"[..]));
    // Code of a plugin the store does not hold, or over the bound alone, is not kept.
    let unknown = Digest::of(b"never stored");
    assert!(!store.plugin_code_put(code(unknown, "engine-a", b"code", 1 << 20, 5)).await.unwrap());
    assert_eq!(store.plugin_code_get(unknown, "engine-a".into(), at(5)).await.unwrap(), None);
    assert!(!store.plugin_code_put(code(digest, "engine-d", b"too big", 3, 6)).await.unwrap());
    assert_eq!(get("engine-d").await.unwrap(), None);
}

pub(crate) async fn compiled_code_keeps_its_bound_dropping_the_least_recently_used(store: Arc<dyn JobStore>) {
    let (a, b, c) = (put(&*store, b"a").await, put(&*store, b"b").await, put(&*store, b"c").await);
    let bound = 25;
    let ten = [7u8; 10];
    assert!(store.plugin_code_put(code(a, "e", &ten, bound, 1)).await.unwrap());
    assert!(store.plugin_code_put(code(b, "e", &ten, bound, 2)).await.unwrap());
    // Reading `a` makes `b` the least recently used.
    assert!(store.plugin_code_get(a, "e".into(), at(3)).await.unwrap().is_some());
    assert!(store.plugin_code_put(code(c, "e", &ten, bound, 4)).await.unwrap());
    let kept = |d| store.plugin_code_get(d, "e".into(), at(5));
    assert!(kept(b).await.unwrap().is_none(), "the least recently used went");
    assert!(kept(a).await.unwrap().is_some() && kept(c).await.unwrap().is_some());
}
