//! The PostgreSQL store's [`Audit`]: reading the trail, and the append each
//! audited write makes in its own transaction.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::rows::db_err;
use crate::clock::Timestamp;
use crate::store::rules::audit::next_rows;
use crate::store::{Audit, AuditHead, AuditListParams, AuditNote, AuditRecord, StoreError};

const COLUMNS: &str = "seq, at, principal, action, target, detail, prev_hash, hash";

/// The head's columns, as [`head`] reads them.
const HEAD_COLUMNS: &str = "seq, hash, pruned_seq, pruned_hash";

fn head(r: &Row) -> AuditHead {
    AuditHead { seq: r.get(0), hash: r.get(1), pruned_seq: r.get(2), pruned_hash: r.get(3) }
}

fn record(r: &Row) -> AuditRecord {
    AuditRecord {
        seq: r.get(0),
        at: Timestamp::from_unix_ms(r.get(1)),
        principal: r.get(2),
        action: r.get(3),
        target: r.get(4),
        detail: r.get(5),
        prev_hash: r.get(6),
        hash: r.get(7),
    }
}

/// Append `note` to the trail at `now`, in the caller's transaction. The
/// head's row lock makes appends from every replica take turns, so the
/// chain has one order.
pub(super) async fn append(client: &impl GenericClient, note: &AuditNote, now: Timestamp) -> Result<(), StoreError> {
    append_all(client, std::slice::from_ref(note), now).await
}

/// Append `notes` in order in one statement, locking and writing the head
/// once.
pub(super) async fn append_all(
    client: &impl GenericClient,
    notes: &[AuditNote],
    now: Timestamp,
) -> Result<(), StoreError> {
    if notes.is_empty() {
        return Ok(());
    }
    let err = db_err("appending to the audit trail");
    let head = client
        .query_one(&format!("SELECT {HEAD_COLUMNS} FROM audit_head WHERE id = 1 FOR UPDATE"), &[])
        .await
        .map(|r| head(&r))
        .map_err(&err)?;
    let (rows, head) = next_rows(&head, notes, now)?;
    let column = |f: fn(&AuditRecord) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    let principals: Vec<Option<String>> = rows.iter().map(|r| r.principal.clone()).collect();
    let (actions, targets, details) =
        (column(|r| r.action.clone()), column(|r| r.target.clone()), column(|r| r.detail.clone()));
    let (prevs, hashes) = (column(|r| r.prev_hash.clone()), column(|r| r.hash.clone()));
    let insert = format!(
        "INSERT INTO audit ({COLUMNS}) SELECT seq, $2, principal, action, target, detail, prev_hash, hash \
         FROM unnest($1::int8[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[]) \
         AS r(seq, principal, action, target, detail, prev_hash, hash)"
    );
    let stmt = client.prepare_cached(&insert).await.map_err(&err)?;
    client
        .execute(&stmt, &[&seqs, &now.unix_ms(), &principals, &actions, &targets, &details, &prevs, &hashes])
        .await
        .map_err(&err)?;
    client
        .execute("UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1", &[&head.seq, &head.hash])
        .await
        .map_err(&err)?;
    Ok(())
}

#[async_trait::async_trait]
impl Audit for PostgresStore {
    async fn audit_list(&self, params: AuditListParams) -> Result<Vec<AuditRecord>, StoreError> {
        let after = params.after.unwrap_or(0);
        let mut sql = format!("SELECT {COLUMNS} FROM audit WHERE seq > $1");
        let filters: Vec<(&str, String)> =
            [("principal", params.principal), ("action", params.action), ("target", params.target)]
                .into_iter()
                .filter_map(|(column, value)| value.map(|v| (column, v)))
                .collect();
        let mut args: Vec<&(dyn ToSql + Sync)> = vec![&after];
        for (column, value) in &filters {
            args.push(value);
            sql.push_str(&format!(" AND {column} = ${}", args.len()));
        }
        sql.push_str(&format!(" ORDER BY seq LIMIT {}", params.limit.max(1)));
        let rows = self.read("reading the audit trail", &sql, &args).await?;
        Ok(rows.iter().map(record).collect())
    }

    async fn audit_head(&self) -> Result<AuditHead, StoreError> {
        let sql = format!("SELECT {HEAD_COLUMNS} FROM audit_head WHERE id = 1");
        let rows = self.read("reading the audit head", &sql, &[]).await?;
        rows.first().map(head).ok_or_else(|| StoreError::Invalid("the audit head is missing".into()))
    }
}

impl PostgresStore {
    /// Audit retention: delete the rows written before `before`, as one
    /// prefix of the chain (up to the newest such row), and keep the last
    /// deleted row's number and hash in the head, where the first row kept
    /// continues the chain from. The head's row lock makes it take turns
    /// with appends.
    pub(super) async fn audit_prune(&self, before: Timestamp) -> Result<(), StoreError> {
        let err = db_err("deleting old audit rows");
        let mut client = self.client("deleting old audit rows").await?;
        let tx = client.transaction().await.map_err(&err)?;
        tx.execute("SELECT 1 FROM audit_head WHERE id = 1 FOR UPDATE", &[]).await.map_err(&err)?;
        let last = tx
            .query_opt("SELECT seq, hash FROM audit WHERE at < $1 ORDER BY seq DESC LIMIT 1", &[&before.unix_ms()])
            .await
            .map_err(&err)?;
        let Some(last) = last else { return Ok(()) };
        let (seq, hash): (i64, String) = (last.get(0), last.get(1));
        tx.execute("DELETE FROM audit WHERE seq <= $1", &[&seq]).await.map_err(&err)?;
        tx.execute("UPDATE audit_head SET pruned_seq = $1, pruned_hash = $2 WHERE id = 1", &[&seq, &hash])
            .await
            .map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        Ok(())
    }
}
