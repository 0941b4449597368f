//! The change feed's vocabulary: what happened to a job or a worker, and
//! the id that orders it (how the store numbers and keeps events is in
//! [`crate::store::Events`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::job::{Digest, ErrorKind, JobId, JobProgress, JobStatus, PluginName, Target, WorkerState};

crate::job::serde_as_text!(EventId);
/// An event's place in the feed: opaque to clients, ordered, written
/// `<txn>-<seq>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventId {
    /// PostgreSQL: the writing transaction's id; SQLite: 0.
    pub txn: u64,
    /// The event's own number.
    pub seq: u64,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.txn, self.seq)
    }
}

impl FromStr for EventId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid event id {s:?}: expected the id of an event, as `<number>-<number>`");
        let (txn, seq) = s.trim().split_once('-').ok_or_else(bad)?;
        let number = |n: &str| if n.bytes().all(|b| b.is_ascii_digit()) { n.parse::<u64>().ok() } else { None };
        Ok(EventId { txn: number(txn).ok_or_else(bad)?, seq: number(seq).ok_or_else(bad)? })
    }
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum EventKind {
    /// A job was queued.
    #[serde(rename = "job.submitted")]
    JobSubmitted,
    /// A job was stored gated: it waits in `pending_approval`.
    #[serde(rename = "job.approval_needed")]
    JobApprovalNeeded,
    /// A gated job was approved (queued, or `approved` to wait for its run).
    #[serde(rename = "job.approved")]
    JobApproved,
    /// An approved job's run was triggered: it is queued.
    #[serde(rename = "job.queued")]
    JobQueued,
    /// A worker claimed the job: an attempt started.
    #[serde(rename = "job.started")]
    JobStarted,
    /// The running guest reported progress.
    #[serde(rename = "job.progress")]
    JobProgress,
    /// Someone asked a running job to stop.
    #[serde(rename = "job.cancel_requested")]
    JobCancelRequested,
    /// A running job went back to the queue (a lost lease, a retry, a
    /// release at shutdown).
    #[serde(rename = "job.requeued")]
    JobRequeued,
    /// The job ended: succeeded, failed or cancelled (rejections and
    /// expiries included).
    #[serde(rename = "job.finished")]
    JobFinished,
    /// A worker pool registered.
    #[serde(rename = "worker.joined")]
    WorkerJoined,
    /// A worker pool changed state (draining, stopped).
    #[serde(rename = "worker.changed")]
    WorkerChanged,
    /// A worker pool's row was deleted (stopped or silent past retention).
    #[serde(rename = "worker.left")]
    WorkerLeft,
}

impl EventKind {
    /// The name clients see (`event:` in the stream, `type` in JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::JobSubmitted => "job.submitted",
            EventKind::JobApprovalNeeded => "job.approval_needed",
            EventKind::JobApproved => "job.approved",
            EventKind::JobQueued => "job.queued",
            EventKind::JobStarted => "job.started",
            EventKind::JobProgress => "job.progress",
            EventKind::JobCancelRequested => "job.cancel_requested",
            EventKind::JobRequeued => "job.requeued",
            EventKind::JobFinished => "job.finished",
            EventKind::WorkerJoined => "worker.joined",
            EventKind::WorkerChanged => "worker.changed",
            EventKind::WorkerLeft => "worker.left",
        }
    }

    /// The kind of a job's status change from `from` to `to`.
    pub fn of_transition(from: JobStatus, to: JobStatus) -> EventKind {
        match (from, to) {
            (_, JobStatus::Running) => EventKind::JobStarted,
            (_, to) if to.is_terminal() => EventKind::JobFinished,
            (JobStatus::PendingApproval, _) => EventKind::JobApproved,
            (JobStatus::Running, _) => EventKind::JobRequeued,
            _ => EventKind::JobQueued,
        }
    }
}

/// The job an event is about, as it was right after the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobEvent {
    /// The job.
    pub id: JobId,
    /// Its plan, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<String>,
    /// The registered name it was submitted under, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginName>,
    /// The plugin's digest.
    pub digest: Digest,
    /// Phase or action.
    pub target: Target,
    /// Its state after the change.
    pub status: JobStatus,
    /// Its state before, for a status change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_status: Option<JobStatus>,
    /// Its attempt number (0 before its first claim).
    pub attempt: u32,
    /// The worker running it, while it runs (and the last one after).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// Why it failed or was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    /// Its latest progress report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<JobProgress>,
}

/// The worker pool an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkerEvent {
    /// `worker-<8 hex>`.
    pub id: String,
    /// Its state after the change (its last, when it left).
    pub state: WorkerState,
    /// Its state before, for a change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_state: Option<WorkerState>,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// Its place in the stream.
    pub id: EventId,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// When it was recorded: by the database server's clock (PostgreSQL),
    /// or by the writing process's as its transaction began (SQLite).
    pub at: Timestamp,
    /// The job, for `job.*` events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<JobEvent>,
    /// The worker pool, for `worker.*` events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_id_round_trips_and_orders_by_transaction_then_number() {
        let id: EventId = "12-7".parse().unwrap();
        assert_eq!(id, EventId { txn: 12, seq: 7 });
        assert_eq!(id.to_string(), "12-7");
        assert!(EventId { txn: 12, seq: 9 } < EventId { txn: 13, seq: 1 });
        for bad in ["", "7", "1-", "-1", "a-1", "1-+2", "1-2-3", "99999999999999999999-1"] {
            assert!(bad.parse::<EventId>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_status_change_is_named_by_where_it_leads() {
        use JobStatus::*;
        assert_eq!(EventKind::of_transition(Queued, Running), EventKind::JobStarted);
        assert_eq!(EventKind::of_transition(Running, Succeeded), EventKind::JobFinished);
        assert_eq!(EventKind::of_transition(Queued, Cancelled), EventKind::JobFinished);
        assert_eq!(EventKind::of_transition(PendingApproval, Cancelled), EventKind::JobFinished);
        assert_eq!(EventKind::of_transition(PendingApproval, Queued), EventKind::JobApproved);
        assert_eq!(EventKind::of_transition(PendingApproval, Approved), EventKind::JobApproved);
        assert_eq!(EventKind::of_transition(Approved, Queued), EventKind::JobQueued);
        assert_eq!(EventKind::of_transition(Running, Queued), EventKind::JobRequeued);
    }

    #[test]
    fn the_kind_names_are_the_json_names() {
        for kind in [EventKind::JobSubmitted, EventKind::JobCancelRequested, EventKind::WorkerLeft] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }
}
