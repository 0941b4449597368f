//! The PostgreSQL store's [`Plugins`]: bytes by digest,
//! registered names, grants and approval policies.

use deadpool_postgres::GenericClient;

use super::PostgresStore;
use super::rows::{db_err, row_to_plugin};
use crate::clock::Timestamp;
use crate::job::{Digest, PluginInfo, PluginRef};
use crate::store::rules::audit::{RegistrationChange, column_value, note};
use crate::store::rules::codec::{corrupt, grants_of, policy_of, policy_to_column, requests_of, requests_to_column};
use crate::store::{
    PluginCodePutParams, PluginGrantsParams, PluginNameParams, PluginPolicyParams, PluginPutParams, Plugins, StoreError,
};

/// The table of compiled code (one of [`MIGRATIONS`](super::schema::MIGRATIONS)).
pub(super) const CODE_MIGRATION: &str = r#"
-- Compiled code of stored plugins, by the engine configuration that made
-- it: a worker that never compiled a plugin reads it instead.
CREATE TABLE plugin_code (
    digest     TEXT COLLATE "C" NOT NULL REFERENCES plugins (digest) ON DELETE CASCADE,
    engine     TEXT COLLATE "C" NOT NULL,
    code       BYTEA NOT NULL,
    size_bytes BIGINT NOT NULL CHECK (size_bytes = length(code)),
    used_at    BIGINT NOT NULL,
    PRIMARY KEY (digest, engine)
);
-- Machine code does not compress much, and tens of MB would be compressed
-- on every write and inflated on every read: kept as it is.
ALTER TABLE plugin_code ALTER COLUMN code SET STORAGE EXTERNAL;
"#;

/// Drop the least recently used compiled code past the bound (`$1`).
const EVICT_CODE: &str = "DELETE FROM plugin_code WHERE (digest, engine) IN (\
     SELECT digest, engine FROM (SELECT digest, engine, \
     SUM(size_bytes) OVER (ORDER BY used_at DESC, digest, engine) AS kept FROM plugin_code) AS ranked \
     WHERE kept > $1::BIGINT)";

