//! Proposed effects: the outbound writes a plan's execute phase proposes
//! instead of making them, which a person approves and its apply phase
//! may then send, each once, exactly as proposed. The approval holds a
//! binding digest over everything that decides what apply will do.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{Digest, Effect, Grants};

/// Most effects one execute phase may propose.
pub const MAX_PROPOSALS: usize = 10_000;
/// Largest body one proposal may carry, in bytes (and never more than
/// the grant lets one request send).
pub const MAX_PROPOSAL_BODY_BYTES: usize = 1 << 20;
/// Most bytes (URLs, headers and bodies) one execute phase may propose.
pub const MAX_PROPOSED_BYTES: usize = 16 << 20;
/// Most headers one proposal may carry.
pub const MAX_PROPOSAL_HEADERS: usize = 64;
/// Longest URL a proposal may name, in bytes.
pub const MAX_PROPOSAL_URL_BYTES: usize = 8 << 10;

/// One proposed effect, as recorded with the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Its number among the phase's proposals, from 1.
    pub n: u32,
    /// The method (one the grant does not mark safe).
    pub method: String,
    /// The whole URL, query included (never credentials).
    pub url: String,
    /// Headers in order; a secret stands as `{secret:NAME}`, never as its
    /// value.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Proposal {
    /// The digest of its body.
    pub fn body_digest(&self) -> Digest {
        Digest::of(&self.body)
    }

    /// What it counts toward [`MAX_PROPOSED_BYTES`].
    pub fn size(&self) -> usize {
        self.url.len() + self.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() + self.body.len()
    }

    /// `METHOD url`, as logs and reports show it.
    pub fn shown(&self) -> String {
        format!("#{} {} {}", self.n, self.method, self.url)
    }
}

/// Headers as a sorted list of (lowercase name, value).
fn normalized(headers: &[(String, String)]) -> Vec<(String, &str)> {
    let mut out: Vec<(String, &str)> = headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.as_str())).collect();
    out.sort();
    out
}

/// Two header lists carry the same headers.
pub fn same_headers(a: &[(String, String)], b: &[(String, String)]) -> bool {
    normalized(a) == normalized(b)
}

/// The binding digest an approval of a plan's apply phase holds: over the
/// plugin that will run, the grants it runs with, the execute output it
/// gets and the ordered proposals it may send. Any change to one of them
/// changes it. `sha256:` and 64 hex digits.
pub fn binding_digest(plugin: &Digest, grants: &Grants, output: &[u8], proposals: &[Proposal]) -> String {
    let mut hash = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    part(b"leash plan binding 1");
    part(plugin.hex().as_bytes());
    part(&serde_json::to_vec(grants).expect("grants serialize"));
    part(Digest::of(output).hex().as_bytes());
    part(&(proposals.len() as u64).to_be_bytes());
    for p in proposals {
        part(&p.n.to_be_bytes());
        part(p.method.as_bytes());
        part(p.url.as_bytes());
        part(&(p.headers.len() as u64).to_be_bytes());
        for (k, v) in &p.headers {
            part(k.as_bytes());
            part(v.as_bytes());
        }
        part(p.body_digest().hex().as_bytes());
    }
    format!("sha256:{}", hex::encode(hash.finalize()))
}

/// Where a proposal stands once the apply phase has run (or not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProposalState {
    /// Not sent (yet).
    NotSent,
    /// Its request left and the attempt ended before it knew how it went:
    /// sent again, with the same `Idempotency-Key`, if apply runs again.
    InDoubt,
    /// Sent and answered: never sent again.
    Sent,
}

/// A proposal as an approver sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProposalView {
    /// Its number, from 1.
    pub n: u32,
    /// The method.
    pub method: String,
    /// The whole URL.
    pub url: String,
    /// Headers in order, each a `[name, value]` pair (`{secret:NAME}`
    /// where a secret goes).
    #[schema(value_type = Vec<Vec<String>>)]
    pub headers: Vec<(String, String)>,
    /// The body's size in bytes.
    pub body_bytes: u64,
    /// The body's SHA-256 (`sha256:…`): what apply's request must match.
    pub body_sha256: String,
    /// The body, when it is UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_text: Option<String>,
    /// The body, base64, when it is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    /// Sent, in doubt, or not sent.
    pub state: ProposalState,
    /// The response status, once sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The `Idempotency-Key` its request carries.
    pub idempotency_key: String,
}

