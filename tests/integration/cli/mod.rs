//! The `leash` binary as a user runs it.

mod audit;
mod config;
mod dev;
pub(crate) mod ops;
mod rules;
mod run;
mod scaffold;
mod show;
mod shrink;
