//! Principals and tokens through the embedding API: add and remove
//! principals, create, list and revoke their tokens, and say whose a
//! presented token is.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::access::{
    BOOTSTRAP, NewToken, Principal, PrincipalCeilings, Role, TokenRecord, secret_matches, token_parts,
};
use crate::runtime::{Runtime, RuntimeError};
use crate::store::StoreError;

/// Longest a token may be made to live for at creation.
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

impl Runtime {
    /// Whose `token` is (a principal's `leash_…` token that is neither
    /// expired nor revoked, whose principal still exists); `None` if it
    /// is no such token. Read from the store each time, so a revocation
    /// holds on every process sharing it at once.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Principal>, RuntimeError> {
        let Some((id, secret)) = token_parts(token) else { return Ok(None) };
        let Some(found) = self.inner.store.token_find(id.to_owned()).await? else { return Ok(None) };
        let genuine = secret_matches(secret, &found.hash) && found.record.live(self.now());
        Ok(genuine.then_some(found.principal))
    }

    /// The principal holding the token with this id, if the token still
    /// works (neither expired nor revoked, its principal still there): a
    /// dashboard session signed in with it lasts only as long. Read from
    /// the store each time, as [`Runtime::authenticate`] is.
    pub async fn token_holder(&self, id: &str) -> Result<Option<Principal>, RuntimeError> {
        let Some(found) = self.inner.store.token_find(id.to_owned()).await? else { return Ok(None) };
        Ok(found.record.live(self.now()).then_some(found.principal))
    }

    /// Add a principal with `roles` and `ceilings`, or give an existing one
    /// these.
    pub async fn principal_put(
        &self,
        name: String,
        roles: BTreeSet<Role>,
        ceilings: PrincipalCeilings,
    ) -> Result<Principal, RuntimeError> {
        Principal::check(&name, &roles).map_err(RuntimeError::InvalidAccess)?;
        ceilings.check().map_err(RuntimeError::InvalidAccess)?;
        if name == BOOTSTRAP {
            return Err(RuntimeError::InvalidAccess(format!(
                "{BOOTSTRAP:?} is the server token's principal and cannot be stored"
            )));
        }
        let principal = Principal { name, roles, created_at: self.now(), ceilings };
        Ok(self.inner.store.principal_put(principal, self.actor()).await?)
    }

    /// Every stored principal, by name.
    pub async fn principals(&self) -> Result<Vec<Principal>, RuntimeError> {
        Ok(self.inner.store.principal_list().await?)
    }

    /// Remove a principal; its tokens stop working at once. `false` if
    /// there was none.
    pub async fn principal_remove(&self, name: &str) -> Result<bool, RuntimeError> {
        Ok(self.inner.store.principal_remove(name.to_owned(), self.now(), self.actor()).await?)
    }

    /// A new token for `principal`, living for `ttl` (or until revoked):
    /// its record, and the token itself, which is shown this once.
    pub async fn token_create(
        &self,
        principal: &str,
        label: Option<String>,
        ttl: Option<Duration>,
    ) -> Result<(TokenRecord, String), RuntimeError> {
        if ttl.is_some_and(|t| t.is_zero() || t > MAX_TOKEN_TTL) {
            return Err(RuntimeError::InvalidAccess("a token's TTL must be from 1ms to 10 years".into()));
        }
        if label.as_ref().is_some_and(|l| l.len() > 256 || l.chars().any(char::is_control)) {
            return Err(RuntimeError::InvalidAccess("a token's label is at most 256 printable characters".into()));
        }
        let minted = NewToken::generate().map_err(RuntimeError::InvalidAccess)?;
        let now = self.now();
        let record = TokenRecord {
            id: minted.id,
            principal: principal.to_owned(),
            label,
            created_at: now,
            expires_at: ttl.map(|t| now.plus(t)),
            revoked_at: None,
        };
        match self.inner.store.token_insert(record.clone(), minted.hash, self.actor()).await {
            Ok(()) => Ok((record, minted.token)),
            Err(StoreError::Invalid(_)) => Err(RuntimeError::UnknownPrincipal(principal.to_owned())),
            Err(e) => Err(e.into()),
        }
    }

    /// Tokens, of one principal or all, newest first (never their secrets).
    pub async fn tokens(&self, principal: Option<String>) -> Result<Vec<TokenRecord>, RuntimeError> {
        Ok(self.inner.store.token_list(principal).await?)
    }

    /// Revoke a token: refused from now on, everywhere. `false` if there
    /// was no such live token.
    pub async fn token_revoke(&self, id: &str) -> Result<bool, RuntimeError> {
        Ok(self.inner.store.token_revoke(id.to_owned(), self.now(), self.actor()).await?)
    }
}
