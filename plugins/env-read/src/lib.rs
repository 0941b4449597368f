//! Tries to read the host's environment, arguments and working directory.
//!
//! Output: `{"vars": [...names...], "args": [...], "home": ..., "path": ..., "cwd": ...}`.

use leash_sdk::{Context, Error, Plugin};
use serde_json::json;

struct EnvRead;

impl Plugin for EnvRead {
    fn run(_ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let vars: Vec<String> = std::env::vars_os().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
        let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
        let report = json!({
            "vars": vars,
            "args": args,
            "home": std::env::var("HOME").ok(),
            "path": std::env::var("PATH").ok(),
            "cwd": std::env::current_dir().ok().map(|p| p.display().to_string()),
        });
        leash_sdk::json_output(&report)
    }
}

leash_sdk::export!(EnvRead);
