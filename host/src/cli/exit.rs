//! What `leash` exits with, and the failures that earn each status.

use crate::job::ErrorKind;

/// What `leash` exits with. The numbers are part of the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitStatus {
    /// The job succeeded.
    Success = 0,
    /// The plugin returned `failed` or `retryable`.
    GuestError = 1,
    /// Bad arguments, an unusable component, or input the plugin rejected.
    Usage = 2,
    /// The job ran past its timeout.
    Timeout = 3,
    /// The job was cancelled (or rejected while it waited for approval).
    Cancelled = 4,
    /// Fuel, memory or output limit.
    ResourceLimit = 5,
    /// The plugin trapped.
    Trap = 6,
    /// The server refused the request (token, conflict, backpressure), the
    /// host refused the job's effects (`denied`), or a request's rate slot
    /// came after the job's deadline (`rate_limited`).
    Refused = 7,
    /// The server could not be reached.
    Unreachable = 8,
    /// Two processes died while running the job: it is quarantined.
    HostCrash = 9,
    /// `leash audit verify` found the audit chain broken.
    AuditBroken = 10,
    /// leash failed.
    Internal = 70,
}

impl ExitStatus {
    /// The exit status for a failure of `kind`.
    pub fn for_kind(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::GuestError => ExitStatus::GuestError,
            ErrorKind::InvalidInput => ExitStatus::Usage,
            ErrorKind::Timeout => ExitStatus::Timeout,
            ErrorKind::Cancelled | ErrorKind::Rejected => ExitStatus::Cancelled,
            ErrorKind::OutOfFuel | ErrorKind::MemoryLimit | ErrorKind::OutputLimit | ErrorKind::ResourceLimit => {
                ExitStatus::ResourceLimit
            }
            ErrorKind::Trap => ExitStatus::Trap,
            ErrorKind::HostCrash => ExitStatus::HostCrash,
            ErrorKind::Denied | ErrorKind::RateLimited => ExitStatus::Refused,
            ErrorKind::LeaseLost | ErrorKind::Expired | ErrorKind::Interrupted | ErrorKind::HostError => {
                ExitStatus::Internal
            }
        }
    }
}

/// A failure before the job ran, with the exit status it earns.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    /// One line for people.
    pub message: String,
    /// What to exit with.
    pub status: ExitStatus,
}

impl CliError {
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        CliError { message: message.into(), status: ExitStatus::Usage }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        CliError { message: message.into(), status: ExitStatus::Internal }
    }
}

pub(super) const EXIT_CODES_HELP: &str = "\
Exit codes:
  0   the job succeeded
  1   the plugin returned an error (failed or retryable)
  2   usage error, unreadable or invalid component, or input the plugin rejected
  3   the job ran past its timeout, or a --wait ended before the job did
  4   the job was cancelled, or rejected while it waited for approval
  5   a resource limit stopped the job (fuel, memory, output or a counted resource)
  6   the plugin trapped (panic, stack overflow, bad memory access)
  7   the server refused: bad token (401), approval policy (403), job already ended
      or decided (409), queue full (429); or the host refused a plan's apply phase
      (denied: its approved effects no longer granted, or its plan changed), or a
      request's rate slot came after the job's deadline (rate_limited)
  8   the server could not be reached
  9   the job was quarantined: two processes died while running it (host_crash)
  10  leash audit verify: the audit chain is broken (a row edited, removed or added by hand)
  70  leash itself failed";
