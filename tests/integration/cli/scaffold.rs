//! `leash new` as an author uses it: scaffold a plugin in each language in
//! a temp folder, build it with the command the scaffold prints, run it
//! with `leash run`, and run the scaffold's own test. Python and
//! JavaScript need their toolchains (see `leash_tests::polyglot`); without
//! them those tests say they were skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use leash_tests::polyglot::{self, Lang};

fn leash() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leash"))
}

/// A shell in `dir` whose `leash` is the binary under test.
fn shell(dir: &Path, line: &str) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_leash")).parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    Command::new("sh")
        .args(["-c", line])
        .current_dir(dir)
        .env("PATH", path)
        .env("LEASH", env!("CARGO_BIN_EXE_leash"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {line}: {e}"))
}

fn check(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `leash new`, the printed build, `leash run` and the scaffold's test.
fn scaffold_builds_runs_and_passes_its_test(lang: &str) {
    let parent = tempfile::tempdir().unwrap();
    let name = format!("greeter-{lang}");
    let output = leash().args(["new", &name, "--lang", lang, "--json", "--dir"]).arg(parent.path()).output().unwrap();
    check(&output, "leash new");
    let created: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let dir = PathBuf::from(created["dir"].as_str().unwrap());
    assert_eq!(dir, parent.path().join(&name));
    for file in created["files"].as_array().unwrap() {
        assert!(dir.join(file.as_str().unwrap()).is_file(), "{file} was not written");
    }

    check(&shell(&dir, created["build"].as_str().unwrap()), "the printed build command");
    assert!(dir.join(format!("{name}.wasm")).is_file(), "the build made no {name}.wasm");

    let ran = shell(&dir, created["run"].as_str().unwrap());
    check(&ran, "the printed run command");
    let output: serde_json::Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(output["greeting"], "Hello, world!");
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert!(stderr.contains("[info] greeting world (attempt 1)"), "{stderr}");

    check(&shell(&dir, created["test"].as_str().unwrap()), "the scaffold's own test");

    // A second `leash new` into the same folder refuses and writes nothing.
    let before = std::fs::read(dir.join("README.md")).unwrap();
    let again = leash().args(["new", &name, "--lang", lang, "--dir"]).arg(parent.path()).output().unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists and is not empty"));
    assert_eq!(std::fs::read(dir.join("README.md")).unwrap(), before);
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn leash_new_rust_builds_runs_and_passes_its_test() {
    scaffold_builds_runs_and_passes_its_test("rust");
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn leash_new_python_builds_runs_and_passes_its_test() {
    if let Err(why) = polyglot::tool(Lang::Python) {
        assert!(!polyglot::required(), "the Python scaffold test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    scaffold_builds_runs_and_passes_its_test("python");
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn leash_new_js_builds_runs_and_passes_its_test() {
    if let Err(why) = Command::new("npm").arg("--version").output().map_err(|e| format!("npm is not installed: {e}")) {
        assert!(!polyglot::required(), "the JavaScript scaffold test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    scaffold_builds_runs_and_passes_its_test("js");
}

#[test]
fn leash_new_refuses_bad_names_and_files_in_the_way() {
    let parent = tempfile::tempdir().unwrap();
    let bad = leash().args(["new", "Bad_Name", "--dir"]).arg(parent.path()).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid plugin name"));
    std::fs::write(parent.path().join("taken"), b"a file").unwrap();
    let taken = leash().args(["new", "taken", "--lang", "python", "--dir"]).arg(parent.path()).output().unwrap();
    assert_eq!(taken.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&taken.stderr).contains("not a folder"));
    assert_eq!(std::fs::read(parent.path().join("taken")).unwrap(), b"a file");
    // An empty folder is fine.
    std::fs::create_dir(parent.path().join("empty")).unwrap();
    let empty = leash().args(["new", "empty", "--lang", "js", "--dir"]).arg(parent.path()).output().unwrap();
    assert!(empty.status.success(), "{}", String::from_utf8_lossy(&empty.stderr));
    assert!(parent.path().join("empty/app.js").is_file());
}
