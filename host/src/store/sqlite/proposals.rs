//! The SQLite store's proposed effects: written with a plan's execute
//! job's success, read by the plan's page and its apply phase.

use rusqlite::{Connection, params};

use super::rows::db_err;
use crate::job::{JobId, Proposal};
use crate::store::StoreError;
use crate::store::rules::codec::{corrupt, to_json};

/// The migration that adds them (listed in [`super::migrations::MIGRATIONS`]).
pub(super) const MIGRATION: &str = r#"
-- The effects a plan's execute job proposed, written with its success and
-- deleted with the job; and, on an apply job's effect, the proposal it sent.
CREATE TABLE proposals (
    job_id       TEXT NOT NULL,
    n            INTEGER NOT NULL CHECK (n >= 1),
    method       TEXT NOT NULL,
    url          TEXT NOT NULL,
    headers_json TEXT NOT NULL,
    body         BLOB NOT NULL,
    PRIMARY KEY (job_id, n)
) WITHOUT ROWID;
ALTER TABLE effects ADD COLUMN proposal INTEGER CHECK (proposal >= 1);
CREATE INDEX effects_proposal ON effects (job_id, proposal) WHERE proposal IS NOT NULL;
"#;

/// Record `proposals` as job `id`'s.
pub(super) fn insert(conn: &Connection, id: JobId, proposals: &[Proposal]) -> Result<(), StoreError> {
    let err = db_err("recording proposed effects");
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO proposals (job_id, n, method, url, headers_json, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(&err)?;
    let id = id.to_string();
    for p in proposals {
        stmt.execute(params![id, p.n, p.method, p.url, to_json(&p.headers)?, p.body]).map_err(&err)?;
    }
    Ok(())
}

/// Job `id`'s proposals, by number.
pub(super) fn read(conn: &Connection, id: JobId) -> Result<Vec<Proposal>, StoreError> {
    let err = db_err("reading proposed effects");
    let mut stmt = conn
        .prepare_cached("SELECT n, method, url, headers_json, body FROM proposals WHERE job_id = ?1 ORDER BY n")
        .map_err(&err)?;
    let rows = stmt
        .query_map(params![id.to_string()], |r| {
            Ok((r.get::<_, u32>(0)?, r.get(1)?, r.get(2)?, r.get::<_, String>(3)?, r.get(4)?))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(&err)?;
    rows.into_iter()
        .map(|(n, method, url, headers, body)| {
            let headers = serde_json::from_str(&headers)
                .map_err(|e| corrupt(&id.to_string(), format!("proposal {n}'s headers: {e}")))?;
            Ok(Proposal { n, method, url, headers, body })
        })
        .collect()
}
