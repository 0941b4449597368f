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

use crate::job::{Event, EventId, JobId, JobStatus, PluginRef};
use crate::store::StoreError;

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
