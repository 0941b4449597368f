//! Plugins: stored bytes by digest, registered names, grants and
//! approval policies.

use crate::clock::Timestamp;
use crate::job::grant::Requests;
use crate::job::{ApprovalPolicy, Digest, Grants, PluginInfo, PluginName, PluginRef};
use crate::store::StoreError;

/// Parameters of [`Plugins::plugin_name_set`].
#[derive(Debug, Clone)]
pub struct PluginNameParams {
    /// The name and version; an existing pair is pointed at the new digest
    /// and keeps its grants.
    pub name: PluginName,
    /// A digest already stored with [`Plugins::plugin_put`].
    pub digest: Digest,
    /// Which targets wait for approval, set with the name in one step (no
    /// job can slip in between ungated); `None` keeps what a replaced pair
    /// had (nothing, for a new pair).
    pub policy: Option<ApprovalPolicy>,
    /// Who registers it, for the audit trail (`None`: the embedding code).
    pub actor: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Plugins::plugin_grants_set`].
#[derive(Debug, Clone)]
pub struct PluginGrantsParams {
    /// A registered name and version.
    pub name: PluginName,
    /// What jobs submitted under it from now on may use (replacing what
    /// it had; jobs already submitted keep theirs).
    pub grants: Grants,
    /// Who sets them, for the audit trail (`None`: the embedding code).
    pub actor: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Plugins::plugin_policy_set`].
#[derive(Debug, Clone)]
pub struct PluginPolicyParams {
    /// A registered name and version.
    pub name: PluginName,
    /// Which targets of jobs submitted under it from now on wait for
    /// approval (replacing what it had; jobs already submitted keep their
    /// state).
    pub policy: ApprovalPolicy,
    /// Who sets it, for the audit trail (`None`: the embedding code).
    pub actor: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Plugins::plugin_put`].
#[derive(Debug, Clone)]
pub struct PluginPutParams {
    /// The component bytes.
    pub bytes: Vec<u8>,
    /// What the component declares it asks for (its `leash:requests`
    /// section, read by the caller: the store knows nothing of wasm);
    /// `None` when it declares nothing. Kept with the bytes and read back
    /// on every [`PluginInfo`].
    pub requests: Option<Requests>,
    /// Who uploads them, for the audit trail: an upload is audited only
    /// when a principal makes it (bytes an embedder's submit stores are
    /// not).
    pub actor: Option<String>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`Plugins::plugin_code_put`].
#[derive(Debug, Clone)]
pub struct PluginCodePutParams {
    /// A stored plugin's digest.
    pub digest: Digest,
    /// Which engine configuration compiled it: code is only ever read back
    /// under the same key.
    pub engine: String,
    /// The compiled code, opaque to the store: whoever reads it checks it.
    pub code: Vec<u8>,
    /// Most bytes of compiled code kept in all, least recently used
    /// dropped first.
    pub bound: u64,
    /// Now.
    pub now: Timestamp,
}

/// Plugin bytes by digest, registered names, what each registration
/// grants and requires, and the compiled code of each digest, so a fleet
/// compiles a plugin once.
#[async_trait::async_trait]
pub trait Plugins: Send + Sync + std::fmt::Debug {
    /// Store plugin bytes and their declared requests under their digest
    /// (idempotent; a digest stored before declarations were kept gets
    /// them now); returns the digest.
    async fn plugin_put(&self, params: PluginPutParams) -> Result<Digest, StoreError>;

    /// Digests stored before their declared requests were kept with them
    /// (by an older leash): whoever can read a component puts each again
    /// with its requests. Empty once that is done.
    async fn plugins_undeclared(&self) -> Result<Vec<Digest>, StoreError>;

    /// The bytes of the plugin with `digest`.
    async fn plugin_get(&self, digest: Digest) -> Result<Option<Vec<u8>>, StoreError>;

    /// Point `name@version` at a stored digest (a new pair, or a
    /// replacement: jobs already queued keep the digest they were given).
    async fn plugin_name_set(&self, params: PluginNameParams) -> Result<PluginInfo, StoreError>;

    /// Replace the grants of a registered `name@version`; `None` if that
    /// pair is not registered.
    async fn plugin_grants_set(&self, params: PluginGrantsParams) -> Result<Option<PluginInfo>, StoreError>;

    /// Replace the approval policy of a registered `name@version`; `None`
    /// if that pair is not registered.
    async fn plugin_policy_set(&self, params: PluginPolicyParams) -> Result<Option<PluginInfo>, StoreError>;

    /// Every registered name in name order (each name's newest version
    /// first), then every stored digest that has no name.
    async fn plugin_list(&self) -> Result<Vec<PluginInfo>, StoreError>;

    /// The compiled code kept for `digest` under `engine`, marked used at
    /// `now`; `None` when none is kept.
    async fn plugin_code_get(
        &self,
        digest: Digest,
        engine: String,
        now: Timestamp,
    ) -> Result<Option<Vec<u8>>, StoreError>;

    /// Keep compiled code of a stored plugin (replacing what that digest
    /// and engine had), then drop the least recently used code until all
    /// of it fits in `bound`. `false`, keeping nothing, when the digest is
    /// not stored or the code alone is over the bound. The code goes when
    /// its plugin does.
    async fn plugin_code_put(&self, params: PluginCodePutParams) -> Result<bool, StoreError>;

    /// Resolve a reference: a name to its most recently registered version,
    /// `name@version` exactly, a digest to itself (with its newest name).
    async fn plugin_resolve(&self, plugin: PluginRef) -> Result<Option<PluginInfo>, StoreError>;
}
