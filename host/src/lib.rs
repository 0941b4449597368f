//! leash: durable, leased jobs inside WebAssembly sandboxes.
//!
//! - [`job`]: the shared words (targets, error kinds, plugin digests).
//! - [`sandbox`]: runs one plugin as a wasmtime component under enforced
//!   limits; knows nothing of storage.
//! - [`cli`]: the `leash` command line.

pub mod cli;
pub mod job;
pub mod sandbox;
