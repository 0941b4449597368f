//! Calls `log` in a tight loop, then finishes normally.
//!
//! Input (optional JSON): `{"lines": N}` (default 100000). Output: `{"lines": N}`.

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    lines: u64,
}

impl Default for Input {
    fn default() -> Self {
        Input { lines: 100_000 }
    }
}

struct LogSpam;

impl Plugin for LogSpam {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        for i in 0..input.lines {
            leash_sdk::log::log(leash_sdk::log::Level::Info, "spam", &[("line", &i.to_string())]);
        }
        leash_sdk::json_output(&serde_json::json!({ "lines": input.lines }))
    }
}

leash_sdk::export!(LogSpam);
