//! leash: durable, leased jobs inside WebAssembly sandboxes.
//!
//! - [`job`], [`clock`]: the shared words (targets, error kinds, plugin
//!   digests, timestamps, injected time); they depend on nothing inside.
//! - [`store`]: the durable job store seam and its SQLite backend; knows
//!   nothing of wasm.
//! - [`sandbox`]: runs one plugin as a wasmtime component under enforced
//!   limits; knows nothing of storage.
//! - [`lease`], [`worker`], [`sweep`]: claiming, lease renewal, the worker
//!   pool, shutdown, and the reclaim/expiry/retention sweeps.
//! - [`runtime`]: the embedding API built from all of the above.
//! - [`cli`], [`config`]: the `leash` command line and its config file.

pub mod api;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod job;
pub mod lease;
pub mod metrics;
pub mod runtime;
pub mod sandbox;
pub mod store;
pub mod sweep;
pub mod worker;
