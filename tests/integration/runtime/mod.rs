//! The embedding API (`leash::runtime`) end to end.

mod ahead;
mod egress_limits;
mod embedding;
mod faults;
mod flow;
mod metrics;
mod postgres;
mod rates;
mod schedules;
mod why;
