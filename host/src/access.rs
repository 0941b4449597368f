//! Who may do what: principals, their roles, and the API tokens they
//! authenticate with.
//!
//! A principal has a name and a set of [`Role`]s; it holds tokens. A token
//! is `leash_<id>_<secret>`: the id (8 random bytes, hex) names its row,
//! the secret (32 random bytes, hex) is shown once, when it is created,
//! and stored only as its SHA-256. A slow password hash (argon2) buys
//! nothing for a secret of 256 random bits, which no one can guess or
//! search, and would cost every request its time; the comparison is in
//! constant time. A token may expire, and is revoked by deleting nothing:
//! its row keeps `revoked_at`, so listing shows it.
//!
//! This module depends only on [`crate::clock`].

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

use crate::clock::Timestamp;

/// What a principal may do. `admin` may do everything the others may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Create jobs and plans, and read them.
    Submit,
    /// Decide gated jobs and plans (approve, reject, trigger a run).
    Approve,
    /// Cancel, and read everything (workers, metrics, events).
    Operate,
    /// Plugins, grants, policies, principals and tokens.
    Admin,
}

impl Role {
    /// Every role, in order.
    pub const ALL: [Role; 4] = [Role::Submit, Role::Approve, Role::Operate, Role::Admin];

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Submit => "submit",
            Role::Approve => "approve",
            Role::Operate => "operate",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role {s:?}: expected submit, approve, operate or admin"))
    }
}

/// A principal: a name and what it may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Principal {
    /// 1–64 lowercase letters, digits, `.`, `_` and `-`, starting with a
    /// letter or digit.
    pub name: String,
    /// Its roles (at least one).
    pub roles: BTreeSet<Role>,
    /// When it was added.
    #[schema(value_type = String)]
    pub created_at: Timestamp,
    /// What the jobs it submits may ask for at most, below the server's
    /// own ceilings (absent: the server's alone).
    #[serde(default, skip_serializing_if = "PrincipalCeilings::is_none")]
    pub ceilings: PrincipalCeilings,
}

/// A principal's own ceilings on the jobs it submits. Each is checked at
/// submit (a job asking for more is refused; a default above it is cut
/// to it) and the timeout again when a worker claims the job, against the
/// principal's ceilings then: one lowered meanwhile holds its queued jobs.
/// The running cap is kept by the claim itself, on every replica: a job
/// of a principal already running its cap waits queued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PrincipalCeilings {
    /// Longest timeout per attempt, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_timeout_ms: Option<u64>,
    /// Most attempts per job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_attempts: Option<u32>,
    /// Longest wait in the queue, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_queue_ttl_ms: Option<u64>,
    /// Most of its jobs running at once, across every pool and replica
    /// (lowered below what runs now, the running jobs finish and no more
    /// start until fewer run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_running: Option<u32>,
}

impl PrincipalCeilings {
    /// No ceiling of its own.
    pub fn is_none(&self) -> bool {
        *self == PrincipalCeilings::default()
    }

    /// Each ceiling, if set, is at least 1.
    pub fn check(&self) -> Result<(), String> {
        let zero = [
            self.max_timeout_ms == Some(0),
            self.max_attempts == Some(0),
            self.max_queue_ttl_ms == Some(0),
            self.max_running == Some(0),
        ];
        if zero.contains(&true) {
            return Err("a principal's ceilings must be at least 1 (leave one out for none)".into());
        }
        Ok(())
    }
}

impl Principal {
    /// Whether it holds `role` (an admin holds every role).
    pub fn may(&self, role: Role) -> bool {
        self.roles.contains(&role) || self.roles.contains(&Role::Admin)
    }

    /// The name and roles a principal may have.
    pub fn check(name: &str, roles: &BTreeSet<Role>) -> Result<(), String> {
        Principal::check_name(name)?;
        if roles.is_empty() {
            return Err(format!("principal {name:?} needs at least one role: submit, approve, operate or admin"));
        }
        Ok(())
    }

    /// The names a principal may have.
    pub fn check_name(name: &str) -> Result<(), String> {
        let first = name.bytes().next();
        let valid = name.len() <= 64
            && first.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !valid {
            return Err(format!(
                "principal name {name:?}: use 1 to 64 lowercase letters, digits, `.`, `_` and `-`, starting with a \
                 letter or digit"
            ));
        }
        Ok(())
    }

    /// The principal the server's own token stands for (`--token-file`):
    /// every role. It is not stored, so it cannot be removed or locked out.
    pub fn bootstrap() -> Principal {
        Principal {
            name: BOOTSTRAP.to_owned(),
            roles: Role::ALL.into(),
            created_at: Timestamp::from_unix_ms(0),
            ceilings: PrincipalCeilings::default(),
        }
    }
}

