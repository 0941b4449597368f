//! Why a store call failed.

use crate::job::JobId;

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed an operation.
    #[error("database error during {operation}: {source}")]
    Database {
        /// What was being done.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Worth retrying (busy, locked).
        transient: bool,
    },
    /// A stored row could not be read back.
    #[error("corrupt job row {id}: {detail}")]
    Corrupt {
        /// The row's id.
        id: String,
        /// What was wrong.
        detail: String,
    },
    /// The input was refused before touching the database.
    #[error("invalid job: {0}")]
    Invalid(String),
    /// The database's location or one of its settings is invalid.
    #[error("{0}")]
    Config(String),
    /// The store's writer has stopped.
    #[error("the job store is closed")]
    Closed,
    /// A name (of a schedule) is taken: nothing was stored.
    #[error("{0} already exists")]
    NameTaken(String),
    /// An insert carried an idempotency key a stored job already has.
    /// Nothing was inserted.
    #[error("idempotency key {key:?} already belongs to job {job}")]
    IdempotencyKeyTaken {
        /// The key.
        key: String,
        /// The job that has it.
        job: JobId,
        /// Whether that job was created by the same request (same digest).
        same_request: bool,
    },
}

impl StoreError {
    /// True when retrying the same call may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Database { transient: true, .. })
    }
}
