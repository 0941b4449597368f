//! What the PostgreSQL tests share: the database they use and a schema of
//! their own in it for each test (both from [`leash_tests::pg`]), and a
//! cluster of a test's own to crash and restart.

use std::io::Write;

use tokio_postgres::NoTls;

pub(crate) use leash_tests::pg::{Schema, url};

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
