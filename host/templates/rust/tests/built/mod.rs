//! Runs the built component through `leash run` (the `leash` on PATH, or
//! the binary $LEASH names), refusing one that is missing or older than
//! what it is built from (an edit without a rebuild would test the old
//! code).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

/// The build command, as `leash new` printed it.
const BUILD: &str = r#"{{build}}"#;

/// `{{name}}.wasm`, once it is at least as new as `src/` and `Cargo.toml`.
pub fn wasm() -> &'static str {
    let wasm = concat!(env!("CARGO_MANIFEST_DIR"), "/{{name}}.wasm");
    let built = std::fs::metadata(wasm)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{wasm} is not built yet: run `{BUILD}`"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![root.join("Cargo.toml")];
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display())) {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() { dirs.push(path) } else { sources.push(path) }
        }
    }
    for source in sources {
        let changed = std::fs::metadata(&source).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
        assert!(
            changed <= built,
            "{wasm} is older than {}: rebuild it with `{BUILD}` (the test runs what was built)",
            source.display()
        );
    }
    wasm
}

/// `leash run --json FLAGS` on the component with this input: the report.
pub fn run(flags: &[&str], input: &str) -> serde_json::Value {
    let leash = std::env::var("LEASH").unwrap_or_else(|_| "leash".into());
    let mut child = Command::new(&leash)
        .args(["run", "--json", "--input", "-"])
        .args(flags)
        .arg(wasm())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {leash}: {e} (set LEASH to the leash binary)"));
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("leash run printed no report ({e}): {}", String::from_utf8_lossy(&output.stderr)))
}
