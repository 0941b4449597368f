//! The audit chain's arithmetic, shared by both backends: the hash of a
//! row, the next row's place, and the check that walks a chain.

use sha2::{Digest as _, Sha256};

use crate::access::{Principal, TokenRecord};
use crate::clock::Timestamp;
use crate::job::{Job, JobStatus, PluginName};
use crate::store::{
    AuditHead, AuditNote, AuditRecord, CancelResult, PluginGrantsParams, PluginPause, PluginPolicyParams, StoreError,
};

/// The `prev_hash` of the first row.
pub(crate) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// A row's hash: SHA-256 over its fields and the previous row's hash, each
/// prefixed by its length, so no two rows of different fields hash alike.
pub(crate) fn row_hash(
    prev: &str,
    seq: i64,
    at: Timestamp,
    principal: Option<&str>,
    action: &str,
    target: &str,
    detail: &str,
) -> String {
    let mut hasher = Sha256::new();
    let seq = seq.to_string();
    let at = at.unix_ms().to_string();
    let fields = [prev, &seq, &at, principal.unwrap_or("\u{0}"), action, target, detail];
    for field in fields {
        hasher.update((field.len() as u64).to_le_bytes());
        hasher.update(field.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// The rows `notes` append after `head`, at `now`, each chained to the one
/// before, and the head they leave.
pub(crate) fn next_rows(
    head: &AuditHead,
    notes: &[AuditNote],
    now: Timestamp,
) -> Result<(Vec<AuditRecord>, AuditHead), StoreError> {
    let mut head = head.clone();
    let mut rows = Vec::with_capacity(notes.len());
    for note in notes {
        let row = next_row(&head, note, now)?;
        head = AuditHead::new(row.seq, row.hash.clone());
        rows.push(row);
    }
    Ok((rows, head))
}

/// The row `note` appends after `head`, at `now`.
pub(crate) fn next_row(head: &AuditHead, note: &AuditNote, now: Timestamp) -> Result<AuditRecord, StoreError> {
    let detail = serde_json::to_string(&note.detail).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let seq = head.seq + 1;
    let hash = row_hash(&head.hash, seq, now, note.principal.as_deref(), note.action, &note.target, &detail);
    Ok(AuditRecord {
        seq,
        at: now,
        principal: note.principal.clone(),
        action: note.action.to_owned(),
        target: note.target.clone(),
        detail,
        prev_hash: head.hash.clone(),
        hash,
    })
}

/// The trail's row for a job a principal submitted (`None`: an embedder's
/// own submit, which is not audited).
pub(crate) fn submit_note(job: &Job) -> Option<AuditNote> {
    let principal = job.submitted_by.clone()?;
    let detail = serde_json::json!({
        "plugin": job.plugin,
        "plugin_name": job.plugin_name,
        "target": job.target,
        "plan_id": job.plan_id,
        "status": job.status,
    });
    Some(AuditNote { principal: Some(principal), action: "job.submit", target: job.id.to_string(), detail })
}

/// The trail's row for a cancel `actor` made of job `id`, which was in
/// `was`: only a cancel that changed something, by a principal.
pub(crate) fn cancel_note(actor: Option<String>, id: &str, was: JobStatus, result: &CancelResult) -> Option<AuditNote> {
    let outcome = match result {
        CancelResult::Cancelled => "cancelled",
        CancelResult::Requested => "requested",
        CancelResult::NotFound | CancelResult::AlreadyTerminal(_) => return None,
    };
    let detail = serde_json::json!({ "was": was, "cancel": outcome });
    Some(AuditNote { principal: Some(actor?), action: "job.cancel", target: id.to_owned(), detail })
}

/// The trail's row for a retry `actor` made of job `id`, which was in
/// `was`.
pub(crate) fn redrive_note(actor: Option<String>, id: &str, was: JobStatus) -> Option<AuditNote> {
    let detail = serde_json::json!({ "was": was });
    Some(AuditNote { principal: Some(actor?), action: "job.retry", target: id.to_owned(), detail })
}

/// A plugin name paused (with the reason given) or resumed by `actor`;
/// an embedder's own call (no actor) is not audited.
pub(crate) fn pause_note(actor: Option<String>, name: &str, pause: Option<&PluginPause>) -> Option<AuditNote> {
    let (action, detail) = match pause {
        Some(p) => ("plugin.pause", serde_json::json!({ "reason": p.reason })),
        None => ("plugin.resume", serde_json::json!({})),
    };
    Some(AuditNote { principal: Some(actor?), action, target: name.to_owned(), detail })
}

/// A stored JSON column as a value for a `before`/`after` detail (`null`
/// when empty or unreadable).
pub(crate) fn column_value(text: Option<&str>) -> serde_json::Value {
    text.and_then(|t| serde_json::from_str(t).ok()).unwrap_or(serde_json::Value::Null)
}

/// A new value for one JSON column of a plugin registration (its grants
/// or its approval policy), and who sets it.
pub(crate) struct RegistrationChange {
    pub(crate) name: PluginName,
    /// `grants_json` or `approval_json`.
    pub(crate) column: &'static str,
    pub(crate) value: Option<String>,
    pub(crate) actor: Option<String>,
    /// `plugin.grants` or `plugin.policy`.
    pub(crate) action: &'static str,
    pub(crate) now: Timestamp,
}

impl RegistrationChange {
    /// New grants, as `plugin_grants_set` writes them.
    pub(crate) fn grants(params: &PluginGrantsParams) -> Result<Self, StoreError> {
        Ok(RegistrationChange {
            name: params.name.clone(),
            column: "grants_json",
            value: super::codec::grants_to_column(&params.grants)?,
            actor: params.actor.clone(),
            action: "plugin.grants",
            now: params.now,
        })
    }

    /// A new approval policy, as `plugin_policy_set` writes it.
    pub(crate) fn policy(params: &PluginPolicyParams) -> Result<Self, StoreError> {
        Ok(RegistrationChange {
            name: params.name.clone(),
            column: "approval_json",
            value: super::codec::policy_to_column(&params.policy)?,
            actor: params.actor.clone(),
            action: "plugin.policy",
            now: params.now,
        })
    }

    /// The trail's row for it, given what the column held `before`.
    pub(crate) fn note(&self, before: Option<&str>) -> AuditNote {
        let detail =
            serde_json::json!({ "before": column_value(before), "after": column_value(self.value.as_deref()) });
        note(self.actor.clone(), self.action, self.name.to_string(), detail)
    }
}

/// A note for a change `actor` made (`None`: the embedding code).
pub(crate) fn note(
    actor: Option<String>,
    action: &'static str,
    target: impl Into<String>,
    detail: serde_json::Value,
) -> AuditNote {
    AuditNote { principal: actor, action, target: target.into(), detail }
}

/// The detail of a principal put: its roles before (`None`: it is new),
/// and its roles and ceilings now.
pub(crate) fn principal_put_detail(before: Option<&str>, now: &Principal) -> serde_json::Value {
    let roles: Vec<&str> = now.roles.iter().map(|r| r.as_str()).collect();
    serde_json::json!({ "before": before, "after": roles.join(","), "ceilings": now.ceilings })
}

/// The trail's row for a token created: whose, what for, until when
/// (never its secret or hash).
pub(crate) fn token_created(actor: Option<String>, record: &TokenRecord) -> AuditNote {
    let detail = serde_json::json!({
        "principal": record.principal,
        "label": record.label,
        "expires_at": record.expires_at,
    });
    note(actor, "token.create", record.id.clone(), detail)
}

/// Where a chain breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    /// The first row (sequence number) that does not hold.
    pub seq: i64,
    /// Why, for people.
    pub why: String,
}

/// Walks a chain row by row, in sequence order.
#[derive(Debug)]
pub struct ChainCheck {
    last: AuditHead,
}

impl Default for ChainCheck {
    fn default() -> Self {
        ChainCheck { last: AuditHead::new(0, GENESIS.to_owned()) }
    }
}

impl ChainCheck {
    /// A walk from where `head` says the kept rows start: after the last
    /// row audit retention deleted, or from the start.
    pub fn from_head(head: &AuditHead) -> ChainCheck {
        match &head.pruned_hash {
            Some(hash) if head.pruned_seq > 0 => ChainCheck { last: AuditHead::new(head.pruned_seq, hash.clone()) },
            _ => ChainCheck::default(),
        }
    }

    /// The next row: it must follow the last without a gap, name its hash,
    /// and hash to what it says.
    pub fn push(&mut self, row: &AuditRecord) -> Result<(), ChainBreak> {
        let at = row.seq;
        if row.seq != self.last.seq + 1 {
            return Err(ChainBreak {
                seq: self.last.seq + 1,
                why: format!("row {} is missing: the row after {} is {}", self.last.seq + 1, self.last.seq, row.seq),
            });
        }
        if row.prev_hash != self.last.hash {
            return Err(ChainBreak {
                seq: at,
                why: format!("row {at} does not follow row {}: its prev_hash is not that row's hash", self.last.seq),
            });
        }
        let hash =
            row_hash(&row.prev_hash, row.seq, row.at, row.principal.as_deref(), &row.action, &row.target, &row.detail);
        if hash != row.hash {
            return Err(ChainBreak {
                seq: at,
                why: format!("row {at}'s contents do not hash to its hash: it was changed after it was written"),
            });
        }
        self.last = AuditHead::new(row.seq, row.hash.clone());
        Ok(())
    }

    /// The chain ended: its last row must be the head the store kept.
    pub fn finish(self, head: &AuditHead) -> Result<AuditHead, ChainBreak> {
        if (self.last.seq, &self.last.hash) != (head.seq, &head.hash) {
            return Err(ChainBreak {
                seq: self.last.seq + 1,
                why: format!(
                    "the chain ends at row {}, but its head names row {} ({}): rows were removed from its end, \
                     or the head was changed",
                    self.last.seq, head.seq, head.hash
                ),
            });
        }
        Ok(head.clone())
    }
}

/// Walk the chain up to `head` (read first: rows appended while the walk
/// runs are past it), a page at a time from `page(after)`, which answers
/// the rows after a sequence number, oldest first. The outer error is
/// `page`'s; the inner answer is the verdict.
pub async fn verify_chain<E, F: Future<Output = Result<Vec<AuditRecord>, E>>>(
    head: &AuditHead,
    mut page: impl FnMut(i64) -> F,
) -> Result<Result<AuditHead, ChainBreak>, E> {
    let mut check = ChainCheck::from_head(head);
    let mut after = head.pruned_seq;
    while after < head.seq {
        let rows = page(after).await?;
        let Some(last) = rows.last().map(|r| r.seq) else { break };
        for row in rows.iter().take_while(|r| r.seq <= head.seq) {
            if let Err(broken) = check.push(row) {
                return Ok(Err(broken));
            }
        }
        after = last;
    }
    Ok(check.finish(head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chain(n: usize) -> Vec<AuditRecord> {
        let mut head = AuditHead::new(0, GENESIS.to_owned());
        let mut rows = Vec::new();
        for i in 0..n {
            let note = AuditNote {
                principal: Some("alice".into()),
                action: "job.approve",
                target: format!("job-{i}"),
                detail: json!({ "n": i }),
            };
            let row = next_row(&head, &note, Timestamp::from_unix_ms(1_000 + i as i64)).unwrap();
            head = AuditHead::new(row.seq, row.hash.clone());
            rows.push(row);
        }
        rows
    }

    fn check(rows: &[AuditRecord], head: &AuditHead) -> Result<AuditHead, ChainBreak> {
        let mut check = ChainCheck::default();
        for row in rows {
            check.push(row)?;
        }
        check.finish(head)
    }

    #[test]
    fn a_chain_verifies_and_every_kind_of_tampering_breaks_it_where_it_was_made() {
        let rows = chain(5);
        let head = AuditHead::new(5, rows[4].hash.clone());
        assert_eq!(check(&rows, &head).unwrap(), head);
        assert!(check(&[], &AuditHead::new(0, GENESIS.into())).is_ok(), "an empty trail");

        let mut edited = rows.clone();
        edited[2].detail = r#"{"n":99}"#.into();
        assert_eq!(check(&edited, &head).unwrap_err().seq, 3);
        let mut renamed = rows.clone();
        renamed[1].principal = Some("mallory".into());
        assert_eq!(check(&renamed, &head).unwrap_err().seq, 2);
        let mut removed = rows.clone();
        removed.remove(3);
        assert_eq!(check(&removed, &head).unwrap_err().seq, 4);
        let cut = &rows[..4];
        let err = check(cut, &head).unwrap_err();
        assert!(err.why.contains("removed from its end"), "{err:?}");
        // A row rewritten with a fresh hash still breaks the next one's link.
        let mut rehashed = rows.clone();
        rehashed[1].detail = r#"{"n":42}"#.into();
        let r = &rehashed[1];
        rehashed[1].hash = row_hash(&r.prev_hash, r.seq, r.at, r.principal.as_deref(), &r.action, &r.target, &r.detail);
        assert_eq!(check(&rehashed, &head).unwrap_err().seq, 3);
    }
}
