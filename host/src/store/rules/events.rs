//! An event row as both backends read it, and the event it means.

use std::str::FromStr;

use crate::clock::Timestamp;
use crate::job::{Event, EventId, EventKind, JobEvent, JobStatus, PluginName, WorkerEvent, WorkerState};
use crate::store::StoreError;

/// What a stored event row says, before it is read into an [`Event`]:
/// the columns both backends share.
#[derive(Debug, Default)]
pub(crate) struct EventRow {
    pub(crate) id: EventId,
    pub(crate) at_ms: i64,
    /// `insert`, `status`, `progress`, `cancel`, `worker_insert`,
    /// `worker_state` or `worker_delete`.
    pub(crate) what: String,
    pub(crate) job_id: Option<String>,
    pub(crate) plan_id: Option<String>,
    pub(crate) plugin_digest: Option<String>,
    pub(crate) plugin_name: Option<String>,
    pub(crate) plugin_version: Option<String>,
    pub(crate) phase: Option<String>,
    pub(crate) action: Option<String>,
    /// The job's status, or the worker's state.
    pub(crate) status: Option<String>,
    /// The status (or state) before a change.
    pub(crate) previous: Option<String>,
    pub(crate) attempt: Option<i64>,
    pub(crate) worker_id: Option<String>,
    pub(crate) error_kind: Option<String>,
    pub(crate) progress_json: Option<String>,
}

impl EventRow {
    /// Read the row; a row that does not parse is corrupt.
    pub(crate) fn into_event(self) -> Result<Event, StoreError> {
        let id = self.id;
        let corrupt = |detail: String| StoreError::Corrupt { id: format!("event {id}"), detail };
        let at = Timestamp::from_unix_ms(self.at_ms);
        let required = |value: Option<String>, column: &str| value.ok_or_else(|| corrupt(format!("{column} is NULL")));
        let worker = |kind: EventKind, row: EventRow| -> Result<Event, StoreError> {
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
