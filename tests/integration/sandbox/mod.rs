//! The sandbox: every plugin, hostile guests, granted egress, the
//! Python and JavaScript guests.

mod egress;
mod hostile;
mod plugins;
mod polyglot;
