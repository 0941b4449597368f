//! Where the store lives (`Database`), what a commit survives
//! (`Durability`), and `open`, which picks the backend.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use crate::store::{JobStore, StoreError, postgres, sqlite};

/// Where the job store lives, as `--db` and `LEASH_DATABASE_URL` name it.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// An SQLite file, created if missing: the embedded default.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL (`postgres://…` or `postgresql://…`).
    Postgres(String),
}

impl Database {
    /// `postgres://…` and `postgresql://…` name PostgreSQL; `sqlite:PATH`,
    /// `sqlite://PATH` and a bare path name an SQLite file.
    pub fn parse(text: &str) -> Database {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Database::Postgres(text.to_owned());
        }
        let path = text.strip_prefix("sqlite://").or_else(|| text.strip_prefix("sqlite:")).unwrap_or(text);
        Database::Sqlite(PathBuf::from(path))
    }

    /// Where `leash serve` keeps its API token unless told: beside an
    /// SQLite file (`PATH.token`), else `leash.token` in the working folder.
    pub fn default_token_file(&self) -> PathBuf {
        match self {
            Database::Sqlite(path) => {
                let mut name = path.as_os_str().to_owned();
                name.push(".token");
                PathBuf::from(name)
            }
            Database::Postgres(_) => PathBuf::from("leash.token"),
        }
    }
}

impl From<&str> for Database {
    fn from(text: &str) -> Self {
        Database::parse(text)
    }
}

impl From<String> for Database {
    fn from(text: String) -> Self {
        Database::parse(&text)
    }
}

impl From<PathBuf> for Database {
    /// A path is always an SQLite file, whatever it looks like.
    fn from(path: PathBuf) -> Self {
        Database::Sqlite(path)
    }
}

impl From<&Path> for Database {
    fn from(path: &Path) -> Self {
        Database::Sqlite(path.to_owned())
    }
}

impl From<&PathBuf> for Database {
    fn from(path: &PathBuf) -> Self {
        Database::Sqlite(path.clone())
    }
}

impl fmt::Display for Database {
    /// The location with any password masked, fit for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Database::Postgres(url) => f.write_str(&mask_password(url)),
        }
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `scheme://user:secret@host/…` → `scheme://user:***@host/…`.
fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// What a commit guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Survives a killed process; may lose the last commits on power loss.
    #[default]
    Normal,
    /// Survives power loss; one fsync per commit.
    Full,
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "normal" => Ok(Durability::Normal),
            "full" => Ok(Durability::Full),
            _ => Err(format!("unknown durability {s:?}: expected \"normal\" or \"full\"")),
        }
    }
}

/// Open the store `db` names, creating and migrating its schema.
pub async fn open(db: &Database, durability: Durability) -> Result<Arc<dyn JobStore>, StoreError> {
    match db {
        Database::Sqlite(path) => {
            let path = path.clone();
            let store = tokio::task::spawn_blocking(move || sqlite::SqliteStore::open(path, durability))
                .await
                .map_err(|e| StoreError::Invalid(format!("opening the store panicked: {e}")))??;
            Ok(Arc::new(store))
        }
        Database::Postgres(url) => {
            if durability == Durability::Full {
                // Every commit on PostgreSQL is as durable as the server
                // makes it (`synchronous_commit`); leash has nothing to add.
                tracing::warn!("--durability full applies to SQLite only; PostgreSQL's own settings decide");
            }
            Ok(Arc::new(postgres::PostgresStore::open(url).await?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_is_named_by_a_path_or_a_url() {
        assert_eq!(Database::parse("leash.db"), Database::Sqlite("leash.db".into()));
        assert_eq!(Database::parse("sqlite:/var/lib/leash.db"), Database::Sqlite("/var/lib/leash.db".into()));
        assert_eq!(Database::parse("sqlite://jobs.db"), Database::Sqlite("jobs.db".into()));
        let url = "postgresql://leash@db.internal:5432/jobs";
        assert_eq!(Database::parse(url), Database::Postgres(url.into()));
        assert_eq!(Database::from(PathBuf::from("postgres://x")), Database::Sqlite("postgres://x".into()));
        assert_eq!(Database::parse("jobs.db").default_token_file(), PathBuf::from("jobs.db.token"));
        assert_eq!(Database::parse(url).default_token_file(), PathBuf::from("leash.token"));
    }

    #[test]
    fn a_password_in_a_url_is_never_shown() {
        let db = Database::parse("postgres://leash:s3cret@db:5432/jobs?sslmode=require");
        assert_eq!(db.to_string(), "postgres://leash:***@db:5432/jobs?sslmode=require");
        assert_eq!(format!("{db:?}"), db.to_string());
        assert_eq!(Database::parse("postgres://leash@db/jobs").to_string(), "postgres://leash@db/jobs");
        assert_eq!(Database::parse("a.db").to_string(), "sqlite:a.db");
    }
}
