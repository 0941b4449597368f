//! Test support shared by leash's integration tests and benchmarks: the
//! built Rust plugin components (see `build.rs`), the Python and
//! JavaScript example plugins ([`polyglot`], built on first use) and small
//! helpers.

pub mod pg;
pub mod polyglot;

use std::path::PathBuf;

include!(concat!(env!("OUT_DIR"), "/plugins.rs"));

/// The path of the built component for plugin crate `name` (e.g. `"alloc-bomb"`).
///
/// # Panics
/// If no plugin of that name exists in `plugins/`.
pub fn plugin_path(name: &str) -> PathBuf {
    PLUGINS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, path)| PathBuf::from(path))
        .unwrap_or_else(|| panic!("no plugin named {name} in plugins/"))
}

/// The bytes of the built component for plugin crate `name`.
pub fn plugin_bytes(name: &str) -> Vec<u8> {
    let path = plugin_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}
