//! The effect ledger: each effectful request begun and ended under the
//! job's lease.

use crate::clock::Timestamp;
use crate::job::{EffectOutcome, JobId};

/// Parameters of [`JobStore::effect_begin`](super::JobStore::effect_begin).
#[derive(Debug, Clone)]
pub struct EffectBeginParams {
    /// The job.
    pub id: JobId,
    /// The lease token of the attempt making the effect.
    pub token: String,
    /// The request method.
    pub method: String,
    /// `scheme://host[:port]/path`, without query or credentials.
    pub url: String,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::effect_end`](super::JobStore::effect_end).
#[derive(Debug, Clone)]
pub struct EffectEndParams {
    /// The job.
    pub id: JobId,
    /// The attempt, as [`JobStore::effect_begin`](super::JobStore::effect_begin) returned it.
    pub attempt: u32,
    /// The effect's place in the attempt.
    pub seq: u32,
    /// How it ended.
    pub outcome: EffectOutcome,
    /// Now.
    pub now: Timestamp,
}
