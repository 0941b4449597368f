//! Why an attempt never ran its guest: leash's own trouble, told apart
//! from anything the guest did.

use crate::job::ErrorKind;

/// A job that ended before its guest could run, or whose plugin could not
/// be loaded.
#[derive(Debug)]
pub(super) struct HostFailure {
    pub(super) kind: ErrorKind,
    pub(super) message: String,
    /// Trying again later may work (a transient store error): the job is
    /// released after a pause, spending no attempt, since nothing ran.
    pub(super) retryable: bool,
}

impl HostFailure {
    pub(super) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        HostFailure { kind, message: message.into(), retryable: false }
    }
}
