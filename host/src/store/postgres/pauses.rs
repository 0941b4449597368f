//! The PostgreSQL store's [`Pauses`]: paused plugin names, and parking
//! their queued jobs out of the claim's indexes.

use tokio_postgres::Row;

use super::PostgresStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::store::rules::audit::pause_note;
use crate::store::{PauseParams, Pauses, PluginPause, ResumeParams, StoreError};

const PAUSE_COLUMNS: &str = "name, paused_at, paused_by, reason";

fn pause_of(row: &Row) -> PluginPause {
    PluginPause {
        name: row.get(0),
        paused_at: Timestamp::from_unix_ms(row.get(1)),
        paused_by: row.get(2),
        reason: row.get(3),
    }
}

#[async_trait::async_trait]
impl Pauses for PostgresStore {
    async fn plugin_pause(&self, params: PauseParams) -> Result<PluginPause, StoreError> {
        let err = db_err("pausing a plugin");
        let mut client = self.client("pausing a plugin").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let inserted = tx
            .query_opt(
                &format!(
                    "INSERT INTO plugin_pauses (name, paused_at, paused_by, reason) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (name) DO NOTHING RETURNING {PAUSE_COLUMNS}"
                ),
                &[&params.name, &params.now.unix_ms(), &params.actor, &params.reason],
            )
            .await
            .map_err(&err)?;
        let Some(row) = inserted else {
            let sql = format!("SELECT {PAUSE_COLUMNS} FROM plugin_pauses WHERE name = $1");
            let first = tx.query_one(&sql, &[&params.name]).await.map_err(&err)?;
            return Ok(pause_of(&first));
        };
        let pause = pause_of(&row);
        tx.execute("UPDATE jobs SET paused = 1 WHERE plugin_name = $1 AND status = 'queued'", &[&params.name])
            .await
            .map_err(&err)?;
        if let Some(note) = pause_note(params.actor, &pause.name, Some(&pause)) {
            super::audit::append(&tx, &note, params.now).await?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(pause)
    }

    async fn plugin_resume(&self, params: ResumeParams) -> Result<bool, StoreError> {
        let err = db_err("resuming a plugin");
        let mut client = self.client("resuming a plugin").await?;
        let tx = client.transaction().await.map_err(&err)?;
        if tx.execute("DELETE FROM plugin_pauses WHERE name = $1", &[&params.name]).await.map_err(&err)? == 0 {
            return Ok(false);
        }
        tx.execute("UPDATE jobs SET paused = 0 WHERE plugin_name = $1 AND paused = 1", &[&params.name])
            .await
            .map_err(&err)?;
        if let Some(note) = pause_note(params.actor, &params.name, None) {
            super::audit::append(&tx, &note, params.now).await?;
        }
        tx.commit().await.map_err(&err)?;
        // Its jobs are claimable again: wake every replica's claim loop.
        self.wake();
        Ok(true)
    }

    async fn plugin_pauses(&self) -> Result<Vec<PluginPause>, StoreError> {
        let sql = format!("SELECT {PAUSE_COLUMNS} FROM plugin_pauses ORDER BY name");
        Ok(self.read("reading plugin pauses", &sql, &[]).await?.iter().map(pause_of).collect())
    }
}
