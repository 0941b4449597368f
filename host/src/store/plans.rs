//! Plans: a plan's record, its listing and the sweep that advances it.

use crate::clock::Timestamp;
use crate::job::{ApplyMode, NewJob};

/// Parameters of [`JobStore::plan_insert`](super::JobStore::plan_insert).
#[derive(Debug, Clone)]
pub struct PlanInsertParams {
    /// The new plan's id (a ULID).
    pub plan_id: String,
    /// How its apply phase starts.
    pub apply_mode: ApplyMode,
    /// The plan's input (its execute job's input too).
    pub input: Vec<u8>,
    /// The execute job: target `execute`, with the plan's id as its
    /// `plan_id` and concurrency key. Its queue and approval TTLs are the
    /// apply job's too.
    pub execute: NewJob,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::plan_list`](super::JobStore::plan_list): newest first, keyset-paged.
#[derive(Debug, Clone, Default)]
pub struct PlanListParams {
    /// Only plans older than this one (the previous page's last id).
    pub before: Option<String>,
    /// Most plans to return (at least 1).
    pub limit: u32,
}

/// Parameters of [`JobStore::plans_advance`](super::JobStore::plans_advance).
#[derive(Debug, Clone)]
pub struct PlansAdvanceParams {
    /// Only this plan (`None`: every plan whose execute job succeeded and
    /// whose apply job does not exist yet).
    pub plan_id: Option<String>,
    /// Now.
    pub now: Timestamp,
}
