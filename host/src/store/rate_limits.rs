//! Rate limits, as stored: the named limits, and (inside each backend's
//! claim) the buckets that give a due job naming one its slot. See
//! [`crate::job::rate`] for the rule.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::clock::Timestamp;
use crate::job::rate::{RateLimit, Reservation};
use crate::store::StoreError;

/// Parameters of [`RateLimits::rate_limit_remove`].
#[derive(Debug, Clone)]
pub struct RateLimitRemoveParams {
    /// The limit.
    pub name: String,
    /// Who removes it (audited).
    pub actor: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`RateLimits::rate_reserve`].
#[derive(Debug, Clone)]
pub struct RateReserveParams {
    /// `(limit, bucket)` pairs, in key order (see
    /// [`egress_buckets`](crate::job::rate::egress_buckets)).
    pub buckets: Vec<(String, String)>,
    /// Now.
    pub now: Timestamp,
    /// The latest slot worth taking.
    pub latest: Timestamp,
}

/// The audit detail of a limit as set: its rate, burst, hosts and
/// secrets.
pub(crate) fn audited(limit: &RateLimit) -> serde_json::Value {
    serde_json::json!({ "rate": limit.rate, "burst": limit.burst, "hosts": limit.hosts, "secrets": limit.secrets })
}

/// Setting, reading and removing named rate limits, and reserving an
/// outbound request's slot.
#[async_trait::async_trait]
pub trait RateLimits: Send + Sync + std::fmt::Debug {
    /// Create a limit or change one (its buckets keep their state: a
    /// change applies from the next slot given). Audited.
    async fn rate_limit_set(&self, limit: RateLimit) -> Result<RateLimit, StoreError>;

    /// A limit by name.
    async fn rate_limit_get(&self, name: &str) -> Result<Option<RateLimit>, StoreError>;

    /// Every limit, by name.
    async fn rate_limits(&self) -> Result<Vec<RateLimit>, StoreError>;

    /// Remove a limit and its buckets: jobs that name it start unlimited.
    /// `false`: there was none. Audited.
    async fn rate_limit_remove(&self, params: RateLimitRemoveParams) -> Result<bool, StoreError>;

    /// Take one outbound request's slot in every bucket of
    /// `params.buckets`, together and atomically across every process
    /// sharing the store (see
    /// [`reserve_together`](crate::job::rate::reserve_together)).
    async fn rate_reserve(&self, params: RateReserveParams) -> Result<Reservation, StoreError>;
}

/// Wakes this process's workers when a slot a claim reserved comes, so a
/// job given a slot a moment away starts at it rather than at the next
/// poll. One timer at a time, for the earliest slot.
#[derive(Debug, Clone)]
pub(crate) struct SlotAlarm {
    signal: watch::Sender<u64>,
    armed: Arc<Mutex<Option<Timestamp>>>,
}

impl SlotAlarm {
    /// An alarm that bumps `signal` (the store's
    /// [`enqueued`](super::Leases::enqueued) signal).
    pub(crate) fn new(signal: watch::Sender<u64>) -> Self {
        SlotAlarm { signal, armed: Arc::default() }
    }

    /// Ring at `slot` (measured from `now`), unless a timer for an earlier
    /// slot is set; outside a tokio runtime, nothing.
    pub(crate) fn ring_at(&self, slot: Timestamp, now: Timestamp) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        {
            let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
            if armed.is_some_and(|at| at <= slot) {
                return;
            }
            *armed = Some(slot);
        }
        let wait = std::time::Duration::from_millis(u64::try_from(slot.unix_ms() - now.unix_ms()).unwrap_or(0));
        let alarm = self.clone();
        handle.spawn(async move {
            tokio::time::sleep(wait).await;
            let mut armed = alarm.armed.lock().unwrap_or_else(|e| e.into_inner());
            if *armed == Some(slot) {
                *armed = None;
            }
            drop(armed);
            super::leases::ring(&alarm.signal);
        });
    }
}
