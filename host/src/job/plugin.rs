//! How plugins are named: registry names and versions, references by
//! digest, name or `name@version`, and what the registry holds.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{ApprovalPolicy, Digest, Grants};
use crate::clock::Timestamp;

/// A plugin's registry name and version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PluginName {
    /// Name: lowercase letters, digits, `-` and `_`, 1–64 characters.
    pub name: String,
    /// Version: letters, digits, `.`, `-`, `_` and `+`, 1–64 characters.
    pub version: String,
}

impl PluginName {
    /// A checked name and version.
    pub fn new(name: &str, version: &str) -> Result<Self, String> {
        check_plugin_name(name)?;
        check_plugin_version(version)?;
        Ok(PluginName { name: name.to_owned(), version: version.to_owned() })
    }
}

impl fmt::Display for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

/// Default version of a plugin added without one.
pub const DEFAULT_PLUGIN_VERSION: &str = "0.0.0";

fn check_plugin_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid plugin name {name:?}: use 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit"
        ))
    }
}

fn check_plugin_version(version: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&version.len())
        && version.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'));
    if ok {
        Ok(())
    } else {
        Err(format!("invalid plugin version {version:?}: use 1-64 letters, digits, '.', '-', '_' or '+'"))
    }
}

/// How a job or a request names a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginRef {
    /// By content digest (64 hex digits, optionally `sha256:`-prefixed).
    Digest(Digest),
    /// By name: the most recently registered version.
    Name(String),
    /// By `name@version`.
    Version(PluginName),
}

impl FromStr for PluginRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s.strip_prefix("sha256:").unwrap_or(s);
        if hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return hex.parse().map(PluginRef::Digest);
        }
        match s.split_once('@') {
            Some((name, version)) => PluginName::new(name, version).map(PluginRef::Version),
            None => check_plugin_name(s).map(|()| PluginRef::Name(s.to_owned())),
        }
    }
}

impl fmt::Display for PluginRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginRef::Digest(d) => write!(f, "{d}"),
            PluginRef::Name(n) => f.write_str(n),
            PluginRef::Version(v) => write!(f, "{v}"),
        }
    }
}

/// A registered plugin: its digest and, if it has one, its name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    /// Name and version; `None` for bytes submitted without a name.
    #[serde(flatten)]
    pub name: Option<PluginName>,
    /// Content digest (sha256).
    pub digest: Digest,
    /// Size of the component, bytes.
    pub size_bytes: u64,
    /// When the name (or, unnamed, the bytes) was registered.
    pub created_at: Timestamp,
    /// What the operator grants jobs of this name and version; absent when
    /// nothing is granted (always, for bytes stored without a name).
    #[serde(default, skip_serializing_if = "Grants::is_none")]
    pub grants: Grants,
    /// Which targets of jobs submitted under this name and version wait for
    /// approval; absent when none do.
    #[serde(default, skip_serializing_if = "ApprovalPolicy::is_none")]
    pub approval: ApprovalPolicy,
    /// What the component declares it asks for (its `leash:requests`
    /// section), if it declares anything: a job then gets only what is
    /// both declared and granted. Read from the component once, when it is
    /// stored, and kept with its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<crate::job::grant::Requests>,
}
