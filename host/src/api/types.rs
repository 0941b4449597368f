//! What the API answers, as types: the server serializes them and the
//! CLI's [`crate::client::Client`] reads them back.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::job::{ApplyMode, Job, JobId, PlanStatus};
use crate::runtime::{Cancelled, PlanView};

pub use super::error::{ErrorBody, ErrorDetail};

/// A job as the API shows it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobView {
    #[serde(flatten)]
    pub job: Job,
    /// Output size of a succeeded job (fetch it from `/output`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<usize>,
}

impl From<Job> for JobView {
    fn from(mut job: Job) -> Self {
        let output_bytes = job.output.take().map(|o| o.len());
        JobView { job, output_bytes }
    }
}

/// A finished job with its output: parsed JSON when it is JSON (else
/// `null`), and always base64, so binary outputs round-trip intact. The
/// sync answer of `POST /v1/jobs`, and what `leash … --wait --json` prints.
pub fn finished_json(job: impl Serialize, output: Option<&[u8]>) -> Value {
    serde_json::to_value(Finished::new(job, output)).unwrap_or(Value::Null)
}

/// A finished job and its output (see [`finished_json`]).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Finished<J> {
    /// The job.
    pub job: J,
    /// The output parsed as JSON, or `null` when it is not JSON.
    pub output: Option<Value>,
    /// The output bytes, base64 (`null` unless the job succeeded).
    pub output_base64: Option<String>,
}

impl<J> Finished<J> {
    pub fn new(job: J, output: Option<&[u8]>) -> Self {
        Finished {
            job,
            output: output.and_then(|o| serde_json::from_slice::<Value>(o).ok()),
            output_base64: output.map(|o| base64::engine::general_purpose::STANDARD.encode(o)),
        }
    }
}

/// `202` to an async submit: the job is queued, or waits for approval.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Accepted {
    /// `accepted` (queued) or `pending_approval`.
    #[schema(example = "accepted")]
    pub status: String,
    pub job_id: JobId,
}

/// `GET /v1/jobs/{id}/effects`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EffectList {
    /// By attempt, then place.
    pub effects: Vec<crate::job::Effect>,
}

/// `GET /v1/plugins`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginList {
    pub plugins: Vec<crate::job::PluginInfo>,
}

/// `GET /v1/jobs`: a page, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    /// Pass as `before` for the next page; `null` when the page is not full.
    pub next_before: Option<JobId>,
}

/// What a cancel did.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CancelAnswer {
    pub job_id: JobId,
    /// `cancelled` (it was queued) or `cancel_requested` (it runs).
    pub status: Cancelled,
}

/// `GET /v1/health`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HealthReport {
    pub health: crate::runtime::Health,
    pub ceilings: crate::runtime::Ceilings,
}

/// A plan as the API shows it: its derived status and both phases, each
/// with its output.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanAnswer {
    /// The plan id (a ULID): its jobs' `plan_id` and concurrency key.
    pub plan_id: String,
    /// Derived from its phases.
    pub status: PlanStatus,
    /// How its apply phase starts.
    pub apply_mode: ApplyMode,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was cancelled, if it was.
    pub cancelled_at: Option<Timestamp>,
    /// Who approved the apply phase, once someone did.
    pub approved_by: Option<String>,
    /// The execute phase and its output: the change to approve.
    pub execute: Finished<JobView>,
    /// The apply phase and its output, once created.
    pub apply: Option<Finished<JobView>>,
    /// The binding digest the apply phase's approval holds, once someone
    /// approved it (compare `effects.binding_digest`).
    pub approved_digest: Option<String>,
    /// The effects execute proposed, with where each stands and the
    /// binding digest to approve them by: shown by `GET /v1/plans/{id}`
    /// once execute has succeeded (absent in lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects: Option<crate::job::proposal::PlanEffects>,
}

impl From<PlanView> for PlanAnswer {
    fn from(view: PlanView) -> Self {
        let phase = |mut job: Job| {
            let output = job.output.take();
            Finished::new(JobView::from(job), output.as_deref())
        };
        let approved = view
            .apply
            .as_ref()
            .and_then(|a| a.approval.as_ref())
            .and_then(|a| a.decision.as_ref())
            .filter(|d| d.verdict == crate::job::Verdict::Approved);
        let approved_by = approved.map(|d| d.by.clone());
        let approved_digest = approved.and_then(|d| d.binding.clone());
        PlanAnswer {
            plan_id: view.plan.plan_id,
            status: view.status,
            apply_mode: view.plan.apply_mode,
            created_at: view.plan.created_at,
            cancelled_at: view.plan.cancelled_at,
            approved_by,
            execute: phase(view.execute),
            apply: view.apply.map(phase),
            approved_digest,
            effects: view.effects,
        }
    }
}

/// `GET /v1/plans`: a page, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanPage {
    pub plans: Vec<PlanAnswer>,
    /// Pass as `before` for the next page; `null` when the page is not full.
    pub next_before: Option<String>,
}

/// A job's attempts (`GET /v1/jobs/{id}/attempts`).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AttemptList {
    /// Oldest first.
    pub attempts: Vec<crate::job::Attempt>,
}

/// Bytes as they are: an `application/octet-stream` body (a component, a
/// job's input or output), which client generators read as a file.
#[derive(Debug)]
pub struct OctetStream;

impl utoipa::PartialSchema for OctetStream {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::KnownFormat;
        use utoipa::openapi::schema::{ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("Bytes as they are."))
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .into()
    }
}
impl utoipa::ToSchema for OctetStream {}
