//! The SQLite store's [`Principals`]: principals and their tokens.

use rusqlite::{OptionalExtension, Row, params};

use super::SqliteStore;
use super::rows::db_err;
use crate::access::{Principal, TokenRecord};
use crate::clock::Timestamp;
use crate::store::rules::audit::{note, principal_put_detail, token_created};
use crate::store::rules::codec::{ceilings_of, ceilings_to_column, roles_of, roles_to_column};
use crate::store::{FoundToken, Principals, StoreError};

const TOKEN_COLUMNS: &str = "t.token_id, t.principal, t.label, t.created_at, t.expires_at, t.revoked_at";

fn token_row(r: &Row<'_>) -> rusqlite::Result<TokenRecord> {
    Ok(TokenRecord {
        id: r.get(0)?,
        principal: r.get(1)?,
        label: r.get(2)?,
        created_at: Timestamp::from_unix_ms(r.get(3)?),
        expires_at: r.get::<_, Option<i64>>(4)?.map(Timestamp::from_unix_ms),
        revoked_at: r.get::<_, Option<i64>>(5)?.map(Timestamp::from_unix_ms),
    })
}

/// A principal's columns: name, roles, created, ceilings.
const PRINCIPAL_COLUMNS: &str = "name, roles, created_at, ceilings_json";

type PrincipalRow = (String, String, i64, Option<String>);

fn principal_row(r: &Row<'_>, at: usize) -> rusqlite::Result<PrincipalRow> {
    Ok((r.get(at)?, r.get(at + 1)?, r.get(at + 2)?, r.get(at + 3)?))
}

fn principal((name, roles, created_at, ceilings): PrincipalRow) -> Result<Principal, StoreError> {
    Ok(Principal {
        roles: roles_of(&name, &roles)?,
        ceilings: ceilings_of(&name, ceilings)?,
        created_at: Timestamp::from_unix_ms(created_at),
        name,
    })
}

#[async_trait::async_trait]
impl Principals for SqliteStore {
    async fn principal_put(&self, p: Principal, actor: Option<String>) -> Result<Principal, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let before: Option<String> = conn
                .query_row("SELECT roles FROM principals WHERE name = ?1", params![p.name], |r| r.get(0))
                .optional()
                .map_err(db_err("reading a principal"))?;
            let ceilings = ceilings_to_column(&p.ceilings)?;
            let row = conn
                .prepare_cached(&format!(
                    "INSERT INTO principals ({PRINCIPAL_COLUMNS}, max_running) VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (name) DO UPDATE SET roles = excluded.roles, ceilings_json = excluded.ceilings_json, \
                     max_running = excluded.max_running RETURNING {PRINCIPAL_COLUMNS}"
                ))
                .and_then(|mut s| {
                    let cap = p.ceilings.max_running;
                    let args = params![p.name, roles_to_column(&p.roles), p.created_at.unix_ms(), ceilings, cap];
                    s.query_row(args, |r| principal_row(r, 0))
                })
                .map_err(db_err("storing a principal"))?;
            let stored = principal(row)?;
            let detail = principal_put_detail(before.as_deref(), &stored);
            super::audit::append(conn, &note(actor, "principal.put", stored.name.clone(), detail), p.created_at)?;
            Ok(stored)
        })
        .await
    }

    async fn principal_get(&self, name: String) -> Result<Option<Principal>, StoreError> {
        self.read(move |conn| {
            let row = conn
                .prepare_cached(&format!("SELECT {PRINCIPAL_COLUMNS} FROM principals WHERE name = ?1"))
                .and_then(|mut s| s.query_row(params![name], |r| principal_row(r, 0)).optional())
                .map_err(db_err("reading a principal"))?;
            row.map(principal).transpose()
        })
        .await
    }

    async fn principal_list(&self) -> Result<Vec<Principal>, StoreError> {
        self.read(|conn| {
            let rows: Vec<PrincipalRow> = conn
                .prepare_cached(&format!("SELECT {PRINCIPAL_COLUMNS} FROM principals ORDER BY name"))
                .and_then(|mut s| s.query_map([], |r| principal_row(r, 0))?.collect())
                .map_err(db_err("listing principals"))?;
            rows.into_iter().map(principal).collect()
        })
        .await
    }

    async fn principal_remove(&self, name: String, now: Timestamp, actor: Option<String>) -> Result<bool, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("removing a principal");
            let removed = conn.execute("DELETE FROM principals WHERE name = ?1", params![name]).map_err(&err)?;
            let revoked = conn
                .execute(
                    "UPDATE tokens SET revoked_at = ?2 WHERE principal = ?1 AND revoked_at IS NULL",
                    params![name, now.unix_ms()],
                )
                .map_err(&err)?;
            if removed == 1 {
                let detail = serde_json::json!({ "tokens_revoked": revoked });
                super::audit::append(conn, &note(actor, "principal.remove", name.clone(), detail), now)?;
            }
            Ok(removed == 1)
        })
        .await
    }

    async fn token_insert(&self, record: TokenRecord, hash: String, actor: Option<String>) -> Result<(), StoreError> {
        self.write_all_or_nothing(move |conn| {
            let stored = conn
                .execute(
                    "INSERT INTO tokens (token_id, principal, secret_hash, label, created_at, expires_at) \
                     SELECT ?1, name, ?3, ?4, ?5, ?6 FROM principals WHERE name = ?2",
                    params![
                        record.id,
                        record.principal,
                        hash,
                        record.label,
                        record.created_at.unix_ms(),
                        record.expires_at.map(|t| t.unix_ms())
                    ],
                )
                .map_err(db_err("storing a token"))?;
            if stored == 0 {
                return Err(StoreError::Invalid(format!("no principal {:?}", record.principal)));
            }
            super::audit::append(conn, &token_created(actor, &record), record.created_at)?;
            Ok(())
        })
        .await
    }

    async fn token_list(&self, principal: Option<String>) -> Result<Vec<TokenRecord>, StoreError> {
        self.read(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens t WHERE ?1 IS NULL OR t.principal = ?1 \
                 ORDER BY t.created_at DESC, t.token_id"
            ))
            .and_then(|mut s| s.query_map(params![principal], token_row)?.collect())
            .map_err(db_err("listing tokens"))
        })
        .await
    }

    async fn token_revoke(&self, id: String, now: Timestamp, actor: Option<String>) -> Result<bool, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let n = conn
                .execute(
                    "UPDATE tokens SET revoked_at = ?2 WHERE token_id = ?1 AND revoked_at IS NULL",
                    params![id, now.unix_ms()],
                )
                .map_err(db_err("revoking a token"))?;
            if n == 1 {
                super::audit::append(conn, &note(actor, "token.revoke", id.clone(), serde_json::json!({})), now)?;
            }
            Ok(n == 1)
        })
        .await
    }

    async fn token_find(&self, id: String) -> Result<Option<FoundToken>, StoreError> {
        self.read(move |conn| {
            let found = conn
                .prepare_cached(&format!(
                    "SELECT {TOKEN_COLUMNS}, t.secret_hash, p.name, p.roles, p.created_at, p.ceilings_json \
                     FROM tokens t JOIN principals p ON p.name = t.principal WHERE t.token_id = ?1"
                ))
                .and_then(|mut s| {
                    s.query_row(params![id], |r| Ok((token_row(r)?, r.get::<_, String>(6)?, principal_row(r, 7)?)))
                        .optional()
                })
                .map_err(db_err("reading a token"))?;
            found.map(|(record, hash, row)| Ok(FoundToken { record, hash, principal: principal(row)? })).transpose()
        })
        .await
    }
}
