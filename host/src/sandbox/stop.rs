//! Asking a running job to stop, in two steps.
//!
//! `request` is cooperative: the guest's `cancelled()` turns true and its
//! progress heartbeat answers "stop". If the guest has not returned after
//! the job's cancel grace, or once `force` is called, the host stops it:
//! epoch interruption traps a guest that is computing, and dropping the
//! call ends one that is blocked in a host call or a WASI sleep.

use std::sync::Arc;

use tokio::sync::watch;

/// How far a stop has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Running,
    Requested,
    Forced,
}

/// A cloneable handle that stops one job. Cheap to check from the epoch
/// callback and from host imports.
#[derive(Debug, Clone)]
pub struct StopHandle {
    phase: Arc<watch::Sender<Phase>>,
}

impl Default for StopHandle {
    fn default() -> Self {
        StopHandle { phase: Arc::new(watch::Sender::new(Phase::Running)) }
    }
}

impl StopHandle {
    /// A handle with no stop requested.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask the guest to stop cooperatively; it is stopped by force once its
    /// cancel grace has passed.
    pub fn request(&self) {
        self.phase.send_if_modified(|p| {
            let changed = *p == Phase::Running;
            if changed {
                *p = Phase::Requested;
            }
            changed
        });
    }

    /// Stop the guest now, without waiting for the grace period.
    pub fn force(&self) {
        self.phase.send_if_modified(|p| {
            let changed = *p != Phase::Forced;
            *p = Phase::Forced;
            changed
        });
    }

    /// True once a stop was requested (or forced).
    pub fn is_requested(&self) -> bool {
        *self.phase.borrow() >= Phase::Requested
    }

    /// True once a stop was forced.
    pub fn is_forced(&self) -> bool {
        *self.phase.borrow() == Phase::Forced
    }

    /// Resolves once a stop was requested.
    pub async fn requested(&self) {
        let mut rx = self.phase.subscribe();
        // The sender lives in `self`, so the channel cannot close.
        let _ = rx.wait_for(|p| *p >= Phase::Requested).await;
    }

    /// Resolves once a stop was forced.
    pub async fn forced(&self) {
        let mut rx = self.phase.subscribe();
        let _ = rx.wait_for(|p| *p == Phase::Forced).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn request_then_force_moves_forward_only() {
        let stop = StopHandle::new();
        assert!(!stop.is_requested());
        stop.request();
        stop.requested().await;
        assert!(stop.is_requested() && !stop.is_forced());
        stop.force();
        stop.forced().await;
        stop.request();
        assert!(stop.is_forced(), "a later request does not undo a force");
    }
}
