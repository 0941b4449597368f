//! Test support shared by leash's integration tests and benchmarks: the
//! built Rust plugin components (see `build.rs`), the Python and
//! JavaScript example plugins ([`polyglot`], built on first use) and small
//! helpers.

pub mod polyglot;

use std::io::Write;
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

/// The PostgreSQL server the tests use (`LEASH_TEST_POSTGRES`, a
/// `postgres://` URL of a database they may create schemas in), or `None`
/// after saying on stderr that the calling test is skipped and why. With
/// `CI` set, an unset variable panics instead, so CI never skips them.
pub fn postgres_url() -> Option<String> {
    match std::env::var("LEASH_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI is set but LEASH_TEST_POSTGRES is not: the PostgreSQL tests must not be skipped in CI")
        }
        _ => {
            // Straight to the process's stderr: the test harness captures
            // `eprintln!` of a passing test, and this must be seen.
            let test = std::thread::current().name().unwrap_or("a PostgreSQL test").to_owned();
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: it needs PostgreSQL; set LEASH_TEST_POSTGRES=postgres://USER@HOST:PORT/DATABASE \
                 (a database it may create schemas in) to run it"
            );
            None
        }
    }
}
