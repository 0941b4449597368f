//! Fails the way its input says: an expected error, never a trap.
//!
//! Input (optional JSON): `{"kind": "failed" | "retryable" | "invalid-input", "message": "..."}`
//! (default: `failed`, "the fail plugin always fails").

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    kind: String,
    message: String,
}

impl Default for Input {
    fn default() -> Self {
        Input { kind: "failed".to_owned(), message: "the fail plugin always fails".to_owned() }
    }
}

struct Fail;

impl Plugin for Fail {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        Err(match input.kind.as_str() {
            "failed" => Error::failed(input.message),
            "retryable" => Error::retryable(input.message),
            "invalid-input" => Error::invalid_input(input.message),
            other => Error::invalid_input(format!("unknown kind {other:?}")),
        })
    }
}

leash_sdk::export!(Fail);
