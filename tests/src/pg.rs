//! The PostgreSQL server the tests share, and a schema of their own in it
//! for each test.
//!
//! They run against `LEASH_TEST_POSTGRES` (a `postgres://` URL of a
//! database they may create schemas in). Unset, each PostgreSQL test says
//! it was skipped and why, and passes; with `CI` set, an unset variable
//! fails the test instead, so CI never skips them (`.ci/run` sets it).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::NoTls;

/// The PostgreSQL server the tests use (`LEASH_TEST_POSTGRES`, a
/// `postgres://` URL of a database they may create schemas in), or `None`
/// after saying on stderr that the calling test is skipped and why. With
/// `CI` set, an unset variable panics instead, so CI never skips them.
pub fn url() -> Option<String> {
    match std::env::var("LEASH_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI is set but LEASH_TEST_POSTGRES is not: the PostgreSQL tests must not be skipped in CI")
        }
        _ => {
            // Straight to the process's stderr: the test harness captures
            // `eprintln!` of a passing test, and this must be seen.
            let test = std::thread::current().name().unwrap_or("a PostgreSQL test").to_owned();
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: it needs PostgreSQL; set LEASH_TEST_POSTGRES=postgres://USER@HOST:PORT/DATABASE \
                 (a database it may create schemas in) to run it"
            );
            None
        }
    }
}

/// A schema created for one test and dropped after it; `url` connects with
/// it as the search path, so the store's tables land in it.
#[derive(Debug)]
pub struct Schema {
    /// The server's URL with this schema as the search path (and its name
    /// as the application name).
    pub url: String,
    /// The schema's name.
    pub name: String,
    base: String,
}

impl Schema {
    /// Create a schema of a new name in `base`'s database.
    pub async fn create(base: &str) -> Schema {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let name = format!("leash_test_{}_{nanos:x}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        execute(base, &format!("CREATE SCHEMA {name}")).await;
        let separator = if base.contains('?') { '&' } else { '?' };
        // The schema's name is also its connections' application name, so
        // a test can find (and terminate) its own connections.
        let url = format!("{base}{separator}options=-csearch_path%3D{name}&application_name={name}");
        Schema { url, name, base: base.to_owned() }
    }

    /// Run SQL in this schema.
    pub async fn execute(&self, sql: &str) {
        execute(&self.url, sql).await;
    }

    /// Terminate this schema's connections that `filter` (SQL over
    /// `pg_stat_activity`) selects, as an operator or a failover would;
    /// how many were terminated.
    pub async fn terminate_backends(&self, filter: &str) -> u64 {
        let (client, connection) = tokio_postgres::connect(&self.base, NoTls).await.unwrap();
        tokio::spawn(connection);
        let sql = format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 \
             AND pid <> pg_backend_pid() AND ({filter})"
        );
        client.query(&sql, &[&self.name]).await.unwrap_or_else(|e| panic!("{sql}: {e}")).len() as u64
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (base, sql) = (self.base.clone(), format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        // Drop runs inside the test's runtime, which cannot block on
        // itself: a thread of its own does the dropping.
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(execute(&base, &sql))
        })
        .join();
        if dropped.is_err() && !std::thread::panicking() {
            panic!("could not drop the test schema");
        }
    }
}

async fn execute(url: &str, sql: &str) {
    let (client, connection) =
        tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| panic!("connecting to LEASH_TEST_POSTGRES: {e}"));
    tokio::spawn(connection);
    client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}
