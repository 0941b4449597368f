//! The `leash` binary: parses the command line, runs it, maps the result to
//! an exit code. Errors print as one line.

use std::process::ExitCode;

use clap::Parser;
use leash::cli::{self, Cli, ExitStatus};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("leash: cannot start the async runtime: {e}");
            return ExitCode::from(ExitStatus::Internal as u8);
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(status) => ExitCode::from(status as u8),
        Err(e) => {
            eprintln!("leash: error: {e:#}");
            ExitCode::from(e.status as u8)
        }
    }
}
