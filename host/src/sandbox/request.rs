//! What a run is asked to do: its request and its limits.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::job::{Grants, Target};
use crate::sandbox::http::{EffectFence, EffectLedger, EgressLimits};
use crate::sandbox::{
    DEFAULT_CANCEL_GRACE, DEFAULT_CAPTURE_BYTES, DEFAULT_LOG_BYTES, DEFAULT_LOG_RECORDS, DEFAULT_MEMORY_BYTES,
    DEFAULT_OUTPUT_BYTES, DEFAULT_TIMEOUT, HOSTCALL_SLACK_BYTES,
};

/// Limits of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunLimits {
    /// Wall-clock limit, including instantiation.
    pub timeout: Duration,
    /// Fuel budget; `None` means unlimited (fuel is still counted).
    pub fuel: Option<u64>,
    /// Linear memory, summed over the component's memories.
    pub memory_bytes: u64,
    /// Largest output accepted.
    pub output_bytes: u64,
    /// Log records kept.
    pub log_records: usize,
    /// Log bytes kept.
    pub log_bytes: usize,
    /// Captured stdout and stderr, each.
    pub capture_bytes: usize,
    /// Time between a cooperative stop request and a forced stop.
    pub cancel_grace: Duration,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            timeout: DEFAULT_TIMEOUT,
            fuel: None,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            output_bytes: DEFAULT_OUTPUT_BYTES,
            log_records: DEFAULT_LOG_RECORDS,
            log_bytes: DEFAULT_LOG_BYTES,
            capture_bytes: DEFAULT_CAPTURE_BYTES,
            cancel_grace: DEFAULT_CANCEL_GRACE,
        }
    }
}

/// One run of a plugin.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The job id shown to the guest (empty for one-shot runs).
    pub job_id: String,
    /// Phase or action.
    pub target: Target,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Input bytes.
    pub input: Vec<u8>,
    /// Limits.
    pub limits: RunLimits,
    /// What the guest may use outside its sandbox (HTTP, config); the
    /// default grants nothing.
    pub grants: Arc<Grants>,
    /// Fences and records each effectful request; `None`: neither.
    pub effects: Option<Arc<dyn EffectLedger>>,
    /// Gives each outbound request its slot under the rate limits that
    /// apply to it; `None`: no limit applies.
    pub egress: Option<Arc<dyn EgressLimits>>,
    /// What the phase may do with effects: a plan's execute phase
    /// proposes them, its apply phase sends only approved ones.
    pub fence: EffectFence,
}

impl RunRequest {
    /// A one-shot run of `target` on `input`: no job id, attempt 1,
    /// nothing granted, no effect ledger, not fenced as a plan's phase.
    pub fn new(target: Target, input: Vec<u8>, limits: RunLimits) -> Self {
        RunRequest {
            job_id: String::new(),
            target,
            attempt: 1,
            input,
            limits,
            grants: Arc::default(),
            effects: None,
            egress: None,
            fence: EffectFence::Open,
        }
    }
}

/// Data the guest may hand over in one call: its output (with room for
/// the result's framing) or, for host calls, [`HOSTCALL_SLACK_BYTES`].
pub(super) fn hostcall_fuel(limits: &RunLimits) -> usize {
    usize::try_from(limits.output_bytes).unwrap_or(usize::MAX).saturating_add(HOSTCALL_SLACK_BYTES)
}
