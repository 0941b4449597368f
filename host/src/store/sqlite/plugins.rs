//! The SQLite store's [`Plugins`]: bytes by digest,
//! registered names, grants and approval policies.

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::rows::{db_err, query_plugins};
use crate::clock::Timestamp;
use crate::job::{Digest, PluginInfo, PluginRef};
use crate::store::rules::audit::{RegistrationChange, column_value, note};
use crate::store::rules::codec::{corrupt, grants_of, policy_of, policy_to_column, requests_of, requests_to_column};
use crate::store::{
    PluginCodePutParams, PluginGrantsParams, PluginNameParams, PluginPolicyParams, PluginPutParams, Plugins, StoreError,
};

/// The table of compiled code (one of [`MIGRATIONS`](super::migrations::MIGRATIONS)).
pub(super) const CODE_MIGRATION: &str = r#"
-- Compiled code of stored plugins, by the engine configuration that made
-- it: a process that never compiled a plugin reads it instead.
CREATE TABLE plugin_code (
    digest     TEXT NOT NULL REFERENCES plugins (digest) ON DELETE CASCADE,
    engine     TEXT NOT NULL,
    code       BLOB NOT NULL,
    size_bytes INTEGER NOT NULL CHECK (size_bytes = length(code)),
    used_at    INTEGER NOT NULL,
    PRIMARY KEY (digest, engine)
);
"#;

/// Drop the least recently used compiled code past the bound (`?1`).
const EVICT_CODE: &str = "DELETE FROM plugin_code WHERE (digest, engine) IN (\
     SELECT digest, engine FROM (SELECT digest, engine, \
     SUM(size_bytes) OVER (ORDER BY used_at DESC, digest, engine) AS kept FROM plugin_code) WHERE kept > ?1)";

#[async_trait::async_trait]
impl Plugins for SqliteStore {
    async fn plugin_put(&self, params: PluginPutParams) -> Result<Digest, StoreError> {
        let digest = Digest::of(&params.bytes);
        let requests = requests_to_column(params.requests.as_ref())?;
        let upload = params.actor.clone().map(|actor| {
            let detail = serde_json::json!({ "size_bytes": params.bytes.len() });
            note(Some(actor), "plugin.upload", digest.to_string(), detail)
        });
        let put = move |conn: &rusqlite::Connection| {
            conn.prepare_cached(
                "INSERT INTO plugins (digest, bytes, size_bytes, created_at, requests_json, requests_read) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 1) ON CONFLICT (digest) DO UPDATE \
                 SET requests_json = excluded.requests_json, requests_read = 1 WHERE plugins.requests_read = 0",
            )
            .and_then(|mut s| {
                let size = params.bytes.len() as i64;
                s.execute(params![digest.to_string(), params.bytes, size, params.now.unix_ms(), requests])
            })
            .map_err(db_err("storing a plugin"))?;
            if let Some(upload) = &upload {
                super::audit::append(conn, upload, params.now)?;
            }
            Ok(digest)
        };
        // An audited upload is two writes that land together.
        if params.actor.is_some() { self.write_all_or_nothing(put).await } else { self.write(put).await }
    }

    async fn plugins_undeclared(&self) -> Result<Vec<Digest>, StoreError> {
        self.read(|conn| {
            let err = db_err("reading undeclared plugins");
            let mut stmt = conn.prepare_cached("SELECT digest FROM plugins WHERE requests_read = 0").map_err(&err)?;
            let digests: Vec<String> = stmt.query_map([], |r| r.get(0)).and_then(|r| r.collect()).map_err(&err)?;
            digests.into_iter().map(|d| d.parse().map_err(|e: String| corrupt(&d, e))).collect()
        })
        .await
    }

