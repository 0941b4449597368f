//! Returns far more output than the host's cap allows.
//!
//! Input (optional JSON): `{"bytes": N}` (default 8 MiB).

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    bytes: usize,
}

impl Default for Input {
    fn default() -> Self {
        Input { bytes: 8 << 20 }
    }
}

struct BigOutput;

impl Plugin for BigOutput {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        Ok(vec![b'x'; input.bytes])
    }
}

leash_sdk::export!(BigOutput);
