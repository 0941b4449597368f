//! The store seam: where jobs live between submission and retention.
//!
//! The store is a set of roles, each a trait with its params in its own
//! file: [`Jobs`], [`Leases`], [`Effects`], [`Sweeps`], [`Plugins`],
//! [`Plans`], [`Workers`], [`Events`], [`Sessions`], [`Principals`], [`Audit`],
//! [`StandingRules`], [`Pauses`], [`Schedules`] and [`RateLimits`]. [`JobStore`] is their sum, the
//! one interface the runtime holds; a part of leash that needs one role
//! holds only that one. Each backend implements every role in a file of
//! its own and owns its SQL and migrations ([`sqlite`], the embedded
//! default, and [`postgres`]); the decisions both backends share are in
//! `rules/`, with no SQL. Methods are noun-first and take params structs
//! with `now` injected. Every write that only a lease holder may make
//! takes the lease token and reports whether it took effect: `false` means
//! the lease was lost (the job was reclaimed, released or finished
//! elsewhere) and the caller must drop its result. The integration tests'
//! conformance suite holds the cases every backend must pass, one file per
//! role, each case a test per backend.
//!
//! This module knows nothing of wasm: it stores plugin digests and bytes.

mod audit;
mod database;
mod effects;
mod error;
mod events;
pub mod faults;
mod jobs;
mod leases;
mod pauses;
mod plans;
mod plugins;
pub mod postgres;
mod principals;
mod rate_limits;
mod rules;
mod schedules;
mod sessions;
mod sql;
pub mod sqlite;
mod standing;
mod sweeps;
mod workers;

pub use rules::unfinished::QUARANTINE_AFTER_DEATHS;

pub use audit::{Audit, AuditHead, AuditListParams, AuditNote, AuditRecord};
pub use database::{Database, Durability, open};
pub use effects::{EffectBeginParams, EffectEndParams, Effects};
pub use error::StoreError;
pub use events::{EventFilter, EventPage, Events, EventsAfterParams};
pub use jobs::{
    CancelResult, DecideRefusal, JobDecideParams, JobDecision, JobInsertParams, JobListParams, JobRedriveParams, Jobs,
    RedriveResult,
};
pub use leases::{
    AGED_AFTER, AGED_SHARE, Finish, JobClaimParams, JobFinishParams, JobProgressParams, JobReleaseParams,
    JobRetryParams, LEASE_LOST_MESSAGE, Lease, LeaseExtendParams, LeaseState, Leases,
};
pub use pauses::{MAX_PAUSE_REASON_BYTES, PauseParams, Pauses, PluginPause, ResumeParams};
pub use plans::{PlanInsertParams, PlanListParams, Plans};
pub use plugins::{
    PluginCodePutParams, PluginGrantsParams, PluginNameParams, PluginPolicyParams, PluginPutParams, Plugins,
};
pub use principals::{FoundToken, Principals};
pub use rate_limits::{RateLimitRemoveParams, RateLimits, RateReserveParams};
pub use rules::audit::{ChainBreak, ChainCheck, verify_chain};
pub use schedules::{ScheduleFireParams, ScheduleFired, SchedulePauseParams, Schedules};
pub use sessions::Sessions;
pub use standing::{RuleListParams, RuleRevokeParams, StandingRules};
pub use sweeps::{
    JobsDeleteParams, JobsExpireParams, LeaseReclaimParams, PlansAdvanceParams, ReclaimReport, Sweeps, WorkerDiedParams,
};
pub use workers::{Workers, WorkersSnapshot};

/// The durable job store: every role at once. See the module docs for the
/// rules every implementation keeps. A store implements each role;
/// `JobStore` comes with them. Code that needs one role takes that role
/// (`Arc<dyn Leases>` for the lease keeper, `Arc<dyn Sweeps>` for the
/// sweeper). A call through `dyn JobStore` needs no import; a call on a
/// concrete store (`SqliteStore`) needs its role trait in scope.
pub trait JobStore:
    Jobs
    + Leases
    + Effects
    + Sweeps
    + Plugins
    + Plans
    + Workers
    + Events
    + Sessions
    + Principals
    + Audit
    + StandingRules
    + Pauses
    + Schedules
    + RateLimits
{
}

impl<
    T: Jobs
        + Leases
        + Effects
        + Sweeps
        + Plugins
        + Plans
        + Workers
        + Events
        + Sessions
        + Principals
        + Audit
        + StandingRules
        + Pauses
        + Schedules
        + RateLimits
        + ?Sized,
> JobStore for T
{
}
