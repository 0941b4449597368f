//! The PostgreSQL store's proposed effects: written with a plan's execute
//! job's success, read by the plan's page and its apply phase.

use deadpool_postgres::GenericClient;

use super::PostgresStore;
use super::rows::db_err;
use crate::job::{JobId, Proposal};
use crate::store::StoreError;
use crate::store::rules::codec::{corrupt, to_json};

/// The migration that adds them (listed in [`super::schema::MIGRATIONS`]).
pub(super) const MIGRATION: &str = r#"
-- The effects a plan's execute job proposed, written with its success and
-- deleted with the job; and, on an apply job's effect, the proposal it sent.
CREATE TABLE proposals (
    job_id       TEXT COLLATE "C" NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    n            INTEGER NOT NULL CHECK (n >= 1),
    method       TEXT NOT NULL,
    url          TEXT NOT NULL,
    headers_json TEXT NOT NULL,
    body         BYTEA NOT NULL,
    PRIMARY KEY (job_id, n)
);
ALTER TABLE effects ADD COLUMN proposal INTEGER CHECK (proposal >= 1);
CREATE INDEX effects_proposal ON effects (job_id, proposal) WHERE proposal IS NOT NULL;
"#;

/// Record `proposals` as job `id`'s: one statement, whatever their number.
pub(super) async fn insert(client: &impl GenericClient, id: JobId, proposals: &[Proposal]) -> Result<(), StoreError> {
    let err = db_err("recording proposed effects");
    let mut numbers = Vec::with_capacity(proposals.len());
    let (mut methods, mut urls, mut headers, mut bodies) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for p in proposals {
        numbers.push(i32::try_from(p.n).unwrap_or(i32::MAX));
        methods.push(p.method.as_str());
        urls.push(p.url.as_str());
        headers.push(to_json(&p.headers)?);
        bodies.push(p.body.as_slice());
    }
    let stmt = client
        .prepare_cached(
            "INSERT INTO proposals (job_id, n, method, url, headers_json, body) \
             SELECT $1, * FROM UNNEST($2::int4[], $3::text[], $4::text[], $5::text[], $6::bytea[])",
        )
        .await
        .map_err(&err)?;
    client.execute(&stmt, &[&id.to_string(), &numbers, &methods, &urls, &headers, &bodies]).await.map_err(&err)?;
    Ok(())
}

impl PostgresStore {
    /// Job `id`'s proposals, by number.
    pub(super) async fn proposals_of(&self, id: JobId) -> Result<Vec<Proposal>, StoreError> {
        let rows = self
            .read(
                "reading proposed effects",
                "SELECT n, method, url, headers_json, body FROM proposals WHERE job_id = $1 ORDER BY n",
                &[&id.to_string()],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let n = u32::try_from(r.get::<_, i32>(0)).unwrap_or(0);
                let headers = serde_json::from_str(r.get::<_, &str>(3))
                    .map_err(|e| corrupt(&id.to_string(), format!("proposal {n}'s headers: {e}")))?;
                Ok(Proposal { n, method: r.get(1), url: r.get(2), headers, body: r.get(4) })
            })
            .collect()
    }
}
