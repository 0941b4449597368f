//! The plan fence around an attempt: a plan's execute phase proposes its
//! effects; its apply phase may send only the approved ones, and only
//! while its plugin's registration still grants them and the plan is as
//! it was approved. Checked before the guest starts, so a refusal sends
//! nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::failure::HostFailure;
use crate::job::proposal::binding_digest;
use crate::job::{ErrorKind, Job, PluginRef, Proposal, Target, Verdict};
use crate::sandbox::http::{AddressVerdicts, ApprovedEffects, EffectFence, SecretStore, check_proposal};
use crate::sandbox::{LogLevel, LogRecord, Outcome};
use crate::store::JobStore;

/// What `job`'s run may do with effects. An apply phase's checks (store
/// reads, host lookups) take at most `within`; past it the job is released
/// to try again, spending no attempt.
pub(super) async fn fence_for(
    store: &dyn JobStore,
    secrets: &SecretStore,
    job: &Job,
    within: Duration,
) -> Result<EffectFence, HostFailure> {
    let Some(plan_id) = &job.plan_id else { return Ok(EffectFence::Open) };
    match job.target {
        Target::Execute => Ok(EffectFence::Propose),
        Target::Apply => match tokio::time::timeout(within, approved(store, secrets, job, plan_id)).await {
            Ok(checked) => checked.map(|e| EffectFence::Approved(Arc::new(e))),
            Err(_) => Err(HostFailure {
                retryable: true,
                ..HostFailure::new(ErrorKind::HostError, "HostError: the approved writes' checks took too long")
            }),
        },
        Target::Action(_) => Ok(EffectFence::Open),
    }
}

fn store_failure(what: &str, e: crate::store::StoreError) -> HostFailure {
    HostFailure {
        retryable: e.is_transient(),
        ..HostFailure::new(ErrorKind::HostError, format!("HostError: cannot read {what}: {e}"))
    }
}

fn denied(message: String) -> HostFailure {
    HostFailure::new(ErrorKind::Denied, format!("Denied: {message}; nothing was sent"))
}

/// An apply job's approved proposals and which are sent, once checked.
async fn approved(
    store: &dyn JobStore,
    secrets: &SecretStore,
    job: &Job,
    plan_id: &str,
) -> Result<ApprovedEffects, HostFailure> {
    let plan = store.plan_get(plan_id.to_owned()).await.map_err(|e| store_failure("the plan", e))?;
    let plan = plan.ok_or_else(|| denied(format!("plan {plan_id} is gone")))?;
    let proposals =
        store.plan_proposals(plan.execute_job).await.map_err(|e| store_failure("the proposed effects", e))?;
    let sent: BTreeSet<u32> = store
        .effects(job.id)
        .await
        .map_err(|e| store_failure("the effect ledger", e))?
        .iter()
        .filter(|e| e.status.is_some())
        .filter_map(|e| e.proposal)
        .collect();
    if let Some(bound) = approved_binding(job) {
        let execute = store.job_get(plan.execute_job).await.map_err(|e| store_failure("the execute job", e))?;
        let output = execute.and_then(|j| j.output).unwrap_or_default();
        let now = binding_digest(&job.plugin, &job.grants, &output, &proposals);
        if now != bound {
            return Err(denied(format!("the plan is not what was approved (approved {bound}, now {now})")));
        }
    }
    still_granted(store, secrets, job, &proposals, &sent).await?;
    Ok(ApprovedEffects::new(proposals, &sent))
}

/// The binding digest the job's approval holds, if a person approved it.
fn approved_binding(job: &Job) -> Option<String> {
    let approval = job.approval.as_ref()?;
    approval.approvals.iter().chain(approval.decision.iter()).rev().find_map(|d| match d.verdict {
        Verdict::Approved => d.binding.clone(),
        Verdict::Rejected => None,
    })
}

/// Every proposal not sent yet is still granted by the job's plugin's
/// registration as it is now — its host rule, the secrets it names, and
/// the addresses its host resolves to — so a grant narrowed since the
/// approval refuses the whole apply before anything is sent.
async fn still_granted(
    store: &dyn JobStore,
    secrets: &SecretStore,
    job: &Job,
    proposals: &[Proposal],
    sent: &BTreeSet<u32>,
) -> Result<(), HostFailure> {
    let Some(name) = &job.plugin_name else { return Ok(()) };
    let info = store
        .plugin_resolve(PluginRef::Version(name.clone()))
        .await
        .map_err(|e| store_failure("the plugin's registration", e))?
        .ok_or_else(|| denied(format!("plugin {name} is no longer registered")))?;
    let mut addresses = AddressVerdicts::default();
    for proposal in proposals.iter().filter(|p| !sent.contains(&p.n)) {
        let mut copy = proposal.clone();
        let refused = match check_proposal(&info.grants.http, secrets, &mut copy) {
            Err(why) => Some(why),
            Ok((host, port)) => addresses.check(&info.grants.http, &host, port).await.err(),
        };
        if let Some(why) = refused {
            return Err(denied(format!(
                "approved proposal {} is no longer granted to {name}: {why}",
                proposal.shown()
            )));
        }
    }
    Ok(())
}

/// The fields of the apply report's log record: approved proposals, those
/// not sent, requests refused as not proposed.
pub const REPORT_FIELDS: [&str; 3] = ["leash.plan.proposals", "leash.plan.not_sent", "leash.plan.refused"];

/// After an apply phase's run: its report goes into the job's log, and a
/// run that succeeded without sending every approved proposal fails (an
/// applied plan made every effect a person approved).
pub(crate) fn settle_apply(outcome: &mut Outcome, effects: &ApprovedEffects) {
    let report = effects.report();
    outcome.logs.push(LogRecord {
        level: LogLevel::Info,
        message: format!("leash: {}", report.line()),
        fields: vec![
            (REPORT_FIELDS[0].to_owned(), report.proposals.to_string()),
            (REPORT_FIELDS[1].to_owned(), report.not_sent.len().to_string()),
            (REPORT_FIELDS[2].to_owned(), report.refused.to_string()),
        ],
        elapsed: outcome.usage.duration,
    });
    if outcome.result.is_ok() && !report.not_sent.is_empty() {
        outcome.result = Err(crate::sandbox::Failure::new(
            ErrorKind::GuestError,
            format!("GuestError: apply returned success without sending every approved proposal ({})", report.line()),
        ));
    }
}
