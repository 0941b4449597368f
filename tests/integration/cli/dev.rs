//! `leash dev`: build, run, one line per round, and again on every edit.
//! The "project" here builds by copying one of the test plugins, named in
//! `which.txt`, to `out.wasm`: an edit to that file is an edit to the
//! source, and the build is instant.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;

use crate::support::GENEROUS;
use crate::support::server::leash_bin;

/// A project whose build copies the test plugin named in `which.txt`.
fn project(dir: &Path, plugin: &str, input: &str) -> Vec<String> {
    std::fs::write(dir.join("which.txt"), plugin).unwrap();
    std::fs::write(dir.join("in.json"), input).unwrap();
    let plugins = leash_tests::plugin_path("hello").parent().unwrap().to_owned();
    let build = format!("cp \"{}/$(cat which.txt).wasm\" out.wasm", plugins.display());
    ["dev", dir.to_str().unwrap(), "--build", &build, "--wasm", "out.wasm", "--input"]
        .into_iter()
        .map(str::to_owned)
        .chain([dir.join("in.json").to_str().unwrap().to_owned()])
        .collect()
}

#[test]
fn leash_dev_once_builds_runs_and_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let args = project(dir.path(), "hello", r#"{"name":"Ada"}"#);
    let done = leash_bin().args(&args).arg("--once").output().unwrap();
    assert_eq!(done.status.code(), Some(0), "{}", String::from_utf8_lossy(&done.stderr));
    let said = String::from_utf8_lossy(&done.stdout);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 1, "{said}");
    assert!(lines[0].starts_with("#1 built in "), "{said}");
    assert!(lines[0].contains(" · succeeded in "), "{said}");
    assert!(lines[0].ends_with(r#"{"greeting":"Hello, Ada!","target":"execute","attempt":1}"#), "{said}");

    // A build that fails says so, with what it printed, and exits 2.
    std::fs::write(dir.path().join("which.txt"), "no-such-plugin").unwrap();
    let failed = leash_bin().args(&args).arg("--once").output().unwrap();
    assert_eq!(failed.status.code(), Some(2));
    let said = String::from_utf8_lossy(&failed.stdout);
    assert!(said.starts_with("#1 build failed in "), "{said}");
    assert!(said.contains("no-such-plugin.wasm"), "the build's own words: {said}");

    // A guest failure is the run's exit code.
    let args = project(dir.path(), "fail", "{}");
    let failed = leash_bin().args(&args).arg("--once").output().unwrap();
    assert_eq!(failed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&failed.stdout).contains(" · failed (guest_error) in "));
}

/// Replace `name` in `dir` as an editor that saves atomically does: the
/// file is never seen half written (a plain write truncates it first, and
/// a loaded machine can pause between the two).
fn save(dir: &Path, name: &str, text: &str) {
    let draft = dir.join(format!(".{name}.draft"));
    std::fs::write(&draft, text).unwrap();
    std::fs::rename(&draft, dir.join(name)).unwrap();
}

/// Lines `child` prints, as they come.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

#[test]
fn leash_dev_runs_again_on_each_edit_and_keeps_the_compiled_component() {
    let dir = tempfile::tempdir().unwrap();
    let args = project(dir.path(), "hello", r#"{"name":"Ada"}"#);
    let mut child = leash_bin().args(&args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let lines = lines_of(&mut child);
    let next =
        |what: &str| lines.recv_timeout(GENEROUS).unwrap_or_else(|_| panic!("no line for {what} within {GENEROUS:?}"));
    let first = next("the first round");
    assert!(first.starts_with("#1 built in ") && first.contains("Hello, Ada!"), "{first}");

    // The saved input, edited: run again on the same compiled component.
    save(dir.path(), "in.json", r#"{"name":"Barbara"}"#);
    let second = next("the edited input");
    assert!(second.starts_with("#2 built in ") && second.contains(" · unchanged component · "), "{second}");
    assert!(second.contains("Hello, Barbara!"), "{second}");

    // The source, edited: a new component, made ready (compiled, or read
    // from the compile cache the tests share), run on the same input.
    save(dir.path(), "which.txt", "fail");
    let third = next("the edited source");
    let ready = third.contains(" · compiled in ") || third.contains(" · loaded from the compile cache in ");
    assert!(third.starts_with("#3 built in ") && ready, "{third}");
    assert!(third.contains(" · failed (invalid_input) in "), "the fail plugin refuses a name: {third}");

    // Back to the first: still compiled, in this process.
    save(dir.path(), "which.txt", "hello");
    let fourth = next("the source put back");
    assert!(fourth.contains(" · unchanged component · ") && fourth.contains("Hello, Barbara!"), "{fourth}");

    // Ctrl-C ends it cleanly.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}
