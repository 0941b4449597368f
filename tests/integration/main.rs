//! leash's integration tests: the real plugins in `plugins/`, built from
//! source by the `leash-tests` crate, run through the sandbox and through
//! the `leash` binary.

mod approval;
mod approval_chaos;
mod chaos;
mod cli_config;
mod cli_ops;
mod cli_run;
mod conformance;
mod crash;
mod effect_chaos;
mod egress;
mod events;
mod faults;
mod hostile;
mod http;
mod layout;
mod lease_model;
mod pg;
mod plans;
mod polyglot;
mod postgres;
mod runtime;
mod sandbox;
mod scaffold;
mod server;
mod store;
mod supervised;
mod support;
mod ui;
mod webdriver;
