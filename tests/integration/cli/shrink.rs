//! `leash plugins shrink` on a real build: a smaller file that runs, the
//! same file mode, and bad input refused with the file left as it was.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use leash_tests::plugin_path;

fn leash(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leash"))
        .env("LEASH_CACHE_DIR", crate::support::cache_dir())
        .args(args)
        .output()
        .expect("leash runs")
}

#[test]
fn shrink_writes_a_smaller_component_that_runs_and_refuses_a_second_shrink() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hello.wasm");
    std::fs::copy(plugin_path("hello"), &file).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let built = std::fs::read(&file).unwrap();
    let path = file.to_str().unwrap();

    let copy = dir.path().join("copy.wasm");
    let output = leash(&["plugins", "shrink", path, "-o", copy.to_str().unwrap(), "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let said: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(said["bytes_before"], built.len());
    assert_eq!(std::fs::read(&file).unwrap(), built, "with -o, the input is left as it was");

    let output = leash(&["plugins", "shrink", path]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let shrunk = std::fs::read(&file).unwrap();
    assert_eq!(said["bytes_after"], shrunk.len());
    assert!(shrunk.len() < built.len());
    assert!(String::from_utf8_lossy(&output.stdout).contains(&format!("{} -> {} bytes", built.len(), shrunk.len())));
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o644, "the mode is kept");

    let output = leash(&["run", path]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["greeting"], "Hello, world!");

    let output = leash(&["plugins", "shrink", path]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("shrunk already"));
    assert_eq!(std::fs::read(&file).unwrap(), shrunk, "a refused shrink leaves the file as it was");

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not wasm").unwrap();
    let output = leash(&["plugins", "shrink", text.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a WebAssembly component"));
    assert_eq!(std::fs::read_to_string(&text).unwrap(), "not wasm");
}
