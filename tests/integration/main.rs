//! leash's integration tests: the real plugins in `plugins/`, built from
//! source by the `leash-tests` crate, run through the sandbox and through
//! the `leash` binary.

mod api;
mod chaos;
mod cli;
mod layout;
mod runtime;
mod sandbox;
mod store;
mod support;