impl ProposalView {
    /// `proposal`, as the apply job `apply` (if created) has dealt with it.
    pub fn new(proposal: &Proposal, apply: Option<super::JobId>, effects: &[Effect]) -> ProposalView {
        let tried: Vec<&Effect> = effects.iter().filter(|e| e.proposal == Some(proposal.n)).collect();
        let answered = tried.iter().find_map(|e| e.status);
        let state = match (answered, tried.iter().any(|e| e.finished_at.is_none())) {
            (Some(_), _) => ProposalState::Sent,
            (None, true) => ProposalState::InDoubt,
            (None, false) => ProposalState::NotSent,
        };
        let (body_text, body_base64) = match std::str::from_utf8(&proposal.body) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (None, Some(base64::engine::general_purpose::STANDARD.encode(&proposal.body))),
        };
        ProposalView {
            n: proposal.n,
            method: proposal.method.clone(),
            url: proposal.url.clone(),
            headers: proposal.headers.clone(),
            body_bytes: proposal.body.len() as u64,
            body_sha256: proposal.body_digest().to_string(),
            body_text,
            body_base64,
            state,
            status: answered,
            idempotency_key: apply.map(|id| Effect::proposal_key(id, proposal.n)).unwrap_or_default(),
        }
    }
}

/// A plan's proposed effects, as its page shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanEffects {
    /// The digest an approval of the apply phase binds: over the plugin,
    /// the grants, the execute output and these proposals. Send it with
    /// the approval to approve exactly this.
    pub binding_digest: String,
    /// The proposals in order, each with where it stands.
    pub proposals: Vec<ProposalView>,
    /// Proposals sent and answered.
    pub sent: u32,
    /// Proposals whose request left but whose answer was lost.
    pub in_doubt: u32,
    /// Proposals not sent.
    pub not_sent: u32,
    /// The apply phase's effectful requests refused as not proposed (from
    /// its last run's report; 0 before it ran).
    pub refused: u32,
}

impl PlanEffects {
    /// `proposals`, bound by `binding_digest`, as apply job `apply` (with
    /// its `effects`, and the `refused` count its last report gave) left them.
    pub fn new(
        binding_digest: String,
        proposals: &[Proposal],
        apply: Option<super::JobId>,
        effects: &[Effect],
        refused: u32,
    ) -> PlanEffects {
        let proposals: Vec<ProposalView> = proposals.iter().map(|p| ProposalView::new(p, apply, effects)).collect();
        let count = |state| proposals.iter().filter(|p| p.state == state).count() as u32;
        PlanEffects {
            binding_digest,
            sent: count(ProposalState::Sent),
            in_doubt: count(ProposalState::InDoubt),
            not_sent: count(ProposalState::NotSent),
            refused,
            proposals,
        }
    }
}

impl ProposalView {
    /// The proposal it shows, its body read back (`None`: neither text
    /// nor valid base64, or a body that does not match its digest).
    pub fn proposal(&self) -> Option<Proposal> {
        let body = match (&self.body_text, &self.body_base64) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).ok()?,
            (None, None) => Vec::new(),
        };
        let proposal = Proposal {
            n: self.n,
            method: self.method.clone(),
            url: self.url.clone(),
            headers: self.headers.clone(),
            body,
        };
        (self.body_sha256.is_empty() || proposal.body_digest().to_string() == self.body_sha256).then_some(proposal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(n: u32, body: &str) -> Proposal {
        Proposal {
            n,
            method: "PUT".into(),
            url: "http://store/records/a".into(),
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn the_binding_digest_changes_with_anything_that_decides_what_apply_does() {
        let plugin = Digest::of(b"plugin");
        let grants = Grants::default();
        let base = binding_digest(&plugin, &grants, b"out", &[put(1, "one")]);
        assert!(base.starts_with("sha256:") && base.len() == 71, "{base}");
        assert_eq!(base, binding_digest(&plugin, &grants, b"out", &[put(1, "one")]), "stable");
        assert_ne!(base, binding_digest(&Digest::of(b"other"), &grants, b"out", &[put(1, "one")]));
        assert_ne!(base, binding_digest(&plugin, &grants, b"out2", &[put(1, "one")]));
        assert_ne!(base, binding_digest(&plugin, &grants, b"out", &[put(1, "two")]));
        assert_ne!(base, binding_digest(&plugin, &grants, b"out", &[put(1, "one"), put(2, "two")]));
        let mut wider = grants.clone();
        wider.config.insert("k".into(), "v".into());
        assert_ne!(base, binding_digest(&plugin, &wider, b"out", &[put(1, "one")]));
    }
}
