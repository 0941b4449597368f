//! Plugins: stored bytes by digest, registered names, grants and
//! approval policies.

use crate::clock::Timestamp;
use crate::job::{ApprovalPolicy, Digest, Grants, PluginName};

/// Parameters of [`JobStore::plugin_name_set`](super::JobStore::plugin_name_set).
#[derive(Debug, Clone)]
pub struct PluginNameParams {
    /// The name and version; an existing pair is pointed at the new digest
    /// and keeps its grants.
    pub name: PluginName,
    /// A digest already stored with [`JobStore::plugin_put`](super::JobStore::plugin_put).
    pub digest: Digest,
    /// Which targets wait for approval, set with the name in one step (no
    /// job can slip in between ungated); `None` keeps what a replaced pair
    /// had (nothing, for a new pair).
    pub policy: Option<ApprovalPolicy>,
    /// Now.
    pub now: Timestamp,
}

/// Parameters of [`JobStore::plugin_grants_set`](super::JobStore::plugin_grants_set).
#[derive(Debug, Clone)]
pub struct PluginGrantsParams {
    /// A registered name and version.
    pub name: PluginName,
    /// What jobs submitted under it from now on may use (replacing what
    /// it had; jobs already submitted keep theirs).
    pub grants: Grants,
}

/// Parameters of [`JobStore::plugin_policy_set`](super::JobStore::plugin_policy_set).
#[derive(Debug, Clone)]
pub struct PluginPolicyParams {
    /// A registered name and version.
    pub name: PluginName,
    /// Which targets of jobs submitted under it from now on wait for
    /// approval (replacing what it had; jobs already submitted keep their
    /// state).
    pub policy: ApprovalPolicy,
}

/// Parameters of [`JobStore::plugin_put`](super::JobStore::plugin_put).
#[derive(Debug, Clone)]
pub struct PluginPutParams {
    /// The component bytes.
    pub bytes: Vec<u8>,
    /// Now.
    pub now: Timestamp,
}
