//! On-disk cache of compiled components.
//!
//! Entries live at `<dir>/<engine hash>/<plugin digest>.cwasm`, where the
//! engine hash is `Engine::precompile_compatibility_hash` (so a different
//! wasmtime or engine configuration never reads another's code). Each entry
//! ends with the sha256 of what precedes it: an entry that is truncated,
//! corrupt or stale is a miss, recompiled and rewritten, never an error.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::job::Digest;

const CHECKSUM_BYTES: usize = 32;

/// A directory of compiled components for one engine configuration.
#[derive(Debug, Clone)]
pub(crate) struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    pub(crate) fn new(root: &Path, engine: &Engine) -> Self {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        CompileCache { dir: root.join(format!("{:016x}", hasher.finish())) }
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
        let bytes = std::fs::read(self.entry(digest)).ok()?;
        let (body, checksum) = bytes.split_at_checked(bytes.len().checked_sub(CHECKSUM_BYTES)?)?;
        if Sha256::digest(body).as_slice() != checksum {
            return None;
        }
        // SAFETY: `body` was written by `put` from `Component::serialize` for
        // an engine with this compatibility hash, and its checksum matches,
        // so it is the artifact wasmtime produced, unaltered.
        unsafe { Component::deserialize(engine, body) }.ok()
    }

    /// Store `component` for `digest`. Best effort: a cache that cannot be
    /// written only costs a recompile next time.
    pub(crate) fn put(&self, digest: &Digest, component: &Component) {
        let Ok(mut bytes) = component.serialize() else { return };
        let checksum = Sha256::digest(&bytes);
        bytes.extend_from_slice(&checksum);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
            tmp.write_all(&bytes)?;
            tmp.persist(self.entry(digest))?;
            Ok(())
        };
        let _ = write();
    }
}
