//! Conformance cases for [`Workers`](leash::store::Workers): the worker registry.

use std::sync::Arc;

use leash::store::JobStore;

use super::{at, claim, insert_one, new_job, worker_record};

pub(crate) async fn workers_register_refresh_and_are_deleted_at_retention(store: Arc<dyn JobStore>) {
    store.worker_beat(worker_record("worker-0000000a", at(0))).await.unwrap();
    store.worker_beat(worker_record("worker-0000000b", at(1))).await.unwrap();
    insert_one(&*store, new_job("x"), at(1)).await;
    let lease = claim(&*store, "worker-0000000a", 1, at(2)).await.pop().unwrap();
    // A refresh keeps `started_at` and takes everything else.
    let mut beat = worker_record("worker-0000000a", at(9));
    beat.running = 1;
    beat.processed = 5;
    beat.state = leash::job::WorkerState::Draining;
    store.worker_beat(beat).await.unwrap();
    let snapshot = store.workers_snapshot().await.unwrap();
    let ids: Vec<&str> = snapshot.workers.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(ids, ["worker-0000000a", "worker-0000000b"], "oldest first");
    let a = &snapshot.workers[0];
    assert_eq!((a.started_at, a.last_heartbeat, a.running, a.processed), (at(0), at(9), 1, 5));
    assert_eq!(a.state, leash::job::WorkerState::Draining);
    assert_eq!(snapshot.running_jobs, [(lease.job.id, "worker-0000000a".to_owned())]);
    assert_eq!((snapshot.counts.running, snapshot.counts.total()), (1, 1));
    // Retention deletes the rows not refreshed since the cutoff.
    assert_eq!(store.workers_delete_stale(at(5)).await.unwrap(), 1);
    let left = store.workers_snapshot().await.unwrap().workers;
    assert_eq!(left.iter().map(|w| w.worker_id.as_str()).collect::<Vec<_>>(), ["worker-0000000a"]);
}
