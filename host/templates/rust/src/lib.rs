//! {{name}}: a leash plugin. Greets `{"name": "..."}` in `{"steps": N}`
//! steps, logging and reporting progress, and stops as soon as it is asked
//! to.

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    name: String,
    steps: u64,
}

impl Default for Input {
    fn default() -> Self {
        Input { name: "world".into(), steps: 3 }
    }
}

struct Greeter;

impl Plugin for Greeter {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        if input.name.trim().is_empty() {
            return Err(Error::invalid_input("name must not be blank"));
        }
        for step in 1..=input.steps {
            // True once the job is cancelled or its worker shuts down.
            if leash_sdk::progress(step, input.steps, "greeting") || leash_sdk::cancelled() {
                return Err(Error::failed(format!("cancelled after {} of {} steps", step - 1, input.steps)));
            }
        }
        leash_sdk::log::info(&format!("greeting {} (attempt {})", input.name, ctx.attempt));
        leash_sdk::json_output(&serde_json::json!({ "greeting": format!("Hello, {}!", input.name) }))
    }
}

leash_sdk::export!(Greeter);
