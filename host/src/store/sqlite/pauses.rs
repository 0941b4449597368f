//! The SQLite store's [`Pauses`]: paused plugin names, and parking their
//! queued jobs out of the claim's indexes.

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::store::rules::audit::pause_note;
use crate::store::{PauseParams, Pauses, PluginPause, ResumeParams, StoreError};

const PAUSE_COLUMNS: &str = "name, paused_at, paused_by, reason";

fn pause_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<PluginPause> {
    Ok(PluginPause {
        name: r.get(0)?,
        paused_at: Timestamp::from_unix_ms(r.get(1)?),
        paused_by: r.get(2)?,
        reason: r.get(3)?,
    })
}

/// Whether `name` is paused now (a new job of it is queued parked).
pub(super) fn is_paused(conn: &Connection, name: &str) -> Result<bool, StoreError> {
    conn.prepare_cached("SELECT 1 FROM plugin_pauses WHERE name = ?1")
        .and_then(|mut s| s.exists(params![name]))
        .map_err(db_err("reading plugin pauses"))
}

#[async_trait::async_trait]
impl Pauses for SqliteStore {
    async fn plugin_pause(&self, params: PauseParams) -> Result<PluginPause, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("pausing a plugin");
            let sql = format!("SELECT {PAUSE_COLUMNS} FROM plugin_pauses WHERE name = ?1");
            if let Some(first) = conn.query_row(&sql, params![params.name], pause_of).optional().map_err(&err)? {
                return Ok(first);
            }
            let pause = PluginPause {
                name: params.name.clone(),
                paused_at: params.now,
                paused_by: params.actor.clone(),
                reason: params.reason.clone(),
            };
            conn.execute(
                "INSERT INTO plugin_pauses (name, paused_at, paused_by, reason) VALUES (?1, ?2, ?3, ?4)",
                params![pause.name, pause.paused_at.unix_ms(), pause.paused_by, pause.reason],
            )
            .map_err(&err)?;
            conn.execute(
                "UPDATE jobs SET paused = 1 WHERE plugin_name = ?1 AND status = 'queued'",
                params![pause.name],
            )
            .map_err(&err)?;
            if let Some(note) = pause_note(params.actor, &pause.name, Some(&pause)) {
                super::audit::append(conn, &note, params.now)?;
            }
            Ok(pause)
        })
        .await
    }

    async fn plugin_resume(&self, params: ResumeParams) -> Result<bool, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("resuming a plugin");
            if conn.execute("DELETE FROM plugin_pauses WHERE name = ?1", params![params.name]).map_err(&err)? == 0 {
                return Ok(false);
            }
            conn.execute("UPDATE jobs SET paused = 0 WHERE plugin_name = ?1 AND paused = 1", params![params.name])
                .map_err(&err)?;
            if let Some(note) = pause_note(params.actor, &params.name, None) {
                super::audit::append(conn, &note, params.now)?;
            }
            Ok(true)
        })
        .await
    }

    async fn plugin_pauses(&self) -> Result<Vec<PluginPause>, StoreError> {
        self.read(|conn| {
            let sql = format!("SELECT {PAUSE_COLUMNS} FROM plugin_pauses ORDER BY name");
            conn.prepare_cached(&sql)
                .and_then(|mut s| s.query_map([], pause_of)?.collect())
                .map_err(db_err("reading plugin pauses"))
        })
        .await
    }
}
