//! Settings from a TOML file, beneath flags and environment variables.
//!
//! Precedence: a flag beats its `LEASH_*` variable, which beats the file
//! named by `--config` / `LEASH_CONFIG`, which beats the built-in default.
//! The file is flat; each key is a flag's long name with underscores:
//!
//! ```toml
//! db = "/var/lib/leash/jobs.db"
//! max_workers = 8
//! lease_ttl = "30s"
//! job_ttl = "86400s"
//! ```
//!
//! A key no command knows, or a value its flag would refuse, is an error
//! naming the key and the file.

use std::ffi::OsString;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};

/// The flags a config file may set.
pub const FILE_KEYS: &[&str] = &[
    "db",
    "durability",
    "max_workers",
    "poll_interval",
    "lease_ttl",
    "job_ttl",
    "event_ttl",
    "cancel_grace",
    "shutdown_budget",
    "queue_ttl",
    "cache_dir",
    "secrets_file",
    "timeout",
    "max_attempts",
    "free_reruns",
    "approval_ttl",
    "max_queued",
    "job_timeout",
    "max_timeout",
    "retry_backoff",
    "retry_backoff_cap",
    "log_format",
    "guest_logs",
    "guest_nice",
    "compile_nice",
    "keep_resident",
    "function_cache_size",
    "compiler",
    "shared_code_size",
    "start_log",
    "listen",
    "token_file",
    "sync_timeout",
    "max_body",
    "header_timeout",
    "write_timeout",
    "max_connections",
    "pool",
    "server",
];

/// Read `path` as flat TOML into `(key, value)` pairs, values as flag text.
pub fn read_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
    let table: toml::Table = text.parse().map_err(|e| format!("config {} is not valid TOML: {e}", path.display()))?;
    let mut pairs = Vec::new();
    for (key, value) in table {
        if !FILE_KEYS.contains(&key.as_str()) {
            return Err(format!("config {}: unknown key {key:?} (known: {})", path.display(), FILE_KEYS.join(", ")));
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => return Err(format!("config {}: {key} must be a string or a number, not {other}", path.display())),
        };
        pairs.push((key, text));
    }
    Ok(pairs)
}

/// Flags to append to the command line for the file's settings that the
/// command line and environment left at their defaults. Each value is
/// checked with its flag's own parser first, so a bad one is reported by
/// key.
pub fn fill_defaults(
    command: &Command,
    matches: &ArgMatches,
    path: &Path,
    pairs: &[(String, String)],
) -> Result<Vec<OsString>, String> {
    let mut extra = Vec::new();
    for (key, value) in pairs {
        let Some(arg) = command.get_arguments().find(|a| a.get_id().as_str() == key.as_str()) else {
            continue; // a setting for another subcommand
        };
        if matches.value_source(key).is_some_and(|s| s != ValueSource::DefaultValue) {
            continue; // a flag or variable wins
        }
        let flag = check_value(arg, value).map_err(|e| format!("config {}: {key} = {value:?}: {e}", path.display()))?;
        extra.push(flag);
    }
    Ok(extra)
}

/// Every `LEASH_*` variable that is set must parse as its flag's value; the
/// error names the variable (clap's own names only the flag).
pub fn check_env(command: &Command) -> Result<(), String> {
    fn all<'a>(command: &'a Command, out: &mut Vec<&'a Command>) {
        out.push(command);
        for sub in command.get_subcommands() {
            all(sub, out);
        }
    }
    let mut commands = Vec::new();
    all(command, &mut commands);
    for arg in commands.into_iter().flat_map(|c| c.get_arguments()) {
        let Some(name) = arg.get_env() else { continue };
        let Some(value) = std::env::var_os(name) else { continue };
        let text = value.to_string_lossy();
        check_value(arg, &text)
            .map_err(|e| format!("environment variable {} = {text:?}: {e}", name.to_string_lossy()))?;
    }
    Ok(())
}

/// `--flag=value` if `arg`'s own parser accepts `value`.
fn check_value(arg: &Arg, value: &str) -> Result<OsString, String> {
    let long = arg.get_long().unwrap_or(arg.get_id().as_str()).to_owned();
    let flag = OsString::from(format!("--{long}={value}"));
    let alone = Arg::new(arg.get_id().clone()).long(long).value_parser(arg.get_value_parser().clone());
    Command::new("check")
        .no_binary_name(true)
        .arg(alone)
        .try_get_matches_from([flag.clone()])
        .map_err(|e| first_line(&e.to_string()))?;
    Ok(flag)
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim_start_matches("error: ").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_bad_types_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leash.toml");
        std::fs::write(&path, "max_wrokers = 3\n").unwrap();
        assert!(read_file(&path).unwrap_err().contains("unknown key \"max_wrokers\""));
        std::fs::write(&path, "max_workers = [1]\n").unwrap();
        assert!(read_file(&path).unwrap_err().contains("max_workers must be"));
        std::fs::write(&path, "max_workers = 3\nlease_ttl = \"10s\"\n").unwrap();
        let pairs = read_file(&path).unwrap();
        assert!(pairs.contains(&("max_workers".into(), "3".into())));
        assert!(pairs.contains(&("lease_ttl".into(), "10s".into())));
    }
}
