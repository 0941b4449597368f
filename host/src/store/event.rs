//! The change feed: what happened to jobs and workers, in the order the
//! store committed it. Each backend appends an event row from a trigger in
//! the transaction that makes the change, so every process sharing the
//! database (a `leash worker` elsewhere included) feeds the same stream,
//! and an event exists exactly when its change does.
//!
//! An [`EventId`] orders events; a client resumes after the last one it
//! saw. SQLite numbers events in commit order (its writers are serialised).
//! PostgreSQL's transactions commit out of their numbering's order, so an
//! event is ordered by its transaction's id, then its own number, and is
//! read only once every older transaction has ended: nothing can then
//! appear before an id already handed out.
//!
//! Events are kept for the event TTL; the retention sweep deletes the
//! oldest as one prefix and records how far it went (the horizon), so a
//! client resuming from before the horizon is told it missed events.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::WorkerState;
use crate::clock::Timestamp;
use crate::job::{Digest, ErrorKind, JobId, JobProgress, JobStatus, PluginName, PluginRef, Target};
use crate::store::StoreError;

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

crate::job::serde_as_text!(EventId);

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

/// Which events a reader wants; unset fields match everything. A job
/// filter leaves worker events out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only this job's events.
    pub job: Option<JobId>,
    /// Only events of this plan's jobs.
    pub plan_id: Option<String>,
    /// Only events of this plugin's jobs: a digest, a name (any version) or
    /// `name@version`.
    pub plugin: Option<PluginRef>,
    /// Only job events that leave the job in one of these states.
    pub status: Vec<JobStatus>,
}

impl EventFilter {
    /// True when nothing is filtered.
    pub fn is_empty(&self) -> bool {
        *self == EventFilter::default()
    }

    /// Whether `event` passes.
    pub fn matches(&self, event: &Event) -> bool {
        let Some(job) = &event.job else { return self.is_empty() };
        self.job.is_none_or(|id| id == job.id)
            && self.plan_id.as_ref().is_none_or(|plan| job.plan_id.as_ref() == Some(plan))
            && self.plugin.as_ref().is_none_or(|plugin| match plugin {
                PluginRef::Digest(d) => *d == job.digest,
                PluginRef::Name(name) => job.plugin.as_ref().is_some_and(|p| p.name == *name),
                PluginRef::Version(wanted) => job.plugin.as_ref() == Some(wanted),
            })
            && (self.status.is_empty() || self.status.contains(&job.status))
    }
}

/// Parameters of [`Events::events_after`].
#[derive(Debug, Clone, Copy)]
pub struct EventsAfterParams {
    /// Events after this one; `None`: from the oldest kept.
    pub after: Option<EventId>,
    /// Most events to return (at least 1).
    pub limit: u32,
}

/// A page of the feed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventPage {
    /// Events after the given id, in order.
    pub events: Vec<Event>,
    /// Events after the given id were deleted by retention before this
    /// read: the reader missed some and should reload what it shows.
    pub missed: bool,
}

/// What a stored event row says, before it is read into an [`Event`]:
/// the columns both backends share.
#[derive(Debug, Default)]
pub(super) struct EventRow {
    pub(super) id: EventId,
    pub(super) at_ms: i64,
    /// `insert`, `status`, `progress`, `cancel`, `worker_insert`,
    /// `worker_state` or `worker_delete`.
    pub(super) what: String,
    pub(super) job_id: Option<String>,
    pub(super) plan_id: Option<String>,
    pub(super) plugin_digest: Option<String>,
    pub(super) plugin_name: Option<String>,
    pub(super) plugin_version: Option<String>,
    pub(super) phase: Option<String>,
    pub(super) action: Option<String>,
    /// The job's status, or the worker's state.
    pub(super) status: Option<String>,
    /// The status (or state) before a change.
    pub(super) previous: Option<String>,
    pub(super) attempt: Option<i64>,
    pub(super) worker_id: Option<String>,
    pub(super) error_kind: Option<String>,
    pub(super) progress_json: Option<String>,
}

