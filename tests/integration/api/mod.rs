//! The HTTP API and the dashboard against a real `leash serve`.

mod access;
mod approval;
pub(crate) mod duties;
mod events;
mod flow;
mod http;
pub(crate) mod plans;
mod proposals;
mod redrive;
mod rules;
mod schedules;
mod triage;
mod ui;
mod why;
