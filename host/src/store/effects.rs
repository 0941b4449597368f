//! The effect ledger: each effectful request begun and ended under the
//! job's lease.

use crate::clock::Timestamp;
use crate::job::{Effect, EffectOutcome, JobId};
use crate::store::StoreError;

/// Parameters of [`Effects::effect_begin`].
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
    /// The approved proposal it sends (an apply phase's effects only).
    pub proposal: Option<u32>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Effects::effect_end`].
#[derive(Debug, Clone)]
pub struct EffectEndParams {
    /// The job.
    pub id: JobId,
    /// The attempt, as [`Effects::effect_begin`] returned it.
    pub attempt: u32,
    /// The effect's place in the attempt.
    pub seq: u32,
    /// How it ended.
    pub outcome: EffectOutcome,
    /// Now.
    pub now: Timestamp,
}

/// The effect ledger: each outbound write an attempt makes, recorded
/// before it is made (fenced by the lease) and after it answers.
#[async_trait::async_trait]
pub trait Effects: Send + Sync + std::fmt::Debug {
    /// Record the intent of an effect, fenced by the lease: only while the
    /// job is running under `token`, in the attempt that token belongs to,
    /// numbered after that attempt's earlier effects; and, for an approved
    /// proposal, only while no effect of the job has sent it and been
    /// answered. Committed before it returns. `None`: the lease is not held
    /// (or the proposal was sent); nothing was recorded, and the effect
    /// must not be made.
    async fn effect_begin(&self, params: EffectBeginParams) -> Result<Option<Effect>, StoreError>;

    /// Record how an effect ended (not fenced: it happened either way).
    async fn effect_end(&self, params: EffectEndParams) -> Result<(), StoreError>;

    /// A job's effects, by attempt then place. Retention deletes them with
    /// the job.
    async fn effects(&self, id: JobId) -> Result<Vec<Effect>, StoreError>;
}
