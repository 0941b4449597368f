//! Plugins: validate, precompile, store, name, grant, resolve.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::job::grant::Requests;
use crate::job::{ApprovalPolicy, Digest, Grants, PluginInfo, PluginName, PluginRef};
use crate::sandbox::{self, SandboxError};
use crate::store::{JobStore, PluginGrantsParams, PluginNameParams, PluginPutParams};

use super::{Runtime, RuntimeError};

/// What a component declares it asks for; a declaration that does not
/// parse makes the plugin invalid.
fn declaration(bytes: &[u8]) -> Result<Option<Requests>, RuntimeError> {
    sandbox::declared_requests(bytes).map_err(|e| RuntimeError::InvalidPlugin(SandboxError::InvalidComponent(e)))
}

/// Keep with each plugin stored by an older leash what its component
/// declares (read from its bytes once; see
/// [`Plugins::plugins_undeclared`](crate::store::Plugins::plugins_undeclared)),
/// so every plugin is read whole from the store. A component whose
/// declaration does not parse is left as it was, and said.
///
/// This is the runtime's first use of a store just opened: a database
/// that goes down in between (restarting, shutting down) is waited out for
/// up to [`STARTUP_PATIENCE`], as opening waits for one not up yet, so a
/// server restarted during a database restart comes up with it.
pub(super) async fn declare_stored_plugins(store: &dyn JobStore, clock: &dyn Clock) -> Result<(), RuntimeError> {
    let started = tokio::time::Instant::now();
    loop {
        match declare_each(store, clock).await {
            Err(RuntimeError::Store(e)) if e.is_transient() && started.elapsed() < STARTUP_PATIENCE => {
                tracing::warn!(error = %e, "reading the stored plugins was cut off; trying again");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            done => return done,
        }
    }
}

/// How long a runtime starting up waits out a database that went away
/// just after the store opened.
const STARTUP_PATIENCE: Duration = Duration::from_secs(30);

async fn declare_each(store: &dyn JobStore, clock: &dyn Clock) -> Result<(), RuntimeError> {
    for digest in store.plugins_undeclared().await? {
        let Some(bytes) = store.plugin_get(digest).await? else { continue };
        let requests = match declaration(&bytes) {
            Ok(requests) => requests,
            Err(e) => {
                tracing::warn!(%digest, error = %e, "a stored plugin's declared requests do not parse");
                continue;
            }
        };
        store.plugin_put(PluginPutParams { bytes, requests, actor: None, now: clock.now() }).await?;
    }
    Ok(())
}

impl Runtime {
    /// Validate, precompile and store a plugin, and register it under
    /// `name@version` (replacing what that pair pointed at: jobs already
    /// queued keep their digest).
    pub async fn plugin_register(&self, bytes: Vec<u8>, name: PluginName) -> Result<PluginInfo, RuntimeError> {
        self.plugin_register_with(bytes, name, None).await
    }

    /// [`Runtime::plugin_register`] with an approval policy set in the same
    /// step, so no job is submitted under the name ungated in between
    /// (`None` keeps a replaced pair's policy).
    pub async fn plugin_register_with(
        &self,
        bytes: Vec<u8>,
        name: PluginName,
        policy: Option<ApprovalPolicy>,
    ) -> Result<PluginInfo, RuntimeError> {
        if let Some(policy) = &policy {
            policy.check().map_err(RuntimeError::InvalidJob)?;
        }
        let digest = self.plugin_add(bytes).await?;
        let now = self.inner.settings.clock.now();
        let info = self
            .inner
            .store
            .plugin_name_set(PluginNameParams { name, digest, policy, actor: self.actor(), now })
            .await?;
        Ok(info)
    }

    /// Replace what jobs of a registered `name@version` may use outside
    /// their sandbox (jobs already submitted keep what they were granted).
    pub async fn plugin_grant(&self, name: PluginName, grants: Grants) -> Result<PluginInfo, RuntimeError> {
        grants.check().map_err(RuntimeError::InvalidGrant)?;
        let shown = name.to_string();
        let info = self
            .inner
            .store
            .plugin_grants_set(PluginGrantsParams { name, grants, actor: self.actor(), now: self.now() })
            .await?
            .ok_or(RuntimeError::UnknownPlugin(shown))?;
        Ok(info)
    }

    /// Registered plugins: names in order (newest version first), then
    /// unnamed digests.
    pub async fn plugins(&self) -> Result<Vec<PluginInfo>, RuntimeError> {
        Ok(self.inner.store.plugin_list().await?)
    }

    /// Resolve a plugin reference.
    pub async fn plugin(&self, plugin: PluginRef) -> Result<PluginInfo, RuntimeError> {
        let shown = plugin.to_string();
        let info = self.inner.store.plugin_resolve(plugin).await?.ok_or(RuntimeError::UnknownPlugin(shown))?;
        Ok(info)
    }

    /// Validate, precompile and store a plugin; returns its digest.
    pub async fn plugin_add(&self, bytes: Vec<u8>) -> Result<Digest, RuntimeError> {
        let bytes = Arc::new(bytes);
        self.inner.sandbox.compile(bytes.clone()).await.map_err(RuntimeError::InvalidPlugin)?;
        // A declaration that does not parse is refused with the plugin; one
        // that does is stored with it.
        let requests = declaration(&bytes)?;
        // The compile's share is dropped once it returns: no copy is made.
        let bytes = Arc::try_unwrap(bytes).unwrap_or_else(|shared| shared.as_ref().clone());
        let now = self.inner.settings.clock.now();
        let digest = self.inner.store.plugin_put(PluginPutParams { bytes, requests, actor: self.actor(), now }).await?;
        // The compile shared its code before the plugin was stored, which
        // the store refuses: share it now, so every worker reads it.
        let sandbox = self.inner.sandbox.clone();
        let _ = tokio::task::spawn_blocking(move || sandbox.share(digest)).await;
        self.inner.known_plugins.lock().unwrap_or_else(|e| e.into_inner()).insert(digest);
        Ok(digest)
    }
}
