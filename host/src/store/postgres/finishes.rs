//! Finishes gathered into one transaction per round trip, with the next
//! jobs their slots claim: a busy process's endings cost the server one
//! commit for many jobs, not one each.
//!
//! Whatever finishes are waiting when a round starts go in it; those that
//! arrive meanwhile go in the next (nothing waits on a timer, so a lone
//! finish goes at once). [`ROUNDS`] rounds may be in flight at once, so a
//! finish arriving during one waits for a free connection, not for that
//! round's end. Each row stays fenced by its own lease token: a
//! finish whose lease was lost changes nothing, is answered `false` to its
//! own caller alone, and claims nothing.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio::sync::{mpsc, oneshot};

use super::claim::claim;
use super::rows::{db_err, echo, text};
use super::{Inner, PostgresStore};
use crate::job::{ErrorKind, JobStatus};
use crate::store::rules::codec::{i64_of, to_json};
use crate::store::{JobClaimParams, JobFinishParams, JobReleaseParams, Lease, Leases, StoreError};

/// Most finishes one round carries.
const MOST: usize = 256;

/// Rounds in flight at once.
const ROUNDS: usize = 2;

const OPERATION: &str = "finishing a job";

/// A finish's answer: whether it landed, and the slot's next jobs.
type Answer = Result<(bool, Vec<Lease>), StoreError>;

struct Request {
    params: JobFinishParams,
    /// The slot's next claim (up to its limit), made only if the finish
    /// lands.
    next: Option<JobClaimParams>,
    reply: oneshot::Sender<Answer>,
}

