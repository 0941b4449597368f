//! The `leash` binary: parses the command line, runs it, maps the result to
//! an exit code. Errors print as one line.

use std::io::Write;
use std::process::ExitCode;

use leash::cli::{self, Cli, ExitStatus};

fn main() -> ExitCode {
    let cli = match Cli::parse_with_config(std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "leash: cannot start the async runtime: {e}");
            return ExitCode::from(ExitStatus::Internal as u8);
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(status) => ExitCode::from(status as u8),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "leash: error: {e:#}");
            ExitCode::from(e.status as u8)
        }
    }
}
