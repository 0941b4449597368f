//! The SQLite store's [`Effects`]: the effect ledger,
//! fenced by the lease token.

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::rows::db_err;
use crate::job::{Effect, JobId};
use crate::store::rules::codec::{EffectRow, outcome_columns};
use crate::store::sql::EFFECT_COLUMNS;
use crate::store::{EffectBeginParams, EffectEndParams, Effects, StoreError};

#[async_trait::async_trait]
impl Effects for SqliteStore {
    async fn effect_begin(&self, params: EffectBeginParams) -> Result<Option<Effect>, StoreError> {
        let id = params.id;
        self.write(move |conn| {
            let row = conn
                .prepare_cached(
                    "INSERT INTO effects (job_id, attempt, seq, method, url, started_at, proposal) \
                     SELECT j.job_id, j.attempt, 1 + COALESCE((SELECT MAX(e.seq) FROM effects e \
                       WHERE e.job_id = j.job_id AND e.attempt = j.attempt), 0), ?3, ?4, ?5, ?6 \
                     FROM jobs j WHERE j.job_id = ?1 AND j.status = 'running' AND j.lease_token = ?2 \
                     AND (?6 IS NULL OR NOT EXISTS (SELECT 1 FROM effects x WHERE x.job_id = j.job_id \
                       AND x.proposal = ?6 AND x.proposal IS NOT NULL AND x.status IS NOT NULL)) \
                     RETURNING attempt, seq",
                )
                .and_then(|mut s| {
                    s.query_row(
                        params![
                            id.to_string(),
                            params.token,
                            params.method,
                            params.url,
                            params.now.unix_ms(),
                            params.proposal
                        ],
                        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
                    )
                    .optional()
                })
                .map_err(db_err("recording an effect"))?;
            Ok(row.map(|(attempt, seq)| EffectRow::intent(params, attempt, seq)))
        })
        .await
    }

    async fn effect_end(&self, params: EffectEndParams) -> Result<(), StoreError> {
        self.write(move |conn| {
            let (status, error) = outcome_columns(&params.outcome);
            conn.prepare_cached(
                "UPDATE effects SET finished_at = ?4, status = ?5, error = ?6 \
                 WHERE job_id = ?1 AND attempt = ?2 AND seq = ?3 AND finished_at IS NULL",
            )
            .and_then(|mut s| {
                s.execute(params![
                    params.id.to_string(),
                    params.attempt,
                    params.seq,
                    params.now.unix_ms(),
                    status,
                    error
                ])
            })
            .map_err(db_err("recording an effect's outcome"))?;
            Ok(())
        })
        .await
    }

    async fn effects(&self, id: JobId) -> Result<Vec<Effect>, StoreError> {
        self.read(move |conn| {
            let err = db_err("reading effects");
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {EFFECT_COLUMNS} FROM effects WHERE job_id = ?1 ORDER BY attempt, seq"
                ))
                .map_err(&err)?;
            let rows = stmt
                .query_map(params![id.to_string()], |r| {
                    Ok(EffectRow {
                        attempt: r.get(0)?,
                        seq: r.get(1)?,
                        method: r.get(2)?,
                        url: r.get(3)?,
                        started_at: r.get(4)?,
                        finished_at: r.get(5)?,
                        status: r.get(6)?,
                        error: r.get(7)?,
                        proposal: r.get(8)?,
                    })
                })
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(&err)?;
            Ok(rows.into_iter().map(|r| r.into_effect(id)).collect())
        })
        .await
    }
}