impl EventRow {
    /// Read the row; a row that does not parse is corrupt.
    pub(super) fn into_event(self) -> Result<Event, super::StoreError> {
        let id = self.id;
        let corrupt = |detail: String| super::StoreError::Corrupt { id: format!("event {id}"), detail };
        let at = Timestamp::from_unix_ms(self.at_ms);
        let required = |value: Option<String>, column: &str| value.ok_or_else(|| corrupt(format!("{column} is NULL")));
        let worker = |kind: EventKind, row: EventRow| -> Result<Event, super::StoreError> {
            let state: WorkerState = required(row.status, "status")?.parse().map_err(corrupt)?;
            let previous_state = parse_column(row.previous).map_err(corrupt)?;
            let id = required(row.worker_id, "worker_id")?;
            Ok(Event { id: row.id, kind, at, job: None, worker: Some(WorkerEvent { id, state, previous_state }) })
        };
        let worker_kind = match self.what.as_str() {
            "worker_insert" => Some(EventKind::WorkerJoined),
            "worker_state" => Some(EventKind::WorkerChanged),
            "worker_delete" => Some(EventKind::WorkerLeft),
            _ => None,
        };
        if let Some(kind) = worker_kind {
            return worker(kind, self);
        }
        let status: JobStatus = required(self.status, "status")?.parse().map_err(corrupt)?;
        let previous_status: Option<JobStatus> = parse_column(self.previous).map_err(corrupt)?;
        let kind = match (self.what.as_str(), previous_status) {
            ("insert", _) if status == JobStatus::PendingApproval => EventKind::JobApprovalNeeded,
            ("insert", _) => EventKind::JobSubmitted,
            ("status", Some(from)) => EventKind::of_transition(from, status),
            ("progress", _) => EventKind::JobProgress,
            ("cancel", _) => EventKind::JobCancelRequested,
            (what, _) => return Err(corrupt(format!("unknown event {what:?}"))),
        };
        let target = crate::store::rules::codec::target_of(
            &format!("event {id}"),
            &required(self.phase, "phase")?,
            self.action,
        )?;
        let plugin = match (self.plugin_name, self.plugin_version) {
            (Some(name), Some(version)) => Some(PluginName::new(&name, &version).map_err(corrupt)?),
            _ => None,
        };
        let progress = self
            .progress_json
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|e| corrupt(format!("progress: {e}")))?;
        let job = JobEvent {
            id: required(self.job_id, "job_id")?.parse().map_err(corrupt)?,
            plan_id: self.plan_id,
            plugin,
            digest: required(self.plugin_digest, "plugin_digest")?.parse().map_err(corrupt)?,
            target,
            status,
            previous_status,
            attempt: self.attempt.unwrap_or(0).try_into().map_err(|_| corrupt("attempt out of range".into()))?,
            worker_id: self.worker_id,
            error_kind: parse_column(self.error_kind).map_err(corrupt)?,
            progress,
        };
        Ok(Event { id, kind, at, job: Some(job), worker: None })
    }
}

/// An optional text column read as `T`.
fn parse_column<T: FromStr<Err = String>>(value: Option<String>) -> Result<Option<T>, String> {
    value.map(|s| s.parse()).transpose()
}

/// The change feed, read in commit order.
#[async_trait::async_trait]
pub trait Events: Send + Sync + std::fmt::Debug {
    /// Events after `params.after`, in order, up to `params.limit`; and
    /// whether retention deleted some of them (see [`EventPage::missed`]).
    async fn events_after(&self, params: EventsAfterParams) -> Result<EventPage, StoreError>;

    /// The newest event a reader can see now (`None`: none kept yet): a
    /// reader that starts here sees what happens from now on.
    async fn events_head(&self) -> Result<Option<EventId>, StoreError>;
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
