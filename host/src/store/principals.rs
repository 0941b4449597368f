//! Principals and their API tokens (see [`crate::access`]): who may call
//! the API, read by every process sharing the store, so a token revoked
//! or a principal removed is refused everywhere at once.

use crate::access::{Principal, TokenRecord};
use crate::clock::Timestamp;
use crate::store::StoreError;

/// A token as [`Principals::token_find`] answers it: its record, its
/// secret's hash, and its principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundToken {
    /// The token's row.
    pub record: TokenRecord,
    /// The SHA-256 of its secret, hex.
    pub hash: String,
    /// Whose it is.
    pub principal: Principal,
}

/// Principals and their tokens. Every change is audited, as `actor`'s
/// (`None`: the embedding code).
#[async_trait::async_trait]
pub trait Principals: Send + Sync + std::fmt::Debug {
    /// Add a principal, or give an existing one these roles (it keeps
    /// when it was added). Answers it as stored.
    async fn principal_put(&self, principal: Principal, actor: Option<String>) -> Result<Principal, StoreError>;

    /// One principal by name.
    async fn principal_get(&self, name: String) -> Result<Option<Principal>, StoreError>;

    /// Every principal, by name.
    async fn principal_list(&self) -> Result<Vec<Principal>, StoreError>;

    /// Remove a principal and revoke its live tokens (at `now`); `false`
    /// if there was none.
    async fn principal_remove(&self, name: String, now: Timestamp, actor: Option<String>) -> Result<bool, StoreError>;

    /// Store a new token with its secret's hash, for a principal that
    /// exists (else [`StoreError::Invalid`]).
    async fn token_insert(&self, record: TokenRecord, hash: String, actor: Option<String>) -> Result<(), StoreError>;

    /// Tokens (of one principal, or all), newest first; never their hashes.
    async fn token_list(&self, principal: Option<String>) -> Result<Vec<TokenRecord>, StoreError>;

    /// Revoke a token at `now`; `false` if there is no such live token.
    async fn token_revoke(&self, id: String, now: Timestamp, actor: Option<String>) -> Result<bool, StoreError>;

    /// A token by id with its hash and principal, for authenticating
    /// (`None`: no such token, or its principal was removed).
    async fn token_find(&self, id: String) -> Result<Option<FoundToken>, StoreError>;
}