    async fn plugin_code_get(
        &self,
        digest: Digest,
        engine: String,
        now: Timestamp,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let key = (digest.to_string(), engine);
        let read_key = key.clone();
        let code: Option<Vec<u8>> = self
            .read(move |conn| {
                conn.query_row(
                    "SELECT code FROM plugin_code WHERE digest = ?1 AND engine = ?2",
                    params![read_key.0, read_key.1],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db_err("reading compiled code"))
            })
            .await?;
        if code.is_some() {
            self.write(move |conn| {
                conn.execute(
                    "UPDATE plugin_code SET used_at = ?3 WHERE digest = ?1 AND engine = ?2",
                    params![key.0, key.1, now.unix_ms()],
                )
                .map_err(db_err("marking compiled code used"))
            })
            .await?;
        }
        Ok(code)
    }

    async fn plugin_code_put(&self, params: PluginCodePutParams) -> Result<bool, StoreError> {
        if params.code.len() as u64 > params.bound {
            return Ok(false);
        }
        self.write_all_or_nothing(move |conn| {
            let err = db_err("keeping compiled code");
            let kept = conn
                .execute(
                    "INSERT INTO plugin_code (digest, engine, code, size_bytes, used_at) \
                     SELECT digest, ?2, ?3, ?4, ?5 FROM plugins WHERE digest = ?1 \
                     ON CONFLICT (digest, engine) DO UPDATE \
                     SET code = excluded.code, size_bytes = excluded.size_bytes, used_at = excluded.used_at",
                    params![
                        params.digest.to_string(),
                        params.engine,
                        params.code,
                        params.code.len() as i64,
                        params.now.unix_ms()
                    ],
                )
                .map_err(&err)?;
            conn.execute(EVICT_CODE, params![i64::try_from(params.bound).unwrap_or(i64::MAX)]).map_err(&err)?;
            Ok(kept == 1)
        })
        .await
    }

