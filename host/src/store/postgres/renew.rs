//! Lease renewals gathered into one statement per round trip: a process
//! running hundreds of jobs renews them all at the cost of a few.

use tokio::sync::{mpsc, oneshot};

use crate::job::millis;
use crate::store::postgres::rows::{db_err, echo, pool_err};

use crate::store::{LeaseExtendParams, LeaseState, StoreError};

/// Most renewals one statement carries.
const MOST: usize = 1024;

struct Request {
    params: LeaseExtendParams,
    reply: oneshot::Sender<Result<LeaseState, StoreError>>,
}

/// The renewal queue and the task that drains it.
#[derive(Debug)]
pub(super) struct Renewals {
    queue: mpsc::UnboundedSender<Request>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Renewals {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Renewals {
    pub(super) fn start(pool: deadpool_postgres::Pool) -> Self {
        let (queue, waiting) = mpsc::unbounded_channel();
        Renewals { queue, task: tokio::spawn(drain(pool, waiting)) }
    }

    /// Renew one lease, in the next statement.
    pub(super) async fn renew(&self, params: LeaseExtendParams) -> Result<LeaseState, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue.send(Request { params, reply }).map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// Whatever renewals are waiting go in one statement; those that arrive
/// meanwhile go in the next.
async fn drain(pool: deadpool_postgres::Pool, mut waiting: mpsc::UnboundedReceiver<Request>) {
    let mut batch = Vec::new();
    while waiting.recv_many(&mut batch, MOST).await > 0 {
        match renew_all(&pool, &batch).await {
            Ok(held) => {
                for request in batch.drain(..) {
                    let found = held
                        .iter()
                        .find(|(id, token, _)| *id == request.params.id.to_string() && *token == request.params.token);
                    let state = match found {
                        Some(&(_, _, cancel_requested)) => LeaseState::Held { cancel_requested },
                        None => LeaseState::Lost,
                    };
                    let _ = request.reply.send(Ok(state));
                }
            }
            Err(e) => {
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(echo("extending leases", &e)));
                }
            }
        }
    }
}

/// The leases still held: id, token, and whether a cancel was asked for.
async fn renew_all(
    pool: &deadpool_postgres::Pool,
    batch: &[Request],
) -> Result<Vec<(String, String, bool)>, StoreError> {
    let operation = "extending leases";
    let err = db_err(operation);
    let client = pool.get().await.map_err(pool_err(operation))?;
    let stmt = client
        .prepare_cached(
            "UPDATE jobs j SET lease_expires_at = r.expires, last_heartbeat = r.now \
             FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[]) AS r(id, token, expires, now) \
             WHERE j.job_id = r.id AND j.lease_token = r.token \
             RETURNING j.job_id, j.lease_token, j.cancel_requested",
        )
        .await
        .map_err(&err)?;
    let mut sorted: Vec<&LeaseExtendParams> = batch.iter().map(|r| &r.params).collect();
    // One lock order for every batch.
    sorted.sort_by_key(|p| p.id);
    let ids: Vec<String> = sorted.iter().map(|p| p.id.to_string()).collect();
    let tokens: Vec<&str> = sorted.iter().map(|p| p.token.as_str()).collect();
    let expires: Vec<i64> =
        sorted.iter().map(|p| p.now.unix_ms().saturating_add(millis::column(p.lease_ttl))).collect();
    let nows: Vec<i64> = sorted.iter().map(|p| p.now.unix_ms()).collect();
    let rows = client.query(&stmt, &[&ids, &tokens, &expires, &nows]).await.map_err(&err)?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
}
