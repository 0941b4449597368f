//! The decisions both backends share, with no SQL in them: each backend
//! reads the rows a decision needs, asks a rule here what changes, and
//! writes that in its own dialect (the SQL both spell alike is in
//! [`sql`](super::sql)).
//!
//! - [`approval`]: what a decision on a gated job changes.
//! - [`audit`]: the audit chain's hashes and its check.
//! - [`plan`]: the apply job a plan's succeeded execute job leads to.
//! - [`unfinished`]: what becomes of an attempt that ended without a
//!   result (lease lost, process died, released).
//! - [`codec`]: how a job's values are stored in columns and read back.
//! - [`schedule`]: how a schedule is stored in columns and read back.

pub(crate) mod approval;
pub mod audit;
pub(crate) mod codec;
pub(crate) mod events;
pub(crate) mod plan;
pub(crate) mod schedule;
pub(crate) mod unfinished;
