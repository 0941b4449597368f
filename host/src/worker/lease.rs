//! Keeping a claimed job's lease alive while its guest runs.
//!
//! The host renews every `lease_ttl / 3`. Each renewal reads back
//! `cancel_requested` in the same statement, so "I still own it" and "I
//! should stop" are one observation. A renewal that matches no row means the
//! lease is lost: the guest is stopped at once and its result is dropped.
//!
//! The lease also fences the guest's effects ([`LeaseLedger`]): an
//! effectful request is sent only while the attempt holds its lease and is
//! not stopping, after a renewal no older than a renewal period, and once
//! its intent is recorded under the lease token.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Timestamp};
use crate::job::{EffectOutcome, JobId};
use crate::metrics::Metrics;
use crate::sandbox::StopHandle;
use crate::sandbox::http::EffectTicket;
use crate::store::{EffectBeginParams, EffectEndParams, Effects, LeaseExtendParams, LeaseState, Leases, StoreError};

/// What the keeper saw; read after the guest has ended.
#[derive(Debug, Default)]
pub struct LeaseWatch {
    /// The lease was lost: drop the result.
    pub lost: AtomicBool,
    /// A cancel was requested through the store.
    pub cancel_requested: AtomicBool,
    /// When the store last confirmed the lease (ms since the epoch, by the
    /// keeper's clock): the claim, then each renewal that held.
    pub confirmed_at_ms: AtomicI64,
    /// An effect was refused for a passing fault of the host's, not the
    /// guest's: the store stayed busy, or was closing, when the lease was
    /// to be confirmed or the intent recorded. A guest that then fails is
    /// released to run again rather than failed.
    pub host_refused: AtomicBool,
    /// Effects the store recorded for this attempt (a release after one
    /// spends an attempt; before any, it is free).
    pub effects_recorded: std::sync::atomic::AtomicU32,
}

/// One job's lease.
#[derive(Debug, Clone)]
pub struct LeaseKeeper {
    /// The store holding the lease.
    pub store: Arc<dyn Leases>,
    /// Time source for `now`.
    pub clock: Arc<dyn Clock>,
    /// The job.
    pub id: JobId,
    /// Its lease token.
    pub token: String,
    /// Lease length.
    pub lease_ttl: Duration,
    /// Where renewals are counted.
    pub metrics: Arc<Metrics>,
}

impl LeaseKeeper {
    /// The renewal period: a third of the lease, so two renewals may fail
    /// before the lease runs out.
    pub fn period(&self) -> Duration {
        (self.lease_ttl / 3).max(Duration::from_millis(1))
    }

    /// Renew once. On `Lost` the guest is stopped by force.
    pub async fn renew_once(&self, stop: &StopHandle, watch: &LeaseWatch) -> Result<LeaseState, StoreError> {
        let params = LeaseExtendParams {
            id: self.id,
            token: self.token.clone(),
            lease_ttl: self.lease_ttl,
            now: self.clock.now(),
        };
        let asked_at = params.now;
        let state = self.store.lease_extend(params).await?;
        match state {
            LeaseState::Held { cancel_requested } => {
                self.metrics.lease_renewals.inc();
                watch.confirmed_at_ms.fetch_max(asked_at.unix_ms(), Ordering::SeqCst);
                if cancel_requested {
                    watch.cancel_requested.store(true, Ordering::SeqCst);
                    stop.request();
                }
            }
            LeaseState::Lost => {
                watch.lost.store(true, Ordering::SeqCst);
                stop.force();
            }
        }
        Ok(state)
    }

    /// Whether the lease that runs out at `expires_at` may still be relied
    /// on to start the guest. A claim is normally a few milliseconds old
    /// here, and renewed while the plugin loads; after a pause (a stopped
    /// process, renewals held up) the sweeper may have reclaimed the job,
    /// so a lease with less than two renewal periods left is renewed
    /// first. `false`: do not start.
    pub async fn confirm_before_start(
        &self,
        expires_at: Option<Timestamp>,
        stop: &StopHandle,
        watch: &LeaseWatch,
    ) -> bool {
        let now = self.clock.now();
        let fresh = expires_at.is_some_and(|at| now.plus(self.period() * 2) < at);
        if fresh {
            return true;
        }
        match self.renew_once(stop, watch).await {
            Ok(LeaseState::Held { .. }) => true,
            Ok(LeaseState::Lost) => false,
            // The store did not answer: start only while the lease is
            // certainly still ours by the local clock.
            Err(_) => expires_at.is_some_and(|at| self.clock.now() < at),
        }
    }

