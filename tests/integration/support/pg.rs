//! What the PostgreSQL tests share: the database they use, and a schema of
//! their own in it for each test.
//!
//! They run against `LEASH_TEST_POSTGRES` (a `postgres://` URL of a
//! database they may create schemas in). Unset, each PostgreSQL test says
//! it was skipped and why, and passes; with `CI` set, an unset variable
//! fails the test instead, so CI never skips them (`.ci/run` sets it).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::NoTls;

/// The database URL, or `None` after saying why the test is skipped.
pub(crate) fn url() -> Option<String> {
    leash_tests::postgres_url()
}

/// A schema created for one test and dropped after it; `url` connects with
/// it as the search path, so the store's tables land in it.
pub(crate) struct Schema {
    pub(crate) url: String,
    pub(crate) name: String,
    base: String,
}

impl Schema {
    pub(crate) async fn create(base: &str) -> Schema {
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
    pub(crate) async fn execute(&self, sql: &str) {
        execute(&self.url, sql).await;
    }

    /// Terminate this schema's connections that `filter` (SQL over
    /// `pg_stat_activity`) selects, as an operator or a failover would;
    /// how many were terminated.
    pub(crate) async fn terminate_backends(&self, filter: &str) -> u64 {
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

/// Where Debian puts PostgreSQL 15's server binaries (`initdb`, `pg_ctl`).
const SERVER_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL cluster of the test's own, on its own port, that the test
/// may terminate connections of, crash and restart without touching the
/// shared server. Stopped (immediately) when dropped.
pub(crate) struct Cluster {
    dir: tempfile::TempDir,
    port: u16,
}

impl Cluster {
    /// Initialise and start a cluster, or `None` after saying why the test
    /// is skipped (the same rule as [`url`]: never skipped in CI).
    pub(crate) fn start() -> Option<Cluster> {
        url()?;
        if !std::path::Path::new(SERVER_BIN).join("pg_ctl").exists() {
            assert!(std::env::var_os("CI").is_none(), "CI is set but {SERVER_BIN}/pg_ctl is missing");
            let _ =
                writeln!(std::io::stderr(), "skipped: this test needs PostgreSQL's server binaries in {SERVER_BIN}");
            return None;
        }
        let dir = tempfile::Builder::new().prefix("leash-pg-").tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cluster = Cluster { dir, port };
        if as_root() {
            // The server refuses to run as root: its files belong to postgres.
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(cluster.dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown the cluster's folder to postgres");
        }
        let data = cluster.data();
        cluster.run("initdb", &["-D", &data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]);
        cluster.pg_ctl(&["start"]);
        Some(cluster)
    }

    /// A URL of the cluster's `postgres` database.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Crash the server (`immediate`: no checkpoint, connections cut) and
    /// start it again; it recovers from its WAL.
    pub(crate) fn crash_and_restart(&self) {
        self.pg_ctl(&["restart", "-m", "immediate"]);
    }

    /// Crash the server and leave it down.
    pub(crate) fn crash(&self) {
        self.pg_ctl(&["stop", "-m", "immediate"]);
    }

    /// Start a stopped server.
    pub(crate) fn start_again(&self) {
        self.pg_ctl(&["start"]);
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn pg_ctl(&self, action: &[&str]) {
        // fsync off: a crashed server (not machine) keeps what it wrote, and
        // the test measures leash, not the disk.
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        let data = self.data();
        let mut args = vec!["-D", &data, "-o", &options, "-l", &log, "-w", "-t", "60"];
        args.extend_from_slice(action);
        self.run("pg_ctl", &args);
    }

    fn run(&self, program: &str, args: &[&str]) {
        let output = server_command(program).args(args).current_dir(self.dir.path()).output().unwrap();
        assert!(
            output.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Terminate every connection leash holds (application name `leash`),
    /// as an operator or a failover would; how many.
    pub(crate) async fn terminate_leash_backends(&self) -> u64 {
        let (client, connection) = tokio_postgres::connect(&self.url(), NoTls).await.unwrap();
        tokio::spawn(connection);
        let sql = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'leash'";
        client.query(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}")).len() as u64
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = server_command("pg_ctl").args(["-D", &data, "-m", "immediate", "-w", "stop"]).output();
    }
}

/// One of the server's programs, run as `postgres` when the test is root
/// (the server refuses to run as root).
fn server_command(program: &str) -> std::process::Command {
    let path = format!("{SERVER_BIN}/{program}");
    if as_root() {
        let mut command = std::process::Command::new("runuser");
        command.args(["-u", "postgres", "--", &path]);
        command
    } else {
        std::process::Command::new(path)
    }
}

fn as_root() -> bool {
    std::process::Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
