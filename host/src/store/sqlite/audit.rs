//! The SQLite store's [`Audit`]: reading the trail, and the append each
//! audited write makes in its own savepoint.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::SqliteStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::store::rules::audit::next_rows;
use crate::store::{Audit, AuditHead, AuditListParams, AuditNote, AuditRecord, StoreError};

const COLUMNS: &str = "seq, at, principal, action, target, detail, prev_hash, hash";

fn record(r: &Row<'_>) -> rusqlite::Result<AuditRecord> {
    Ok(AuditRecord {
        seq: r.get(0)?,
        at: Timestamp::from_unix_ms(r.get(1)?),
        principal: r.get(2)?,
        action: r.get(3)?,
        target: r.get(4)?,
        detail: r.get(5)?,
        prev_hash: r.get(6)?,
        hash: r.get(7)?,
    })
}

fn head(conn: &Connection) -> Result<AuditHead, StoreError> {
    conn.prepare_cached("SELECT seq, hash, pruned_seq, pruned_hash FROM audit_head WHERE id = 1")
        .and_then(|mut s| {
            s.query_row([], |r| {
                Ok(AuditHead { seq: r.get(0)?, hash: r.get(1)?, pruned_seq: r.get(2)?, pruned_hash: r.get(3)? })
            })
        })
        .map_err(db_err("reading the audit head"))
}

/// Append `note` to the trail at `now`, in the caller's write (which must
/// be all-or-nothing: the change and its row land together).
pub(super) fn append(conn: &Connection, note: &AuditNote, now: Timestamp) -> Result<(), StoreError> {
    append_all(conn, std::slice::from_ref(note), now)
}

/// Append `notes` in order, reading and writing the head once.
pub(super) fn append_all(conn: &Connection, notes: &[AuditNote], now: Timestamp) -> Result<(), StoreError> {
    if notes.is_empty() {
        return Ok(());
    }
    let err = db_err("appending to the audit trail");
    let (rows, head) = next_rows(&head(conn)?, notes, now)?;
    let mut insert = conn
        .prepare_cached(&format!("INSERT INTO audit ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"))
        .map_err(&err)?;
    for row in rows {
        insert
            .execute(params![
                row.seq,
                row.at.unix_ms(),
                row.principal,
                row.action,
                row.target,
                row.detail,
                row.prev_hash,
                row.hash
            ])
            .map_err(&err)?;
    }
    conn.prepare_cached("UPDATE audit_head SET seq = ?1, hash = ?2 WHERE id = 1")
        .and_then(|mut s| s.execute(params![head.seq, head.hash]))
        .map_err(&err)?;
    Ok(())
}

#[async_trait::async_trait]
impl Audit for SqliteStore {
    async fn audit_list(&self, params: AuditListParams) -> Result<Vec<AuditRecord>, StoreError> {
        self.read(move |conn| {
            let mut sql = format!("SELECT {COLUMNS} FROM audit WHERE seq > ?1");
            let mut args: Vec<rusqlite::types::Value> = vec![params.after.unwrap_or(0).into()];
            for (column, value) in
                [("principal", params.principal), ("action", params.action), ("target", params.target)]
            {
                if let Some(value) = value {
                    args.push(value.into());
                    sql.push_str(&format!(" AND {column} = ?{}", args.len()));
                }
            }
            sql.push_str(&format!(" ORDER BY seq LIMIT {}", params.limit.max(1)));
            conn.prepare(&sql)
                .and_then(|mut s| s.query_map(rusqlite::params_from_iter(args), record)?.collect())
                .map_err(db_err("reading the audit trail"))
        })
        .await
    }

    async fn audit_head(&self) -> Result<AuditHead, StoreError> {
        self.read(head).await
    }
}

/// Audit retention: delete the rows written before `before`, as one prefix
/// of the chain (up to the newest such row), and keep the last deleted
/// row's number and hash in the head, where the first row kept continues
/// the chain from.
pub(super) fn prune(conn: &Connection, before: Timestamp) -> Result<(), StoreError> {
    let err = db_err("deleting old audit rows");
    let last: Option<(i64, String)> = conn
        .query_row(
            "SELECT seq, hash FROM audit WHERE at < ?1 ORDER BY seq DESC LIMIT 1",
            params![before.unix_ms()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(&err)?;
    let Some((seq, hash)) = last else { return Ok(()) };
    conn.execute("DELETE FROM audit WHERE seq <= ?1", params![seq]).map_err(&err)?;
    conn.execute("UPDATE audit_head SET pruned_seq = ?1, pruned_hash = ?2 WHERE id = 1", params![seq, hash])
        .map_err(&err)?;
    Ok(())
}
