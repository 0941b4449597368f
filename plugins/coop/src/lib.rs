//! A long loop that reports progress every step and stops cleanly when told.
//!
//! Input (optional JSON): `{"steps": N}` (default: effectively forever).
//! Output on completion: `{"steps_done": N}`. When asked to stop it returns
//! `failed("stopped after N steps")` at once.

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    steps: u64,
}

impl Default for Input {
    fn default() -> Self {
        Input { steps: u64::MAX }
    }
}

struct Coop;

impl Plugin for Coop {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        let mut acc: u64 = 0;
        for step in 0..input.steps {
            // A slice of real work between polls.
            for i in 0..20_000u64 {
                acc = std::hint::black_box(acc.wrapping_mul(31).wrapping_add(i));
            }
            if leash_sdk::progress(step + 1, input.steps, "working") || leash_sdk::cancelled() {
                leash_sdk::log::info(&format!("stopping cleanly after {} steps", step + 1));
                return Err(Error::failed(format!("stopped after {} steps", step + 1)));
            }
        }
        leash_sdk::json_output(&serde_json::json!({ "steps_done": input.steps }))
    }
}

leash_sdk::export!(Coop);
