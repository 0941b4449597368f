//! Compiled code shared between processes: a sandbox that never compiled a
//! plugin reads the code another compiled, checked; damaged code and
//! another engine's are misses, never loaded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leash::job::{Digest, JobStatus, PluginRef, Target};
use leash::runtime::{PluginSource, Runtime, Submit};
use leash::sandbox::{Compiler, Sandbox, SandboxConfig, SharedCode};

use crate::support::{self, GENEROUS, assert_hello_still_runs, eventually_blocking};

/// Shared code kept in memory, as a store keeps it.
#[derive(Debug, Default)]
struct Shelf(Mutex<HashMap<(Digest, String), Vec<u8>>>);

impl SharedCode for Shelf {
    fn get(&self, digest: Digest, engine: &str) -> Option<Vec<u8>> {
        self.0.lock().unwrap().get(&(digest, engine.to_owned())).cloned()
    }

    fn put(&self, digest: Digest, engine: &str, code: Vec<u8>) {
        self.0.lock().unwrap().insert((digest, engine.to_owned()), code);
    }
}

impl Shelf {
    /// The one entry kept, once the sharing thread has written it.
    fn only_entry(&self) -> ((Digest, String), Vec<u8>) {
        eventually_blocking("the compiled code is shared", || {
            let kept = self.0.lock().unwrap();
            (kept.len() == 1).then(|| kept.iter().next().map(|(k, v)| (k.clone(), v.clone())).unwrap())
        })
    }
}

/// A process's sandbox: its own fresh cache folder, `shelf` shared.
fn process(shelf: &Arc<Shelf>, compiler: Compiler) -> (Sandbox, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let config = SandboxConfig {
        compiler,
        cache_dir: Some(cache.path().to_owned()),
        shared_code: Some(shelf.clone()),
        ..support::sandbox_config()
    };
    (Sandbox::new(config).unwrap(), cache)
}

#[tokio::test]
async fn a_process_that_never_compiled_a_plugin_reads_its_code_from_the_store() {
    let shelf = Arc::new(Shelf::default());
    let hello = leash_tests::plugin_bytes("hello");
    let (first, _cache) = process(&shelf, Compiler::Cranelift);
    assert!(!first.load(&hello).unwrap().loaded().fetched);
    shelf.only_entry();

    let (second, second_cache) = process(&shelf, Compiler::Cranelift);
    let loaded = second.load(&hello).unwrap().loaded();
    assert!(loaded.fetched && !loaded.from_cache, "{loaded:?}");
    assert_eq!(loaded.how(), "fetched compiled from the store");
    assert_hello_still_runs(&second).await;
    // What it fetched is in its own cache now (written behind the load).
    eventually_blocking("the fetched code is in the compile cache", || {
        let entries = std::fs::read_dir(second_cache.path()).ok()?.flatten();
        let folders = entries.filter_map(|e| std::fs::read_dir(e.path()).ok());
        folders.flatten().flatten().any(|f| f.path().extension().is_some_and(|x| x == "cwasm")).then_some(())
    });
    let alone = Arc::new(Shelf::default());
    let config = SandboxConfig {
        compiler: Compiler::Cranelift,
        cache_dir: Some(second_cache.path().to_owned()),
        shared_code: Some(alone),
        ..support::sandbox_config()
    };
    assert!(Sandbox::new(config).unwrap().load(&hello).unwrap().loaded().from_cache);
}

#[test]
fn damaged_shared_code_is_a_miss_and_is_replaced() {
    let shelf = Arc::new(Shelf::default());
    let hello = leash_tests::plugin_bytes("hello");
    process(&shelf, Compiler::Cranelift).0.load(&hello).unwrap();
    let (key, sound) = shelf.only_entry();
    let mut damaged = sound.clone();
    damaged[sound.len() / 2] ^= 0x40;
    shelf.put(key.0, &key.1, damaged.clone());

    let loaded = process(&shelf, Compiler::Cranelift).0.load(&hello).unwrap().loaded();
    assert!(!loaded.fetched && !loaded.from_cache, "damaged code is compiled again: {loaded:?}");
    eventually_blocking("the damaged code is replaced", || (shelf.get(key.0, &key.1)? != damaged).then_some(()));
    assert!(process(&shelf, Compiler::Cranelift).0.load(&hello).unwrap().loaded().fetched);
}