    async fn plugin_get(&self, digest: Digest) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(move |conn| {
            conn.query_row("SELECT bytes FROM plugins WHERE digest = ?1", params![digest.to_string()], |r| r.get(0))
                .optional()
                .map_err(db_err("reading a plugin"))
        })
        .await
    }

    async fn plugin_name_set(&self, params: PluginNameParams) -> Result<PluginInfo, StoreError> {
        self.write_all_or_nothing(move |conn| {
            let err = db_err("naming a plugin");
            let (name, version) = (&params.name.name, &params.name.version);
            // A replaced pair keeps its grants and its approval policy.
            let kept: Option<(Option<String>, Option<String>, String)> = conn
                .query_row(
                    "SELECT grants_json, approval_json, digest FROM plugin_names WHERE name = ?1 AND version = ?2",
                    params![name, version],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
                .map_err(&err)?;
            let before = kept.as_ref().map(|(_, _, digest)| digest.clone());
            let (grants, kept_policy) = kept.map(|(g, p, _)| (g, p)).unwrap_or_default();
            let policy = match &params.policy {
                Some(policy) => policy_to_column(policy)?,
                None => kept_policy,
            };
            conn.prepare_cached("DELETE FROM plugin_names WHERE name = ?1 AND version = ?2")
                .and_then(|mut s| s.execute(params![name, version]))
                .map_err(&err)?;
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO plugin_names (name, version, digest, created_at, grants_json, approval_json) \
                     SELECT ?1, ?2, digest, ?4, ?5, ?6 FROM plugins WHERE digest = ?3",
                )
                .and_then(|mut s| {
                    s.execute(params![name, version, params.digest.to_string(), params.now.unix_ms(), grants, policy])
                })
                .map_err(&err)?;
            if inserted == 0 {
                return Err(StoreError::Invalid(format!("plugin {} is not stored", params.digest)));
            }
            let detail = serde_json::json!({
                "before": before,
                "after": params.digest,
                "policy": column_value(policy.as_deref()),
            });
            super::audit::append(
                conn,
                &note(params.actor.clone(), "plugin.register", params.name.to_string(), detail),
                params.now,
            )?;
            let (size, requests): (i64, Option<String>) = conn
                .query_row(
                    "SELECT size_bytes, requests_json FROM plugins WHERE digest = ?1",
                    params![params.digest.to_string()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(&err)?;
            Ok(PluginInfo {
                grants: grants_of(&params.digest.to_string(), grants)?,
                approval: policy_of(&params.digest.to_string(), policy)?,
                name: Some(params.name),
                digest: params.digest,
                size_bytes: size as u64,
                created_at: params.now,
                requests: requests_of(&params.digest.to_string(), requests)?,
            })
        })
        .await
    }

    async fn plugin_grants_set(&self, params: PluginGrantsParams) -> Result<Option<PluginInfo>, StoreError> {
        let change = RegistrationChange::grants(&params)?;
        let changed = self.write_all_or_nothing(move |conn| set_registration_column(conn, &change)).await?;
        if changed == 0 {
            return Ok(None);
        }
        self.plugin_resolve(PluginRef::Version(params.name)).await
    }

    async fn plugin_policy_set(&self, params: PluginPolicyParams) -> Result<Option<PluginInfo>, StoreError> {
        let change = RegistrationChange::policy(&params)?;
        let changed = self.write_all_or_nothing(move |conn| set_registration_column(conn, &change)).await?;
        if changed == 0 {
            return Ok(None);
        }
        self.plugin_resolve(PluginRef::Version(params.name)).await
    }

    async fn plugin_list(&self) -> Result<Vec<PluginInfo>, StoreError> {
        self.read(|conn| {
            query_plugins(
                conn,
                "SELECT name, version, digest, size_bytes, created_at, grants_json, approval_json, requests_json FROM ( \
                   SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json, \
                   p.requests_json, n.rowid AS seq FROM plugin_names n JOIN plugins p ON p.digest = n.digest \
                   UNION ALL \
                   SELECT NULL, NULL, p.digest, p.size_bytes, p.created_at, NULL, NULL, p.requests_json, 0 \
                   FROM plugins p \
                   WHERE NOT EXISTS (SELECT 1 FROM plugin_names n WHERE n.digest = p.digest)) \
                 ORDER BY name IS NULL, name, seq DESC, created_at DESC",
                [],
            )
        })
        .await
    }

    async fn plugin_resolve(&self, plugin: PluginRef) -> Result<Option<PluginInfo>, StoreError> {
        self.read(move |conn| {
            let found = match plugin {
                PluginRef::Digest(digest) => query_plugins(
                    conn,
                    "SELECT n.name, n.version, p.digest, p.size_bytes, COALESCE(n.created_at, p.created_at), \
                     n.grants_json, n.approval_json, p.requests_json \
                     FROM plugins p LEFT JOIN plugin_names n ON n.digest = p.digest \
                     WHERE p.digest = ?1 ORDER BY n.rowid DESC LIMIT 1",
                    params![digest.to_string()],
                )?,
                PluginRef::Name(name) => query_plugins(
                    conn,
                    "SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json, \
                     p.requests_json FROM plugin_names n JOIN plugins p ON p.digest = n.digest WHERE n.name = ?1 \
                     ORDER BY n.rowid DESC LIMIT 1",
                    params![name],
                )?,
                PluginRef::Version(v) => query_plugins(
                    conn,
                    "SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json, \
                     p.requests_json FROM plugin_names n JOIN plugins p ON p.digest = n.digest \
                     WHERE n.name = ?1 AND n.version = ?2",
                    params![v.name, v.version],
                )?,
            };
            Ok(found.into_iter().next())
        })
        .await
    }
}

/// Replace one JSON column of a registration and audit the change with
/// what it held before; the rows changed (0: no such registration).
fn set_registration_column(conn: &rusqlite::Connection, change: &RegistrationChange) -> Result<usize, StoreError> {
    let err = db_err("changing a plugin registration");
    let (name, column) = (&change.name, change.column);
    let before: Option<Option<String>> = conn
        .query_row(
            &format!("SELECT {column} FROM plugin_names WHERE name = ?1 AND version = ?2"),
            params![name.name, name.version],
            |r| r.get(0),
        )
        .optional()
        .map_err(&err)?;
    let Some(before) = before else { return Ok(0) };
    let changed = conn
        .execute(
            &format!("UPDATE plugin_names SET {column} = ?3 WHERE name = ?1 AND version = ?2"),
            params![name.name, name.version, change.value],
        )
        .map_err(&err)?;
    super::audit::append(conn, &change.note(before.as_deref()), change.now)?;
    Ok(changed)
}
