//! The `leash` binary as a user runs it.

mod audit;
mod config;
pub(crate) mod ops;
mod run;
mod scaffold;
