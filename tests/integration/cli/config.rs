//! Settings precedence for `leash worker`: flag > LEASH_* variable > config
//! file > default, and bad settings named by their key.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn worker(dir: &tempfile::TempDir, config: &str, env: &[(&str, &str)], flags: &[&str]) -> (Option<i32>, String) {
    let db = dir.path().join("jobs.db");
    worker_on(dir, config, env, &[&["--db", db.to_str().unwrap()], flags].concat())
}

fn worker_on(dir: &tempfile::TempDir, config: &str, env: &[(&str, &str)], flags: &[&str]) -> (Option<i32>, String) {
    let file = dir.path().join("leash.toml");
    std::fs::write(&file, config).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leash"));
    cmd.current_dir(dir.path()).arg("worker").arg("--config").arg(&file).args(flags);
    for var in ["LEASH_MAX_WORKERS", "LEASH_CONFIG", "LEASH_LEASE_TTL", "LEASH_DATABASE_URL", "LEASH_DATABASE_PATH"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut first).unwrap();
    if first.contains(" running ") {
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    }
    (child.wait().unwrap().code(), first)
}

#[test]
fn a_flag_beats_its_variable_which_beats_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (code, line) = worker(&dir, "max_workers = 3\n", &[], &[]);
    assert!(line.contains("running 3 slots"), "file over default: {line}");
    assert_eq!(code, Some(0));
    let (_, line) = worker(&dir, "max_workers = 3\n", &[("LEASH_MAX_WORKERS", "5")], &[]);
    assert!(line.contains("running 5 slots"), "variable over file: {line}");
    let (_, line) = worker(&dir, "max_workers = 3\n", &[("LEASH_MAX_WORKERS", "5")], &["--max-workers", "7"]);
    assert!(line.contains("running 7 slots"), "flag over variable: {line}");
    let (_, line) = worker(&dir, "", &[], &[]);
    assert!(line.contains("running 4 slots"), "the default: {line}");
}

#[test]
fn bad_settings_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (code, line) = worker(&dir, "max_workers = \"lots\"\n", &[], &[]);
    assert_eq!(code, Some(2));
    assert!(line.contains("max_workers") && line.contains("leash.toml"), "{line}");
    let (code, line) = worker(&dir, "max_wrokers = 3\n", &[], &[]);
    assert_eq!(code, Some(2));
    assert!(line.contains("unknown key \"max_wrokers\""), "{line}");
    let (code, line) = worker(&dir, "", &[("LEASH_LEASE_TTL", "forever")], &[]);
    assert_eq!(code, Some(2));
    assert!(line.contains("LEASH_LEASE_TTL"), "{line}");
}

/// The database: `--db` > `LEASH_DATABASE_URL` > `LEASH_DATABASE_PATH` (the
/// older name) > the file's `db` > `leash.db`; `sqlite:PATH` and a bare path
/// name the same kind of store.
#[test]
fn the_database_comes_from_the_flag_the_variables_or_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let on = |config: &str, env: &[(&str, &str)], flags: &[&str]| worker_on(&dir, config, env, flags).1;
    assert!(on("", &[], &[]).contains("on sqlite:leash.db"), "the default");
    assert!(on("db = \"file.db\"\n", &[], &[]).contains("on sqlite:file.db"), "the file");
    let path = [("LEASH_DATABASE_PATH", "path.db")];
    assert!(on("db = \"file.db\"\n", &path, &[]).contains("on sqlite:path.db"), "the older variable over the file");
    let url = [("LEASH_DATABASE_PATH", "path.db"), ("LEASH_DATABASE_URL", "sqlite:url.db")];
    assert!(on("db = \"file.db\"\n", &url, &[]).contains("on sqlite:url.db"), "the URL variable over the path");
    assert!(on("", &url, &["--db", "flag.db"]).contains("on sqlite:flag.db"), "the flag over both");
    for name in ["leash.db", "file.db", "path.db", "url.db", "flag.db"] {
        assert!(dir.path().join(name).exists(), "{name} was opened");
    }
}

/// A pool too large for the process's address space is refused at start,
/// naming the slots and what fits: never an out-of-memory kill later.
#[test]
fn ten_thousand_slots_are_refused_at_start_with_what_fits() {
    let dir = tempfile::tempdir().unwrap();
    let (code, line) = worker(&dir, "", &[], &["--max-workers", "10000"]);
    assert_ne!(code, Some(0), "{line}");
    assert!(line.contains("10000 job slots are more than this process can reserve address space for"), "{line}");
    assert!(line.contains("Use fewer slots (--max-workers): about"), "{line}");
}