#[test]
fn another_engines_code_is_never_loaded() {
    let hello = leash_tests::plugin_bytes("hello");
    // Winch's code, sealed sound, put where Cranelift's would be.
    let winch = Arc::new(Shelf::default());
    process(&winch, Compiler::Winch).0.load(&hello).unwrap();
    let (_, foreign) = winch.only_entry();
    let cranelift = Arc::new(Shelf::default());
    process(&cranelift, Compiler::Cranelift).0.load(&hello).unwrap();
    let (key, _) = cranelift.only_entry();
    assert_ne!(winch.only_entry().0.1, key.1, "each engine has its own key");
    cranelift.put(key.0, &key.1, foreign);

    let (sandbox, _cache) = process(&cranelift, Compiler::Cranelift);
    let loaded = sandbox.load(&hello).unwrap().loaded();
    assert!(!loaded.fetched, "{loaded:?}");
}

/// `plugins add` through one runtime, then a worker runtime with an empty
/// compile cache (another machine) on the same store runs a job of it:
/// how that worker's first job got the plugin ready.
async fn worker_after_add(database: &str, bound: Option<u64>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let runtime = |cache: &str| {
        let mut builder = Runtime::builder(database)
            .sandbox(SandboxConfig { cache_dir: Some(dir.path().join(cache)), ..support::sandbox_config() })
            .poll_interval(Duration::from_millis(20));
        if let Some(bound) = bound {
            builder = builder.shared_code_bytes(bound);
        }
        builder.build()
    };
    let adder = runtime("adder-cache").await.unwrap();
    let digest = adder.plugin_add(leash_tests::plugin_bytes("hello")).await.unwrap();
    adder.shutdown().await;

    let worker = runtime("worker-cache").await.unwrap();
    let submit =
        Submit::new(PluginSource::Ref(PluginRef::Digest(digest)), Target::Execute, br#"{"name":"Ada"}"#.to_vec());
    let id = worker.submit(submit).await.unwrap();
    assert_eq!(worker.wait(id, GENEROUS).await.unwrap().status, JobStatus::Succeeded);
    let logs = worker.logs(id).await.unwrap();
    worker.shutdown().await;
    logs.records[0].message.clone()
}

const FETCHED: &str = "while its plugin was fetched compiled from the store";

/// On PostgreSQL a fleet shares compiled code unless told not to.
#[tokio::test]
async fn a_new_worker_on_postgres_runs_a_plugin_added_elsewhere_without_compiling_it() {
    let Some(base) = leash_tests::pg::url() else { return };
    let schema = leash_tests::pg::Schema::create(&base).await;
    let said = worker_after_add(&schema.url, None).await;
    assert!(said.contains(FETCHED), "{said}");
    let schema = leash_tests::pg::Schema::create(&base).await;
    let said = worker_after_add(&schema.url, Some(0)).await;
    assert!(said.contains("while its plugin was compiled"), "{said}");
}

/// On SQLite the store keeps compiled code only when told to.
#[tokio::test]
async fn on_sqlite_compiled_code_is_shared_through_the_store_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("jobs.db").to_string_lossy().into_owned();
    let said = worker_after_add(&database, None).await;
    assert!(said.contains("while its plugin was compiled"), "{said}");
    let database = dir.path().join("shared.db").to_string_lossy().into_owned();
    let said = worker_after_add(&database, Some(leash::runtime::DEFAULT_SHARED_CODE_BYTES)).await;
    assert!(said.contains(FETCHED), "{said}");
}
