//! Blocks in a WASI clock sleep (an hour by default): only the host can end it.
//!
//! Input (optional JSON): `{"ms": N}`. Output after waking: `{"slept_ms": N}`.

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    ms: u64,
}

impl Default for Input {
    fn default() -> Self {
        Input { ms: 3_600_000 }
    }
}

struct Sleep;

impl Plugin for Sleep {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        std::thread::sleep(std::time::Duration::from_millis(input.ms));
        leash_sdk::json_output(&serde_json::json!({ "slept_ms": input.ms }))
    }
}

leash_sdk::export!(Sleep);
