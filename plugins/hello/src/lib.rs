//! The friendly example: greets a name, logs, and reports progress.
//!
//! Input (optional JSON): `{"name": "Ada"}`. Output: `{"greeting": "Hello, Ada!", ...}`.
//! Copy this crate to start a plugin of your own.

use leash_sdk::{Context, Error, Plugin};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Input {
    name: Option<String>,
}

#[derive(Serialize)]
struct Output {
    greeting: String,
    target: String,
    attempt: u32,
}

struct Hello;

impl Plugin for Hello {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        let name = input.name.unwrap_or_else(|| "world".to_owned());
        if name.trim().is_empty() {
            return Err(Error::invalid_input("name must not be blank"));
        }
        leash_sdk::log::info(&format!("greeting {name}"));
        leash_sdk::progress(1, 1, "greeted");
        leash_sdk::json_output(&Output {
            greeting: format!("Hello, {name}!"),
            target: ctx.target.to_string(),
            attempt: ctx.attempt,
        })
    }
}

leash_sdk::export!(Hello);
