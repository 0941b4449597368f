//! The PostgreSQL store's [`Effects`]: the effect ledger,
//! fenced by the lease token.

use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::rows::db_err;
use crate::job::{Effect, JobId};
use crate::store::rules::codec::{EffectRow, outcome_columns};
use crate::store::sql::EFFECT_COLUMNS;
use crate::store::{EffectBeginParams, EffectEndParams, Effects, StoreError};

#[async_trait::async_trait]
impl Effects for PostgresStore {
    async fn effect_begin(&self, params: EffectBeginParams) -> Result<Option<Effect>, StoreError> {
        let operation = "recording an effect";
        let err = db_err(operation);
        let id = params.id.to_string();
        let client = self.client(operation).await?;
        let stmt = client
            .prepare_cached(
                "INSERT INTO effects (job_id, attempt, seq, method, url, started_at, proposal) \
                 SELECT j.job_id, j.attempt, 1 + COALESCE((SELECT MAX(e.seq) FROM effects e \
                   WHERE e.job_id = j.job_id AND e.attempt = j.attempt), 0), $3, $4, $5, $6 \
                 FROM jobs j WHERE j.job_id = $1 AND j.lease_token = $2 \
                 AND ($6::int4 IS NULL OR NOT EXISTS (SELECT 1 FROM effects x WHERE x.job_id = j.job_id \
                   AND x.proposal = $6 AND x.proposal IS NOT NULL AND x.status IS NOT NULL)) \
                 FOR SHARE OF j RETURNING attempt, seq",
            )
            .await
            .map_err(&err)?;
        let mut tries = 0;
        let rows = loop {
            let proposal = params.proposal.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
            let args: [&(dyn ToSql + Sync); 6] =
                [&id, &params.token, &params.method, &params.url, &params.now.unix_ms(), &proposal];
            match client.query(&stmt, &args).await {
                // Two effects of one attempt begun at once picked the same
                // place; the primary key refused this one: number it again.
                Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) && tries < 10 => tries += 1,
                other => break other.map_err(&err)?,
            }
        };
        let row = rows.first().map(|r| (i64::from(r.get::<_, i32>(0)), i64::from(r.get::<_, i32>(1))));
        Ok(row.map(|(attempt, seq)| EffectRow::intent(params, attempt, seq)))
    }

    async fn effect_end(&self, params: EffectEndParams) -> Result<(), StoreError> {
        let (status, error) = outcome_columns(&params.outcome);
        self.execute(
            "recording an effect's outcome",
            "UPDATE effects SET finished_at = $4, status = $5, error = $6 \
             WHERE job_id = $1 AND attempt = $2 AND seq = $3 AND finished_at IS NULL",
            &[
                &params.id.to_string(),
                &i32::try_from(params.attempt).unwrap_or(i32::MAX),
                &i32::try_from(params.seq).unwrap_or(i32::MAX),
                &params.now.unix_ms(),
                &status,
                &error,
            ],
        )
        .await?;
        Ok(())
    }

    async fn effects(&self, id: JobId) -> Result<Vec<Effect>, StoreError> {
        let rows = self
            .read(
                "reading effects",
                &format!("SELECT {EFFECT_COLUMNS} FROM effects WHERE job_id = $1 ORDER BY attempt, seq"),
                &[&id.to_string()],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                EffectRow {
                    attempt: i64::from(r.get::<_, i32>(0)),
                    seq: i64::from(r.get::<_, i32>(1)),
                    method: r.get(2),
                    url: r.get(3),
                    started_at: r.get(4),
                    finished_at: r.get(5),
                    status: r.get::<_, Option<i32>>(6).map(i64::from),
                    error: r.get(7),
                    proposal: r.get::<_, Option<i32>>(8).map(i64::from),
                }
                .into_effect(id)
            })
            .collect())
    }
}