/// The finish queue and the task that drains it.
#[derive(Debug)]
pub(super) struct Finishes {
    queue: mpsc::UnboundedSender<Request>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Finishes {
    fn drop(&mut self) {
        self.tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

impl Finishes {
    /// Start the tasks; they hold the store weakly, so dropping the store
    /// ends them.
    pub(super) fn start(store: Weak<Inner>) -> Self {
        let (queue, waiting) = mpsc::unbounded_channel();
        let waiting = Arc::new(tokio::sync::Mutex::new(waiting));
        let tasks = (0..ROUNDS).map(|_| tokio::spawn(drain(store.clone(), waiting.clone()))).collect();
        Finishes { queue, tasks }
    }

    /// Finish one job (a success with its proposals, in one transaction),
    /// and with `next`, claim its slot's next job in the same transaction
    /// if the finish lands.
    pub(super) async fn finish(&self, params: JobFinishParams, next: Option<JobClaimParams>) -> Answer {
        let (reply, answer) = oneshot::channel();
        self.queue.send(Request { params, next, reply }).map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// Take whatever is waiting (the first to arrive, if nothing is), one
/// round at a time per task; the queue is taken in turn.
async fn drain(store: Weak<Inner>, waiting: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Request>>>) {
    let mut batch = Vec::new();
    while waiting.lock().await.recv_many(&mut batch, MOST).await > 0 {
        let Some(inner) = store.upgrade() else { return };
        let store = PostgresStore { inner };
        match store.finish_all(&batch).await {
            // A refusal that is not transient rolled the round back: made
            // again one by one, so one request's bad row fails it alone.
            // (A transient one may have come after the commit: each caller
            // retries, and checks the row before calling its lease lost.)
            Err(e) if batch.len() > 1 && !e.is_transient() => {
                for request in batch.drain(..) {
                    let answer = store.finish_all(std::slice::from_ref(&request)).await;
                    store.reply(request, answer.map(|mut answers| answers.pop().unwrap_or((false, Vec::new())))).await;
                }
            }
            Err(e) => {
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(echo(OPERATION, &e)));
                }
            }
            Ok(answers) => {
                for (request, answer) in batch.drain(..).zip(answers) {
                    store.reply(request, Ok(answer)).await;
                }
            }
        }
    }
}

impl PostgresStore {
    /// Finish every request's job, and claim the next jobs of those that
    /// landed and asked, in one transaction; answers in request order. A
    /// failed claim aborts the transaction: the finishes are made again
    /// without it, and the claim loop will claim later.
    async fn finish_all(&self, batch: &[Request]) -> Result<Vec<(bool, Vec<Lease>)>, StoreError> {
        let answers = match self.land(batch, true).await? {
            Some(answers) => answers,
            None => self.land(batch, false).await?.unwrap_or_default(),
        };
        let changed = answers.iter().map(|(landed, next)| u64::from(*landed) + next.len() as u64).sum();
        self.inner.freshness.changed(changed, &self.inner.pool);
        Ok(answers)
    }

    /// Answer one request. A caller gone before its answer came (its
    /// future dropped) leaves the jobs its slot claimed: released to the
    /// queue again in their places, not left running until their leases
    /// expire.
    async fn reply(&self, request: Request, answer: Answer) {
        let now = request.next.as_ref().map(|next| next.now);
        let (Err(Ok((_, leases))), Some(now)) = (request.reply.send(answer), now) else { return };
        for lease in leases {
            let release = JobReleaseParams {
                id: lease.job.id,
                token: lease.token,
                queue_ttl: Duration::ZERO,
                run_after: lease.job.run_after,
                now,
            };
            if let Err(e) = self.job_release(release).await {
                tracing::debug!(job = %lease.job.id, error = %e, "could not release a job claimed for a caller gone");
            }
        }
    }

    /// One try of [`Self::finish_all`], claiming or not; `None`: the
    /// claim failed and nothing changed.
    async fn land(&self, batch: &[Request], claiming: bool) -> Result<Option<Vec<(bool, Vec<Lease>)>>, StoreError> {
        let err = db_err(OPERATION);
        let mut client = self.client(OPERATION).await?;
        let proposing = batch.iter().any(|r| !r.params.proposals.is_empty());
        let claims = batch.iter().filter_map(|r| r.next.as_ref()).map(|next| next.now).max().filter(|_| claiming);
        if claims.is_none() && !proposing {
            // Nothing else to land with them: one statement, no transaction.
            let landed = finish_rows(&client, batch).await?;
            return Ok(Some(landed.into_iter().map(|landed| (landed, Vec::new())).collect()));
        }
        let capped = match claims {
            Some(now) => {
                // A failed admission leaves the limited jobs to the next
                // claim; the finishes go on.
                let _ = self.admit_due(&client, now).await;
                self.any_capped(&client).await?
            }
            None => false,
        };
        let tx = client.transaction().await.map_err(&err)?;
        let landed = finish_rows(&tx, batch).await?;
        // Proposals land with their success or not at all.
        for (r, _) in batch.iter().zip(&landed).filter(|(_, landed)| **landed) {
            if r.params.finish.status() == JobStatus::Succeeded && !r.params.proposals.is_empty() {
                super::proposals::insert(&tx, r.params.id, &r.params.proposals).await?;
            }
        }
        let mut leases = match claims {
            Some(_) => match claim_next(&tx, batch, &landed, capped).await {
                Ok(leases) => leases,
                Err(_) => {
                    tx.rollback().await.map_err(&err)?;
                    return Ok(None);
                }
            },
            None => Vec::new(),
        };
        tx.commit().await.map_err(&err)?;
        leases.resize_with(batch.len(), Vec::new);
        Ok(Some(landed.into_iter().zip(leases).collect()))
    }
}

/// The finish: every ending in the arrays, each row found by its id and
/// fenced by its lease token alone (the module's "fenced" paragraph says
/// why not by status too).
pub(super) const FINISH: &str = "UPDATE jobs j SET status = f.status, output = f.output, error_kind = f.error_kind, \
             error_message = f.message, backtrace = f.backtrace, fuel_used = f.fuel, peak_memory_bytes = f.peak, \
             finished_at = f.now, last_heartbeat = f.now, lease_token = NULL, lease_expires_at = NULL, \
             progress_json = COALESCE(f.progress, j.progress_json), logs_json = f.logs \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[], \
               $8::int8[], $9::int8[], $10::int8[], $11::text[], $12::text[]) \
               AS f(id, token, status, output, error_kind, message, backtrace, fuel, peak, now, progress, logs) \
             WHERE j.job_id = f.id AND j.lease_token = f.token \
             RETURNING j.job_id, f.token";

/// Record every request's ending, each fenced by its own lease token, in
/// one statement ([`FINISH`]); whether each landed, indexed like `batch`.
async fn finish_rows(client: &impl GenericClient, batch: &[Request]) -> Result<Vec<bool>, StoreError> {
    let err = db_err(OPERATION);
    let stmt = client.prepare_cached(FINISH).await.map_err(&err)?;
    // One lock order for every batch (renewals lock in the same order).
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by_key(|&i| batch[i].params.id);
    let sorted: Vec<&JobFinishParams> = order.iter().map(|&i| &batch[i].params).collect();
    let columns: Vec<_> = sorted.iter().map(|p| p.finish.columns()).collect();
    let ids: Vec<String> = sorted.iter().map(|p| p.id.to_string()).collect();
    let tokens: Vec<&str> = sorted.iter().map(|p| p.token.as_str()).collect();
    let statuses: Vec<&str> = sorted.iter().map(|p| p.finish.status().as_str()).collect();
    let outputs: Vec<Option<&[u8]>> = columns.iter().map(|c| c.0).collect();
    let kinds: Vec<Option<&str>> = sorted.iter().map(|p| p.finish.error_kind().map(ErrorKind::as_str)).collect();
    let messages: Vec<Option<Cow<str>>> = columns.iter().map(|c| c.1.map(text)).collect();
    let backtraces: Vec<Option<Cow<str>>> = columns.iter().map(|c| c.2.map(text)).collect();
    let messages: Vec<Option<&str>> = messages.iter().map(Option::as_deref).collect();
    let backtraces: Vec<Option<&str>> = backtraces.iter().map(Option::as_deref).collect();
    let fuel: Vec<i64> = sorted.iter().map(|p| i64_of(p.fuel_used)).collect();
    let peak: Vec<i64> = sorted.iter().map(|p| i64_of(p.peak_memory_bytes)).collect();
    let nows: Vec<i64> = sorted.iter().map(|p| p.now.unix_ms()).collect();
    let progress: Vec<Option<String>> =
        sorted.iter().map(|p| p.progress.as_ref().map(to_json).transpose()).collect::<Result<_, _>>()?;
    let logs: Vec<Option<String>> =
        sorted.iter().map(|p| p.logs.as_ref().map(to_json).transpose()).collect::<Result<_, _>>()?;
    let rows = client
        .query(
            &stmt,
            &[
                &ids,
                &tokens,
                &statuses,
                &outputs,
                &kinds,
                &messages,
                &backtraces,
                &fuel,
                &peak,
                &nows,
                &progress,
                &logs,
            ],
        )
        .await
        .map_err(&err)?;
    let found: HashSet<(&str, &str)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut landed = vec![false; batch.len()];
    for ((&i, id), token) in order.iter().zip(&ids).zip(&tokens) {
        landed[i] = found.contains(&(id.as_str(), *token));
    }
    Ok(landed)
}

/// Claim the next jobs of the requests that landed and asked, one claim
/// per claimer (worker, lease length, alone or not); each such request
/// gets at most its own limit, in request order. Indexed like `batch`.
async fn claim_next(
    client: &impl GenericClient,
    batch: &[Request],
    landed: &[bool],
    capped: bool,
) -> Result<Vec<Vec<Lease>>, StoreError> {
    let mut leases: Vec<Vec<Lease>> = batch.iter().map(|_| Vec::new()).collect();
    let mut waiting: Vec<(usize, &JobClaimParams)> = batch
        .iter()
        .enumerate()
        .filter(|(i, _)| landed[*i])
        .filter_map(|(i, r)| r.next.as_ref().map(|next| (i, next)))
        .filter(|(_, next)| next.limit > 0)
        .collect();
    while let Some(&(_, first)) = waiting.first() {
        let same = |next: &JobClaimParams| {
            next.worker_id == first.worker_id && next.lease_ttl == first.lease_ttl && next.alone == first.alone
        };
        let (group, rest): (Vec<_>, Vec<_>) = waiting.iter().partition(|(_, next)| same(next));
        let params = JobClaimParams {
            worker_id: first.worker_id.clone(),
            // What the group asked, together: every lease claimed has a
            // request to go to.
            limit: group.iter().map(|(_, next)| next.limit).sum(),
            alone: first.alone,
            lease_ttl: first.lease_ttl,
            now: group.iter().map(|(_, next)| next.now).max().unwrap_or(first.now),
            aged: group.iter().map(|(_, next)| next.aged).sum(),
        };
        let mut claimed = claim(client, &params, capped).await?.into_iter();
        for (i, next) in &group {
            leases[*i].extend(claimed.by_ref().take(next.limit as usize));
        }
        waiting = rest;
    }
    Ok(leases)
}
