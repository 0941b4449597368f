//! Compiled code kept for the next load: on disk in the process's cache
//! folder, and through [`SharedCode`] (the store) for other processes.
//!
//! Disk entries live at `<dir>/<engine key>/<plugin digest>.cwasm`, where
//! the engine key is a hash of `Engine::precompile_compatibility_hash` (so
//! a different wasmtime or engine configuration never reads another's
//! code). Code is kept *sealed*: the serialized artifact followed by the
//! sha256 of it. Sealed code that is truncated, corrupt or stale is a miss,
//! recompiled and rewritten, never an error, and never loaded unchecked.

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::job::Digest;

const CHECKSUM_BYTES: usize = 32;

/// Where compiled code is shared between processes: a runtime hands the
/// sandbox its store's (`plugin_code` in either backend), so a worker that
/// never compiled a plugin reads the code another compiled. The code is
/// sealed; the sandbox checks it and asks wasmtime to check it is this
/// engine's before loading it.
///
/// Called on compile threads, never from async code. Best effort both
/// ways: a failure is a miss.
pub trait SharedCode: Send + Sync + fmt::Debug {
    /// Sealed code compiled for `digest` by the engine whose key is `engine`.
    fn get(&self, digest: Digest, engine: &str) -> Option<Vec<u8>>;
    /// Keep sealed code for other processes.
    fn put(&self, digest: Digest, engine: &str, code: Vec<u8>);
}

/// The key of `engine`'s code: engines with equal keys run each other's
/// compiled code.
pub(crate) fn engine_key(engine: &Engine) -> String {
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// `component` serialized and sealed with its checksum.
pub(crate) fn seal(component: &Component) -> Option<Vec<u8>> {
    let mut bytes = component.serialize().ok()?;
    let checksum = Sha256::digest(&bytes);
    bytes.extend_from_slice(&checksum);
    Some(bytes)
}

/// The component in `sealed`, if its checksum holds and wasmtime takes it
/// as `engine`'s.
pub(crate) fn open(engine: &Engine, sealed: &[u8]) -> Option<Component> {
    let (body, checksum) = sealed.split_at_checked(sealed.len().checked_sub(CHECKSUM_BYTES)?)?;
    if Sha256::digest(body).as_slice() != checksum {
        return None;
    }
    // SAFETY: `body` is what `seal` took from `Component::serialize`, for an
    // engine with this key, and its checksum matches, so it is the artifact
    // wasmtime produced, unaltered; wasmtime checks its version and
    // configuration again before it maps it.
    unsafe { Component::deserialize(engine, body) }.ok()
}

/// A directory of compiled components for one engine configuration.
#[derive(Debug, Clone)]
pub(crate) struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    pub(crate) fn new(root: &Path, engine: &Engine) -> Self {
        CompileCache { dir: root.join(engine_key(engine)) }
    }

    /// The folder of this engine configuration's entries.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.cwasm", digest.hex()))
    }

    /// The cached component for `digest`, if a sound entry exists.
    pub(crate) fn get(&self, engine: &Engine, digest: &Digest) -> Option<Component> {
        open(engine, &self.read(digest)?)
    }

    /// The sealed code kept for `digest`, unchecked.
    pub(crate) fn read(&self, digest: &Digest) -> Option<Vec<u8>> {
        std::fs::read(self.entry(digest)).ok()
    }

    /// Store `component` for `digest`. Best effort: a cache that cannot be
    /// written only costs a recompile next time.
    pub(crate) fn put(&self, digest: &Digest, component: &Component) {
        if let Some(sealed) = seal(component) {
            self.write(digest, &sealed);
        }
    }

    /// Store sealed code for `digest`, best effort.
    pub(crate) fn write(&self, digest: &Digest, sealed: &[u8]) {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
            tmp.write_all(sealed)?;
            tmp.persist(self.entry(digest))?;
            Ok(())
        };
        let _ = write();
    }
}
