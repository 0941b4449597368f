//! Compiled code shared through the store: a worker that never compiled a
//! plugin reads the code another process compiled (the sandbox checks it),
//! so a fleet compiles each plugin once.

use std::sync::Arc;

use crate::clock::Clock;
use crate::job::Digest;
use crate::sandbox::SharedCode;
use crate::store::{JobStore, PluginCodePutParams};

/// Default bound on the compiled code a PostgreSQL store keeps for every
/// process (an SQLite one keeps none unless told).
pub const DEFAULT_SHARED_CODE_BYTES: u64 = 2 << 30;

/// The store's `plugin_code`, for the sandbox's compile threads.
#[derive(Debug)]
pub(super) struct StoreCode {
    pub(super) store: Arc<dyn JobStore>,
    pub(super) clock: Arc<dyn Clock>,
    /// The async runtime the store's connections live on: the compile
    /// threads wait on it.
    pub(super) handle: tokio::runtime::Handle,
    pub(super) bound: u64,
}

impl StoreCode {
    /// Wait for `work` on the store's runtime from a thread of its own, so
    /// a caller inside an async context (a sync `Sandbox::load` from async
    /// code) blocks rather than panics.
    fn wait<T: Send>(&self, work: impl Future<Output = T> + Send) -> T {
        std::thread::scope(|scope| match scope.spawn(|| self.handle.block_on(work)).join() {
            Ok(done) => done,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    }
}

impl SharedCode for StoreCode {
    fn get(&self, digest: Digest, engine: &str) -> Option<Vec<u8>> {
        self.wait(self.store.plugin_code_get(digest, engine.to_owned(), self.clock.now()))
            .inspect_err(|e| tracing::warn!(error = %e, %digest, "cannot read compiled code from the store"))
            .ok()
            .flatten()
    }

    fn put(&self, digest: Digest, engine: &str, code: Vec<u8>) {
        let params =
            PluginCodePutParams { digest, engine: engine.to_owned(), code, bound: self.bound, now: self.clock.now() };
        if let Err(e) = self.wait(self.store.plugin_code_put(params)) {
            tracing::warn!(error = %e, %digest, "cannot keep compiled code in the store");
        }
    }
}
