//! The store: one conformance suite for every backend, the lease-model
//! replays, SQLite's and PostgreSQL's own cases.

pub(crate) mod conformance;
mod lease_model;
mod postgres;
mod sqlite;
