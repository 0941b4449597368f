//! The commands. `run` runs one component with no store; `worker` and
//! `serve` run a pool until a signal. The operator commands — `submit`,
//! `jobs`, `plugins`, `schedules`, `plan` and `diagnostics` — each speak the HTTP API, to a
//! server (`--server`) or to an in-process router on a local database, so
//! both behave alike. `new` writes a plugin project and touches nothing
//! else.

mod access;
mod audit;
mod connect;
mod dev;
mod diagnostics;
mod jobs;
mod limits;
mod new;
mod plan;
mod plugins;
mod redrive;
mod rules;
mod run;
mod schedules;
mod serve;
mod show;
mod submit;
mod supervise;
mod watch;
mod worker;

pub(super) use access::{PrincipalsCommand, TokensCommand, principals, tokens, whoami};
pub(super) use audit::{AuditCommand, audit};
pub(super) use dev::{DevArgs, dev};
pub(super) use diagnostics::{DiagnosticsArgs, diagnostics};
pub(super) use jobs::{JobsCommand, jobs};
pub(super) use limits::{LimitsCommand, limits};
pub(super) use new::{NewArgs, new_plugin};
pub(super) use plan::{PlanCommand, plan};
pub(super) use plugins::{PluginsCommand, plugins};
pub(super) use rules::{RulesCommand, rules};
pub(super) use run::{RunArgs, run_once};
pub(super) use schedules::{SchedulesCommand, schedules};
pub(super) use serve::{ServeArgs, serve};
pub(super) use submit::{SubmitArgs, submit};
pub(super) use supervise::run_pool_process;
pub(super) use worker::{WorkerCommandArgs, run_worker};

use std::path::PathBuf;

use axum::http::StatusCode;
use clap::Args;

use super::{CliError, ExitStatus, StoreArgs};
use crate::api::requests::{DecisionRequest, PlanDecisionRequest};
use crate::client::ClientError;
use crate::job::PlanPhase;

/// Where a command sends its requests.
#[derive(Debug, Args)]
pub(super) struct ConnArgs {
    /// A `leash serve` to talk to, e.g. http://127.0.0.1:7070. Without it,
    /// commands work on the local database (`--db`). The token comes from
    /// LEASH_API_TOKEN or `--token-file`.
    #[arg(long, env = "LEASH_SERVER", value_name = "URL")]
    server: Option<String>,
    /// The server's token file (default: `<db>.token`, as `leash serve`
    /// writes it).
    #[arg(long, env = "LEASH_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    #[command(flatten)]
    store: StoreArgs,
    /// Print JSON instead of tables and text.
    #[arg(long)]
    json: bool,
}

/// Why a gated job is decided so. The decision is recorded as the
/// principal whose token sends it (`leash whoami` names it).
#[derive(Debug, Args)]
pub(super) struct DecisionArgs {
    /// Why, recorded with the decision.
    #[arg(long)]
    comment: Option<String>,
}

impl DecisionArgs {
    /// The body of an approve or reject request.
    pub(super) fn body(&self) -> DecisionRequest {
        DecisionRequest { by: None, comment: self.comment.clone(), remember: None }
    }

    /// The body of a plan's approve or reject request, for `phase`.
    pub(super) fn plan_body(&self, phase: PlanPhase) -> PlanDecisionRequest {
        PlanDecisionRequest { phase: Some(phase), job_id: None, by: None, comment: self.comment.clone(), digest: None }
    }
}

impl From<ClientError> for CliError {
    fn from(e: ClientError) -> Self {
        let status = match &e {
            ClientError::Api { status, .. } => match *status {
                StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::PAYLOAD_TOO_LARGE => ExitStatus::Usage,
                StatusCode::UNAUTHORIZED
                | StatusCode::FORBIDDEN
                | StatusCode::CONFLICT
                | StatusCode::TOO_MANY_REQUESTS => ExitStatus::Refused,
                _ => ExitStatus::Internal,
            },
            ClientError::Unreachable { .. } => ExitStatus::Unreachable,
            ClientError::Protocol(_) => ExitStatus::Internal,
        };
        CliError { message: e.to_string(), status }
    }
}
