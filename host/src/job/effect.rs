//! The effect ledger's entries: every effectful request a job's guest
//! made, recorded before it was sent and completed after.

use serde::{Deserialize, Serialize};

use super::JobId;
use crate::clock::Timestamp;

/// One effect: an outbound request with a method its grant does not mark
/// safe (by default any but `GET` and `HEAD`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Effect {
    /// The attempt that made it (1 for the first).
    pub attempt: u32,
    /// Its place among the attempt's effects, from 1.
    pub seq: u32,
    /// The request method.
    pub method: String,
    /// `scheme://host[:port]/path`: the query and any credentials are
    /// never recorded.
    pub url: String,
    /// The `Idempotency-Key` the request carried: `<job id>/<seq>`, the
    /// same for the same place in every attempt; for an apply phase's
    /// approved proposal, `<job id>/proposal/<n>`, the same in every
    /// attempt that sends it.
    pub idempotency_key: String,
    /// The approved proposal it sent (an apply phase's effects only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal: Option<u32>,
    /// When the intent was recorded (before the first byte was sent).
    pub started_at: Timestamp,
    /// When the outcome was recorded; absent while in flight, or if the
    /// attempt ended (killed, cut off) before it knew.
    pub finished_at: Option<Timestamp>,
    /// The response status, when one came back.
    pub status: Option<u16>,
    /// The transport error, when none did.
    pub error: Option<String>,
}

impl Effect {
    /// The key of the `seq`th effect of any attempt of `job`.
    pub fn idempotency_key(job: JobId, seq: u32) -> String {
        format!("{job}/{seq}")
    }

    /// The key of every request of `job` that sends its approved
    /// proposal `n`.
    pub fn proposal_key(job: JobId, n: u32) -> String {
        format!("{job}/proposal/{n}")
    }
}

/// How an effect ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectOutcome {
    /// A response came back with this status.
    Status(u16),
    /// No response: the transport error, as text.
    Error(String),
}
