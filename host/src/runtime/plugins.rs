//! Plugins: validate, precompile, store, name, grant, resolve.

use std::sync::Arc;

use crate::job::grant::Requests;
use crate::job::{ApprovalPolicy, Digest, Grants, PluginInfo, PluginName, PluginRef};
use crate::sandbox::{self, SandboxError};
use crate::store::{PluginGrantsParams, PluginNameParams, PluginPutParams};

use super::{Runtime, RuntimeError};

/// What a component declares it asks for; a declaration that does not
/// parse makes the plugin invalid.
pub(super) fn declaration(bytes: &[u8]) -> Result<Option<Arc<Requests>>, RuntimeError> {
    let declared = sandbox::declared_requests(bytes)
        .map_err(|e| RuntimeError::InvalidPlugin(SandboxError::InvalidComponent(e)))?;
    Ok(declared.map(Arc::new))
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
        let info = self.inner.store.plugin_name_set(PluginNameParams { name, digest, policy, now }).await?;
        self.with_requests(info).await
    }

    /// `info` with what its component declares.
    pub(super) async fn with_requests(&self, mut info: PluginInfo) -> Result<PluginInfo, RuntimeError> {
        info.requests = self.declared(info.digest).await?.map(|r| r.as_ref().clone());
        Ok(info)
    }

    /// What the component `digest` declares it asks for, read from its
    /// bytes once per process.
    async fn declared(&self, digest: Digest) -> Result<Option<Arc<Requests>>, RuntimeError> {
        if let Some(known) = self.inner.declared.lock().unwrap_or_else(|e| e.into_inner()).get(&digest) {
            return Ok(known.clone());
        }
        let bytes = self
            .inner
            .store
            .plugin_get(digest)
            .await?
            .ok_or_else(|| RuntimeError::UnknownPlugin(digest.to_string()))?;
        let requests = declaration(&bytes)?;
        self.inner.declared.lock().unwrap_or_else(|e| e.into_inner()).insert(digest, requests.clone());
        Ok(requests)
    }

    /// Replace what jobs of a registered `name@version` may use outside
    /// their sandbox (jobs already submitted keep what they were granted).
    pub async fn plugin_grant(&self, name: PluginName, grants: Grants) -> Result<PluginInfo, RuntimeError> {
        grants.check().map_err(RuntimeError::InvalidGrant)?;
        let shown = name.to_string();
        let info = self
            .inner
            .store
            .plugin_grants_set(PluginGrantsParams { name, grants })
            .await?
            .ok_or(RuntimeError::UnknownPlugin(shown))?;
        self.with_requests(info).await
    }

    /// Registered plugins: names in order (newest version first), then
    /// unnamed digests.
    pub async fn plugins(&self) -> Result<Vec<PluginInfo>, RuntimeError> {
        let mut listed = Vec::new();
        for info in self.inner.store.plugin_list().await? {
            listed.push(self.with_requests(info).await?);
        }
        Ok(listed)
    }

    /// Resolve a plugin reference.
    pub async fn plugin(&self, plugin: PluginRef) -> Result<PluginInfo, RuntimeError> {
        let shown = plugin.to_string();
        let info = self.inner.store.plugin_resolve(plugin).await?.ok_or(RuntimeError::UnknownPlugin(shown))?;
        self.with_requests(info).await
    }

    /// Validate, precompile and store a plugin; returns its digest.
    pub async fn plugin_add(&self, bytes: Vec<u8>) -> Result<Digest, RuntimeError> {
        let bytes = Arc::new(bytes);
        self.inner.sandbox.compile(bytes.clone()).await.map_err(RuntimeError::InvalidPlugin)?;
        // A declaration that does not parse is refused with the plugin; one
        // that does is kept, so the first job by name need not read it back.
        let declared = declaration(&bytes)?;
        // The compile's share is dropped once it returns: no copy is made.
        let bytes = Arc::try_unwrap(bytes).unwrap_or_else(|shared| shared.as_ref().clone());
        let now = self.inner.settings.clock.now();
        let digest = self.inner.store.plugin_put(PluginPutParams { bytes, now }).await?;
        self.inner.known_plugins.lock().unwrap_or_else(|e| e.into_inner()).insert(digest);
        self.inner.declared.lock().unwrap_or_else(|e| e.into_inner()).insert(digest, declared);
        Ok(digest)
    }
}
