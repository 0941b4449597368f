//! The PostgreSQL store's [`Sessions`]: dashboard sessions ended early.

use super::PostgresStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::store::{Sessions, StoreError};

#[async_trait::async_trait]
impl Sessions for PostgresStore {
    async fn session_end(&self, id: String, expires_at: Timestamp, now: Timestamp) -> Result<(), StoreError> {
        let err = db_err("ending a session");
        let mut client = self.client("ending a session").await?;
        let tx = client.transaction().await.map_err(&err)?;
        tx.execute("DELETE FROM ended_sessions WHERE expires_at <= $1", &[&now.unix_ms()]).await.map_err(&err)?;
        tx.execute(
            "INSERT INTO ended_sessions (session_id, expires_at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&id, &expires_at.unix_ms()],
        )
        .await
        .map_err(&err)?;
        tx.commit().await.map_err(&err)
    }

    async fn session_ended(&self, id: String) -> Result<bool, StoreError> {
        let rows =
            self.read("reading ended sessions", "SELECT 1 FROM ended_sessions WHERE session_id = $1", &[&id]).await?;
        Ok(!rows.is_empty())
    }
}