    /// Renew every period until the lease is lost; then wait forever (the
    /// caller races this against the guest's run).
    pub async fn keep(&self, stop: &StopHandle, watch: &LeaseWatch) {
        loop {
            tokio::time::sleep(self.period()).await;
            // A failed renewal is retried next period; the lease outlives two.
            if matches!(self.renew_once(stop, watch).await, Ok(LeaseState::Lost)) {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// One attempt's effects: fenced by its lease and recorded in the
/// effect ledger (see [`crate::sandbox::http::EffectLedger`]).
#[derive(Debug)]
pub struct LeaseLedger {
    /// The attempt's lease.
    pub keeper: LeaseKeeper,
    /// Where the attempt's effects are recorded.
    pub effects: Arc<dyn Effects>,
    /// The attempt's stop handle: a stopping attempt starts no new effect.
    pub stop: StopHandle,
    /// What the keeper has seen.
    pub watch: Arc<LeaseWatch>,
}

const LOST: &str = "the attempt's lease is lost";

/// Tries at a store call an effect depends on, and the first pause between
/// them (doubling): a store busy for a moment refuses no effect.
const STORE_TRIES: u32 = 5;
const STORE_PAUSE: Duration = Duration::from_millis(5);

/// `call`, again after a growing pause while the store answers with a
/// transient error, at most [`STORE_TRIES`] times.
async fn patiently<T, F: Future<Output = Result<T, StoreError>>>(mut call: impl FnMut() -> F) -> Result<T, StoreError> {
    let mut pause = STORE_PAUSE;
    for _ in 1..STORE_TRIES {
        match call().await {
            Err(e) if e.is_transient() => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            done => return done,
        }
    }
    call().await
}

impl LeaseLedger {
    /// `Ok` while the attempt holds its lease and is not stopping, after
    /// renewing a lease last confirmed a renewal period ago or more.
    pub async fn may_act(&self) -> Result<(), String> {
        let stopping = || self.known_refusal().map_or(Ok(()), Err);
        stopping()?;
        let confirmed = Timestamp::from_unix_ms(self.watch.confirmed_at_ms.load(Ordering::SeqCst));
        if confirmed.plus(self.keeper.period()) <= self.keeper.clock.now() {
            self.renew().await?;
        }
        // A renewal may have brought a cancel.
        stopping()
    }

    /// Renew the lease now: `Err` when it is lost, or the store could not
    /// say.
    async fn renew(&self) -> Result<(), String> {
        match patiently(|| self.keeper.renew_once(&self.stop, &self.watch)).await {
            Ok(LeaseState::Held { .. }) => Ok(()),
            Ok(LeaseState::Lost) => Err(LOST.to_owned()),
            Err(e) => Err(self.store_refusal("the store could not confirm the attempt's lease", &e)),
        }
    }

    /// Refuse an effect because the store failed: busy past the retries,
    /// closing, or failing outright. Whichever, it is the host's fault,
    /// not the guest's: it is remembered, and the attempt is released
    /// rather than failed if its guest then fails (no attempt is spent
    /// unless one of its effects was recorded).
    fn store_refusal(&self, what: &str, error: &StoreError) -> String {
        self.watch.host_refused.store(true, Ordering::SeqCst);
        format!("{what}: {error}")
    }

    /// When the lease runs out by the local clock: a TTL from its last
    /// confirmation.
    fn lease_until(&self) -> std::time::Instant {
        let confirmed = Timestamp::from_unix_ms(self.watch.confirmed_at_ms.load(Ordering::SeqCst));
        let left = confirmed.plus(self.keeper.lease_ttl).unix_ms() - self.keeper.clock.now().unix_ms();
        std::time::Instant::now() + Duration::from_millis(left.max(0) as u64)
    }

    /// Why no new effect may start, known without the store.
    fn known_refusal(&self) -> Option<String> {
        if self.watch.lost.load(Ordering::SeqCst) {
            Some(LOST.to_owned())
        } else if self.stop.is_requested() {
            Some("the attempt is stopping (cancelled, or released at shutdown)".to_owned())
        } else {
            None
        }
    }
}

#[async_trait::async_trait]
impl crate::sandbox::http::EffectLedger for LeaseLedger {
    fn refusing(&self) -> Option<String> {
        self.known_refusal()
    }

    async fn begin(&self, method: &str, url: &str, proposal: Option<u32>) -> Result<EffectTicket, String> {
        self.may_act().await?;
        let params = || EffectBeginParams {
            id: self.keeper.id,
            token: self.keeper.token.clone(),
            method: method.to_owned(),
            url: url.to_owned(),
            proposal,
            now: self.keeper.clock.now(),
        };
        // The intent is recorded under the lease token: a lease lost since
        // the check above records nothing, and the effect is not made.
        match patiently(|| self.effects.effect_begin(params())).await {
            Ok(Some(effect)) => {
                self.watch.effects_recorded.fetch_add(1, Ordering::SeqCst);
                Ok(EffectTicket {
                    attempt: effect.attempt,
                    seq: effect.seq,
                    idempotency_key: effect.idempotency_key,
                    lease_until: Some(self.lease_until()),
                })
            }
            Ok(None) => {
                self.watch.lost.store(true, Ordering::SeqCst);
                self.stop.force();
                Err(LOST.to_owned())
            }
            Err(e) => Err(self.store_refusal("the effect could not be recorded", &e)),
        }
    }

    async fn reconfirm(&self) -> Result<std::time::Instant, String> {
        self.renew().await?;
        Ok(self.lease_until())
    }

    async fn end(&self, ticket: &EffectTicket, outcome: EffectOutcome) {
        let params = || EffectEndParams {
            id: self.keeper.id,
            attempt: ticket.attempt,
            seq: ticket.seq,
            outcome: outcome.clone(),
            now: self.keeper.clock.now(),
        };
        if let Err(e) = patiently(|| self.effects.effect_end(params())).await {
            tracing::warn!(error = %e, seq = ticket.seq, "an effect's outcome could not be recorded");
        }
    }
}
