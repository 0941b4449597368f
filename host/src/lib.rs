//! leash: durable, leased jobs inside WebAssembly sandboxes.
//!
//! - [`job`], [`clock`]: the shared words (targets, error kinds, plugin
//!   digests, timestamps, injected time); they depend on nothing inside.
//! - [`store`]: the durable job store seam and its SQLite backend; knows
//!   nothing of wasm.
//! - [`sandbox`]: runs one plugin as a wasmtime component under enforced
//!   limits; knows nothing of storage.
//! - [`cli`]: the `leash` command line.

pub mod cli;
pub mod clock;
pub mod job;
pub mod sandbox;
pub mod store;
