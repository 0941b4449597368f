//! Conformance cases for [`Sessions`](leash::store::Sessions): dashboard
//! sessions ended before their expiry.

use std::sync::Arc;

use leash::store::JobStore;

use super::{T0, at};

pub(crate) async fn an_ended_session_is_refused_until_its_expiry_then_forgotten(store: Arc<dyn JobStore>) {
    assert!(!store.session_ended("a1".into()).await.unwrap(), "nothing is ended at first");
    store.session_end("a1".into(), at(100), T0).await.unwrap();
    store.session_end("a1".into(), at(100), at(1)).await.expect("ending it twice is no error");
    assert!(store.session_ended("a1".into()).await.unwrap());
    assert!(!store.session_ended("b2".into()).await.unwrap(), "only that session");
    // Ending another after the first one's expiry forgets the first: its
    // cookie is refused by its own expiry from then on.
    store.session_end("b2".into(), at(300), at(100)).await.unwrap();
    assert!(!store.session_ended("a1".into()).await.unwrap(), "forgotten once expired");
    assert!(store.session_ended("b2".into()).await.unwrap());
}
