//! The SQLite store's [`Sessions`]: dashboard sessions ended early.

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::store::{Sessions, StoreError};

#[async_trait::async_trait]
impl Sessions for SqliteStore {
    async fn session_end(&self, id: String, expires_at: Timestamp, now: Timestamp) -> Result<(), StoreError> {
        self.write(move |conn| {
            let err = db_err("ending a session");
            conn.prepare_cached("DELETE FROM ended_sessions WHERE expires_at <= ?1")
                .and_then(|mut s| s.execute(params![now.unix_ms()]))
                .map_err(&err)?;
            conn.prepare_cached(
                "INSERT INTO ended_sessions (session_id, expires_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            )
            .and_then(|mut s| s.execute(params![id, expires_at.unix_ms()]))
            .map_err(&err)?;
            Ok(())
        })
        .await
    }

    async fn session_ended(&self, id: String) -> Result<bool, StoreError> {
        self.read(move |conn| {
            let found: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM ended_sessions WHERE session_id = ?1")
                .and_then(|mut s| s.query_row(params![id], |r| r.get(0)).optional())
                .map_err(db_err("reading ended sessions"))?;
            Ok(found.is_some())
        })
        .await
    }
}
