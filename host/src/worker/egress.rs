//! The pool's [`EgressLimits`]: the limits that apply to outbound requests,
//! read from the store at most once per [`LIMITS_FRESH_FOR`], and each
//! matching request's slot reserved in the store, so the limit holds
//! across every process sharing it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::job::rate::{Outbound, RateLimit, Reservation, egress_buckets};
use crate::metrics::Metrics;
use crate::sandbox::http::{EgressLimits, Pace};
use crate::store::{JobStore, RateReserveParams};

/// How long a read of the limits is used: a limit set or removed applies
/// to outbound requests in every process within this long.
pub const LIMITS_FRESH_FOR: Duration = Duration::from_secs(1);

/// Egress limits from the store.
pub struct StoreEgress {
    store: Arc<dyn JobStore>,
    clock: Arc<dyn Clock>,
    /// The limits naming hosts or secrets, and when they were read.
    read: tokio::sync::Mutex<Option<(Instant, Arc<Vec<RateLimit>>)>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for StoreEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreEgress").finish_non_exhaustive()
    }
}

impl StoreEgress {
    /// Limits read from `store`, slots measured by `clock`.
    pub fn new(store: Arc<dyn JobStore>, clock: Arc<dyn Clock>, metrics: Arc<Metrics>) -> Self {
        StoreEgress { store, clock, read: tokio::sync::Mutex::new(None), metrics }
    }

    /// The limits that apply to outbound requests, as last read.
    async fn limits(&self) -> Result<Arc<Vec<RateLimit>>, String> {
        let mut read = self.read.lock().await;
        if let Some((at, limits)) = &*read
            && at.elapsed() < LIMITS_FRESH_FOR
        {
            return Ok(limits.clone());
        }
        let all = self.store.rate_limits().await.map_err(|e| format!("the rate limits could not be read: {e}"))?;
        let limits = Arc::new(all.into_iter().filter(RateLimit::limits_egress).collect::<Vec<_>>());
        *read = Some((Instant::now(), limits.clone()));
        Ok(limits)
    }
}

#[async_trait::async_trait]
impl EgressLimits for StoreEgress {
    async fn pace(&self, request: &Outbound<'_>, at_most: Duration) -> Result<Pace, String> {
        let limits = self.limits().await?;
        let buckets = egress_buckets(&limits, request);
        if buckets.is_empty() {
            return Ok(Pace::Now);
        }
        let mut names: Vec<String> = buckets.iter().map(|(limit, _)| limit.clone()).collect();
        names.dedup();
        let now = self.clock.now();
        let params = RateReserveParams { buckets, now, latest: now.plus(at_most) };
        let reservation =
            self.store.rate_reserve(params).await.map_err(|e| format!("the rate slot could not be reserved: {e}"))?;
        let away =
            |slot: crate::clock::Timestamp| Duration::from_millis((slot.unix_ms() - now.unix_ms()).max(0) as u64);
        Ok(match reservation {
            Reservation::At(slot) if slot <= now => Pace::Now,
            Reservation::At(slot) => {
                self.metrics.rate_wait("waited");
                Pace::After(away(slot), names)
            }
            Reservation::TooLate(slot) => {
                self.metrics.rate_wait("too_late");
                Pace::TooLate(away(slot), names)
            }
        })
    }
}

/// One attempt's view of the pool's egress limits: a slot the store could
/// not give is the host's fault, not the guest's, so an attempt that then
/// fails is released to run again rather than failed (as the effect
/// ledger's store faults are).
#[derive(Debug)]
pub(crate) struct AttemptEgress {
    pub(crate) limits: Arc<StoreEgress>,
    pub(crate) watch: Arc<crate::worker::lease::LeaseWatch>,
}

#[async_trait::async_trait]
impl EgressLimits for AttemptEgress {
    async fn pace(&self, request: &Outbound<'_>, at_most: Duration) -> Result<Pace, String> {
        let paced = self.limits.pace(request, at_most).await;
        if paced.is_err() {
            self.watch.host_refused.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        paced
    }
}
