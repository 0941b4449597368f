//! The sandbox: every plugin, hostile guests, granted egress, the
//! Python and JavaScript guests.

mod egress;
mod hostile;
mod names;
mod pacing;
mod plugins;
mod polyglot;
mod shared;
mod tiers;
