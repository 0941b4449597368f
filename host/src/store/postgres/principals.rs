//! The PostgreSQL store's [`Principals`]: principals and their tokens.

use tokio_postgres::Row;

use super::PostgresStore;
use super::rows::db_err;
use crate::access::{Principal, TokenRecord};
use crate::clock::Timestamp;
use crate::store::rules::audit::{note, principal_put_detail, token_created};
use crate::store::rules::codec::{ceilings_of, ceilings_to_column, roles_of, roles_to_column};
use crate::store::{FoundToken, Principals, StoreError};

const TOKEN_COLUMNS: &str = "t.token_id, t.principal, t.label, t.created_at, t.expires_at, t.revoked_at";

fn token_row(r: &Row) -> TokenRecord {
    TokenRecord {
        id: r.get(0),
        principal: r.get(1),
        label: r.get(2),
        created_at: Timestamp::from_unix_ms(r.get(3)),
        expires_at: r.get::<_, Option<i64>>(4).map(Timestamp::from_unix_ms),
        revoked_at: r.get::<_, Option<i64>>(5).map(Timestamp::from_unix_ms),
    }
}

/// A principal's columns: name, roles, created, ceilings.
const PRINCIPAL_COLUMNS: &str = "name, roles, created_at, ceilings_json";

fn principal(r: &Row, at: usize) -> Result<Principal, StoreError> {
    let name: String = r.get(at);
    let roles: String = r.get(at + 1);
    Ok(Principal {
        roles: roles_of(&name, &roles)?,
        ceilings: ceilings_of(&name, r.get(at + 3))?,
        created_at: Timestamp::from_unix_ms(r.get(at + 2)),
        name,
    })
}

#[async_trait::async_trait]
impl Principals for PostgresStore {
    async fn principal_put(&self, p: Principal, actor: Option<String>) -> Result<Principal, StoreError> {
        let err = db_err("storing a principal");
        let mut client = self.client("storing a principal").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let before = tx
            .query_opt("SELECT roles FROM principals WHERE name = $1 FOR UPDATE", &[&p.name])
            .await
            .map_err(&err)?
            .map(|r| r.get::<_, String>(0));
        let row = tx
            .query_one(
                &format!(
                    "INSERT INTO principals ({PRINCIPAL_COLUMNS}, max_running) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (name) DO UPDATE SET roles = excluded.roles, ceilings_json = excluded.ceilings_json, \
                     max_running = excluded.max_running RETURNING {PRINCIPAL_COLUMNS}"
                ),
                &[
                    &p.name,
                    &roles_to_column(&p.roles),
                    &p.created_at.unix_ms(),
                    &ceilings_to_column(&p.ceilings)?,
                    &p.ceilings.max_running.map(i64::from),
                ],
            )
            .await
            .map_err(&err)?;
        let stored = principal(&row, 0)?;
        let detail = principal_put_detail(before.as_deref(), &stored);
        super::audit::append(&tx, &note(actor, "principal.put", p.name.clone(), detail), p.created_at).await?;
        tx.commit().await.map_err(&err)?;
        self.caps_changed();
        Ok(stored)
    }

    async fn principal_get(&self, name: String) -> Result<Option<Principal>, StoreError> {
        let sql = format!("SELECT {PRINCIPAL_COLUMNS} FROM principals WHERE name = $1");
        let rows = self.read("reading a principal", &sql, &[&name]).await?;
        rows.first().map(|r| principal(r, 0)).transpose()
    }

    async fn principal_list(&self) -> Result<Vec<Principal>, StoreError> {
        let sql = format!("SELECT {PRINCIPAL_COLUMNS} FROM principals ORDER BY name");
        let rows = self.read("listing principals", &sql, &[]).await?;
        rows.iter().map(|r| principal(r, 0)).collect()
    }

    async fn principal_remove(&self, name: String, now: Timestamp, actor: Option<String>) -> Result<bool, StoreError> {
        let err = db_err("removing a principal");
        let mut client = self.client("removing a principal").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let removed = tx.execute("DELETE FROM principals WHERE name = $1", &[&name]).await.map_err(&err)?;
        let revoked = tx
            .execute(
                "UPDATE tokens SET revoked_at = $2 WHERE principal = $1 AND revoked_at IS NULL",
                &[&name, &now.unix_ms()],
            )
            .await
            .map_err(&err)?;
        if removed == 1 {
            let detail = serde_json::json!({ "tokens_revoked": revoked });
            super::audit::append(&tx, &note(actor, "principal.remove", name.clone(), detail), now).await?;
        }
        tx.commit().await.map_err(&err)?;
        self.caps_changed();
        Ok(removed == 1)
    }

    async fn token_insert(&self, record: TokenRecord, hash: String, actor: Option<String>) -> Result<(), StoreError> {
        let err = db_err("storing a token");
        let mut client = self.client("storing a token").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let stored = tx
            .execute(
                "INSERT INTO tokens (token_id, principal, secret_hash, label, created_at, expires_at) \
                 SELECT $1, name, $3, $4, $5, $6 FROM principals WHERE name = $2",
                &[
                    &record.id,
                    &record.principal,
                    &hash,
                    &record.label,
                    &record.created_at.unix_ms(),
                    &record.expires_at.map(|t| t.unix_ms()),
                ],
            )
            .await
            .map_err(&err)?;
        if stored == 0 {
            return Err(StoreError::Invalid(format!("no principal {:?}", record.principal)));
        }
        super::audit::append(&tx, &token_created(actor, &record), record.created_at).await?;
        tx.commit().await.map_err(&err)
    }

    async fn token_list(&self, principal: Option<String>) -> Result<Vec<TokenRecord>, StoreError> {
        let sql = format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens t WHERE $1::text IS NULL OR t.principal = $1 \
             ORDER BY t.created_at DESC, t.token_id"
        );
        let rows = self.read("listing tokens", &sql, &[&principal]).await?;
        Ok(rows.iter().map(token_row).collect())
    }

    async fn token_revoke(&self, id: String, now: Timestamp, actor: Option<String>) -> Result<bool, StoreError> {
        let err = db_err("revoking a token");
        let mut client = self.client("revoking a token").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let revoked = tx
            .execute(
                "UPDATE tokens SET revoked_at = $2 WHERE token_id = $1 AND revoked_at IS NULL",
                &[&id, &now.unix_ms()],
            )
            .await
            .map_err(&err)?;
        if revoked == 1 {
            super::audit::append(&tx, &note(actor, "token.revoke", id.clone(), serde_json::json!({})), now).await?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(revoked == 1)
    }

    async fn token_find(&self, id: String) -> Result<Option<FoundToken>, StoreError> {
        let sql = format!(
            "SELECT {TOKEN_COLUMNS}, t.secret_hash, p.name, p.roles, p.created_at, p.ceilings_json \
             FROM tokens t JOIN principals p ON p.name = t.principal WHERE t.token_id = $1"
        );
        let rows = self.read("reading a token", &sql, &[&id]).await?;
        rows.first()
            .map(|r| Ok(FoundToken { record: token_row(r), hash: r.get(6), principal: principal(r, 7)? }))
            .transpose()
    }
}
