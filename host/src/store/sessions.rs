//! Dashboard sessions ended before their expiry (signed out): a session
//! cookie carries its own proof and expiry, so the store keeps only the
//! ones that must be refused early, for every process sharing it.

use crate::clock::Timestamp;
use crate::store::StoreError;

/// Sessions ended early, refused by every process sharing the store.
#[async_trait::async_trait]
pub trait Sessions: Send + Sync + std::fmt::Debug {
    /// End the session `id` (which would otherwise hold until
    /// `expires_at`): from now on it is refused. Ended sessions whose
    /// expiry has passed by `now` are forgotten here, since their cookies
    /// are refused without the store.
    async fn session_end(&self, id: String, expires_at: Timestamp, now: Timestamp) -> Result<(), StoreError>;

    /// Whether the session `id` was ended.
    async fn session_ended(&self, id: String) -> Result<bool, StoreError>;
}
