//! leash: durable, leased jobs inside WebAssembly sandboxes.
//!
//! The modules stand on floors: each uses only modules on the floors below
//! its own, never one beside or above it (`tests/integration/layout.rs`
//! checks it, with no import circles inside a module either).
//!
//! 0. [`clock`]: timestamps and injected time. Uses nothing inside.
//! 1. [`job`]: the shared words (targets, error kinds, digests, grants, the
//!    job record); [`config`]: the config file's settings; [`access`]:
//!    principals, roles and tokens.
//! 2. [`store`]: the durable job store seam, its SQLite and PostgreSQL
//!    backends; knows nothing of wasm. [`sandbox`]: runs one plugin as a
//!    wasmtime component under enforced limits; knows nothing of storage.
//!    [`metrics`]: the Prometheus registry.
//! 3. [`worker`]: the pool: claiming, running, recording, shutdown; its
//!    [`worker::lease`] renews a running job's lease.
//! 4. [`runtime`]: the embedding API built from all of the above; its
//!    [`runtime::sweep`] reclaims, expires and deletes.
//! 5. [`api`]: the HTTP API and dashboard over a runtime.
//! 6. [`client`]: the API's client, over the network or in process.
//! 7. [`cli`]: the `leash` command line.

pub mod access;
pub mod api;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod job;
pub mod metrics;
pub mod runtime;
pub mod sandbox;
pub mod store;
pub mod worker;
