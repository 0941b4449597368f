//! Tries to read `/etc/passwd` and to list `/` and `.`; reports what happened.
//!
//! Output: `{"read_etc_passwd": {"ok": bool, "detail": ...}, "list_root": ..., "list_cwd": ...}`.

use leash_sdk::{Context, Error, Plugin};
use serde_json::{Value, json};

fn attempt<T>(result: std::io::Result<T>, describe: impl Fn(T) -> String) -> Value {
    match result {
        Ok(v) => json!({ "ok": true, "detail": describe(v) }),
        Err(e) => json!({ "ok": false, "detail": e.to_string() }),
    }
}

fn list(dir: &str) -> std::io::Result<Vec<String>> {
    std::fs::read_dir(dir)?.map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned())).collect()
}

struct FsEscape;

impl Plugin for FsEscape {
    fn run(_ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let report = json!({
            "read_etc_passwd": attempt(std::fs::read_to_string("/etc/passwd"), |s| s),
            "list_root": attempt(list("/"), |names| names.join(",")),
            "list_cwd": attempt(list("."), |names| names.join(",")),
        });
        leash_sdk::json_output(&report)
    }
}

leash_sdk::export!(FsEscape);