#[async_trait::async_trait]
impl Plugins for PostgresStore {
    async fn plugin_put(&self, params: PluginPutParams) -> Result<Digest, StoreError> {
        let digest = Digest::of(&params.bytes);
        let requests = requests_to_column(params.requests.as_ref())?;
        let sql = "INSERT INTO plugins (digest, bytes, size_bytes, created_at, requests_json, requests_read) \
             VALUES ($1, $2, $3, $4, $5, TRUE) ON CONFLICT (digest) DO UPDATE \
             SET requests_json = excluded.requests_json, requests_read = TRUE WHERE NOT plugins.requests_read";
        let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&digest.to_string(), &params.bytes, &(params.bytes.len() as i64), &params.now.unix_ms(), &requests];
        let Some(actor) = params.actor.clone() else {
            self.execute("storing a plugin", sql, &args).await?;
            return Ok(digest);
        };
        // An upload a principal makes is audited with it.
        let err = db_err("storing a plugin");
        let mut client = self.client("storing a plugin").await?;
        let tx = client.transaction().await.map_err(&err)?;
        tx.execute(sql, &args).await.map_err(&err)?;
        let detail = serde_json::json!({ "size_bytes": params.bytes.len() });
        super::audit::append(&tx, &note(Some(actor), "plugin.upload", digest.to_string(), detail), params.now).await?;
        tx.commit().await.map_err(&err)?;
        Ok(digest)
    }

    async fn plugins_undeclared(&self) -> Result<Vec<Digest>, StoreError> {
        let rows =
            self.read("reading undeclared plugins", "SELECT digest FROM plugins WHERE NOT requests_read", &[]).await?;
        rows.iter()
            .map(|r| {
                let digest: String = r.get(0);
                digest.parse().map_err(|e: String| corrupt(&digest, e))
            })
            .collect()
    }

    async fn plugin_code_get(
        &self,
        digest: Digest,
        engine: String,
        now: Timestamp,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let rows = self
            .query(
                "reading compiled code",
                "UPDATE plugin_code SET used_at = $3 WHERE digest = $1 AND engine = $2 RETURNING code",
                &[&digest.to_string(), &engine, &now.unix_ms()],
            )
            .await?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    async fn plugin_code_put(&self, params: PluginCodePutParams) -> Result<bool, StoreError> {
        if params.code.len() as u64 > params.bound {
            return Ok(false);
        }
        let err = db_err("keeping compiled code");
        let mut client = self.client("keeping compiled code").await?;
        let tx = client.transaction().await.map_err(&err)?;
        // One writer of compiled code at a time, so the bound holds.
        tx.execute("LOCK TABLE plugin_code IN SHARE ROW EXCLUSIVE MODE", &[]).await.map_err(&err)?;
        let kept = tx
            .execute(
                "INSERT INTO plugin_code (digest, engine, code, size_bytes, used_at) \
                 SELECT digest, $2, $3, $4, $5 FROM plugins WHERE digest = $1 \
                 ON CONFLICT (digest, engine) DO UPDATE \
                 SET code = excluded.code, size_bytes = excluded.size_bytes, used_at = excluded.used_at",
                &[
                    &params.digest.to_string(),
                    &params.engine,
                    &params.code,
                    &(params.code.len() as i64),
                    &params.now.unix_ms(),
                ],
            )
            .await
            .map_err(&err)?;
        tx.execute(EVICT_CODE, &[&i64::try_from(params.bound).unwrap_or(i64::MAX)]).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        Ok(kept == 1)
    }

    async fn plugin_get(&self, digest: Digest) -> Result<Option<Vec<u8>>, StoreError> {
        let rows = self
            .read("reading a plugin", "SELECT bytes FROM plugins WHERE digest = $1", &[&digest.to_string()])
            .await?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    async fn plugin_name_set(&self, params: PluginNameParams) -> Result<PluginInfo, StoreError> {
        let err = db_err("naming a plugin");
        let mut client = self.client("naming a plugin").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let (name, version, digest) = (&params.name.name, &params.name.version, params.digest.to_string());
        // A replaced pair keeps its grants and its approval policy.
        let (grants, policy, before): (Option<String>, Option<String>, Option<String>) = tx
            .query_opt(
                "DELETE FROM plugin_names WHERE name = $1 AND version = $2 RETURNING grants_json, approval_json, digest",
                &[name, version],
            )
            .await
            .map_err(&err)?
            .map_or((None, None, None), |r| (r.get(0), r.get(1), r.get(2)));
        let policy = match &params.policy {
            Some(policy) => policy_to_column(policy)?,
            None => policy,
        };
        let stored: Option<(i64, Option<String>)> = tx
            .query_opt(
                "INSERT INTO plugin_names (name, version, digest, created_at, grants_json, approval_json) \
                 SELECT $1, $2, digest, $4, $5, $6 FROM plugins WHERE digest = $3 \
                 RETURNING (SELECT size_bytes FROM plugins WHERE digest = $3), \
                 (SELECT requests_json FROM plugins WHERE digest = $3)",
                &[name, version, &digest, &params.now.unix_ms(), &grants, &policy],
            )
            .await
            .map_err(&err)?
            .map(|r| (r.get(0), r.get(1)));
        let Some((size, requests)) = stored else {
            return Err(StoreError::Invalid(format!("plugin {} is not stored", params.digest)));
        };
        let detail = serde_json::json!({
            "before": before,
            "after": params.digest,
            "policy": column_value(policy.as_deref()),
        });
        let registered = note(params.actor.clone(), "plugin.register", params.name.to_string(), detail);
        super::audit::append(&tx, &registered, params.now).await?;
        tx.commit().await.map_err(&err)?;
        Ok(PluginInfo {
            grants: grants_of(&digest, grants)?,
            approval: policy_of(&digest, policy)?,
            name: Some(params.name),
            digest: params.digest,
            size_bytes: size as u64,
            created_at: params.now,
            requests: requests_of(&digest, requests)?,
        })
    }

    async fn plugin_grants_set(&self, params: PluginGrantsParams) -> Result<Option<PluginInfo>, StoreError> {
        let change = RegistrationChange::grants(&params)?;
        let changed = self.set_registration_column(change).await?;
        if !changed {
            return Ok(None);
        }
        self.plugin_resolve(PluginRef::Version(params.name)).await
    }

    async fn plugin_policy_set(&self, params: PluginPolicyParams) -> Result<Option<PluginInfo>, StoreError> {
        let change = RegistrationChange::policy(&params)?;
        let changed = self.set_registration_column(change).await?;
        if !changed {
            return Ok(None);
        }
        self.plugin_resolve(PluginRef::Version(params.name)).await
    }

    async fn plugin_list(&self) -> Result<Vec<PluginInfo>, StoreError> {
        let rows = self
            .read(
                "listing plugins",
                "SELECT name, version, digest, size_bytes, created_at, grants_json, approval_json, requests_json FROM ( \
                   SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json, \
                   p.requests_json, n.seq FROM plugin_names n JOIN plugins p ON p.digest = n.digest \
                   UNION ALL \
                   SELECT NULL, NULL, p.digest, p.size_bytes, p.created_at, NULL, NULL, p.requests_json, 0 \
                   FROM plugins p \
                   WHERE NOT EXISTS (SELECT 1 FROM plugin_names n WHERE n.digest = p.digest)) listed \
                 ORDER BY name IS NULL, name, seq DESC, created_at DESC",
                &[],
            )
            .await?;
        rows.iter().map(row_to_plugin).collect()
    }

    async fn plugin_resolve(&self, plugin: PluginRef) -> Result<Option<PluginInfo>, StoreError> {
        let operation = "resolving a plugin";
        let rows = match plugin {
            PluginRef::Digest(digest) => {
                self.read(
                    operation,
                    "SELECT n.name, n.version, p.digest, p.size_bytes, COALESCE(n.created_at, p.created_at), \
                     n.grants_json, n.approval_json, p.requests_json \
                     FROM plugins p LEFT JOIN plugin_names n ON n.digest = p.digest \
                     WHERE p.digest = $1 ORDER BY n.seq DESC NULLS LAST LIMIT 1",
                    &[&digest.to_string()],
                )
                .await?
            }
            PluginRef::Name(name) => {
                self.read(
                    operation,
                    "SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json, \
                     p.requests_json FROM plugin_names n JOIN plugins p ON p.digest = n.digest WHERE n.name = $1 \
                     ORDER BY n.seq DESC LIMIT 1",
                    &[&name],
                )
                .await?
            }
            PluginRef::Version(v) => {
                self.read(
                    operation,
                    "SELECT n.name, n.version, n.digest, p.size_bytes, n.created_at, n.grants_json, n.approval_json, \
                     p.requests_json FROM plugin_names n JOIN plugins p ON p.digest = n.digest \
                     WHERE n.name = $1 AND n.version = $2",
                    &[&v.name, &v.version],
                )
                .await?
            }
        };
        rows.first().map(row_to_plugin).transpose()
    }
}

impl PostgresStore {
    /// Replace one JSON column of a registration and audit the change with
    /// what it held before; `false`: no such registration.
    async fn set_registration_column(&self, change: RegistrationChange) -> Result<bool, StoreError> {
        let err = db_err("changing a plugin registration");
        let mut client = self.client("changing a plugin registration").await?;
        let tx = client.transaction().await.map_err(&err)?;
        let (name, column) = (&change.name, change.column);
        let before = tx
            .query_opt(
                &format!("SELECT {column} FROM plugin_names WHERE name = $1 AND version = $2 FOR UPDATE"),
                &[&name.name, &name.version],
            )
            .await
            .map_err(&err)?;
        let Some(before) = before else { return Ok(false) };
        let before: Option<String> = before.get(0);
        tx.execute(
            &format!("UPDATE plugin_names SET {column} = $3 WHERE name = $1 AND version = $2"),
            &[&name.name, &name.version, &change.value],
        )
        .await
        .map_err(&err)?;
        super::audit::append(&tx, &change.note(before.as_deref()), change.now).await?;
        tx.commit().await.map_err(&err)?;
        Ok(true)
    }
}