/// The bootstrap principal's name; no stored principal may take it.
pub const BOOTSTRAP: &str = "admin";

/// A token as stored and listed (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenRecord {
    /// Its id: the part of the token that names it.
    pub id: String,
    /// Whose it is.
    pub principal: String,
    /// What it is for, as its creator said.
    pub label: Option<String>,
    /// When it was created.
    #[schema(value_type = String)]
    pub created_at: Timestamp,
    /// When it stops working, if ever.
    #[schema(value_type = Option<String>)]
    pub expires_at: Option<Timestamp>,
    /// When it was revoked, if it was.
    #[schema(value_type = Option<String>)]
    pub revoked_at: Option<Timestamp>,
}

impl TokenRecord {
    /// Whether it authenticates at `now`.
    pub fn live(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now < at)
    }
}

/// A token just created: the whole token (shown once) and its hash.
#[derive(Debug)]
pub struct NewToken {
    /// `leash_<id>_<secret>`: what the client sends.
    pub token: String,
    /// The id part.
    pub id: String,
    /// The secret's SHA-256, hex: what is stored.
    pub hash: String,
}

impl NewToken {
    /// A fresh random token.
    pub fn generate() -> Result<NewToken, String> {
        let mut id = [0u8; 8];
        let mut secret = [0u8; 32];
        getrandom::fill(&mut id)
            .and_then(|()| getrandom::fill(&mut secret))
            .map_err(|e| format!("no random source: {e}"))?;
        let (id, secret) = (hex::encode(id), hex::encode(secret));
        Ok(NewToken { token: format!("{TOKEN_PREFIX}{id}_{secret}"), hash: secret_hash(&secret), id })
    }
}

/// How a principal's token starts.
pub const TOKEN_PREFIX: &str = "leash_";

/// A presented token split into its id and secret, if it has the shape
/// of one.
pub fn token_parts(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 16) && hex(secret, 64)).then_some((id, secret))
}

/// The stored form of a token's secret.
pub fn secret_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Whether `secret` is the one `hash` was made from (constant time).
pub fn secret_matches(secret: &str, hash: &str) -> bool {
    bool::from(secret_hash(secret).as_bytes().ct_eq(hash.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_row_and_only_its_secret_matches_its_hash() {
        let token = NewToken::generate().unwrap();
        let (id, secret) = token_parts(&token.token).expect("a token has the shape of one");
        assert_eq!(id, token.id);
        assert!(secret_matches(secret, &token.hash));
        assert!(!secret_matches(&"0".repeat(64), &token.hash));
        assert!(!token.token.contains(&token.hash), "the stored hash is not in the token");
        assert_eq!(token_parts("leash_abc_def"), None);
        assert_eq!(token_parts(&token.token.replace("leash_", "other_")), None);
    }

    #[test]
    fn names_and_roles_are_checked() {
        let roles: BTreeSet<Role> = [Role::Submit].into();
        assert!(Principal::check("ci-bot.1", &roles).is_ok());
        for bad in ["", "Ci", "-x", &"a".repeat(65), "a b"] {
            assert!(Principal::check(bad, &roles).is_err(), "{bad:?}");
        }
        assert!(Principal::check("x", &BTreeSet::new()).is_err());
        assert_eq!("approve".parse::<Role>(), Ok(Role::Approve));
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn admin_may_do_what_every_role_may_and_a_token_lives_until_expiry_or_revocation() {
        let admin = Principal {
            name: "a".into(),
            roles: [Role::Admin].into(),
            created_at: Timestamp::from_unix_ms(0),
            ceilings: PrincipalCeilings::default(),
        };
        assert!(Role::ALL.iter().all(|r| admin.may(*r)));
        let submitter = Principal { roles: [Role::Submit].into(), ..admin };
        assert!(submitter.may(Role::Submit) && !submitter.may(Role::Approve));
        let t0 = Timestamp::from_unix_ms(1_000);
        let token = TokenRecord {
            id: "i".into(),
            principal: "a".into(),
            label: None,
            created_at: t0,
            expires_at: Some(t0.plus(std::time::Duration::from_secs(1))),
            revoked_at: None,
        };
        assert!(token.live(t0));
        assert!(!token.live(t0.plus(std::time::Duration::from_secs(1))), "expired");
        assert!(!TokenRecord { revoked_at: Some(t0), ..token }.live(t0), "revoked");
    }
}
