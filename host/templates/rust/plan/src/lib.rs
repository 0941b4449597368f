//! {{name}}: a leash plan that keeps a record store in step with the
//! records you want. Input: `{"store": "http://host/records", "desired":
//! {"key": "value", ...}}`; the store answers `GET {store}` with a JSON
//! object of its records and takes `PUT` and `DELETE {store}/{key}`.
//!
//! The execute phase reads the store (reads are allowed), works out the
//! change and proposes one write per record: a person approves exactly
//! those writes. The apply phase sends the approved writes, each once;
//! the host refuses anything else.

use std::collections::BTreeMap;

use leash_sdk::http::Request;
use leash_sdk::{Context, Error, Plugin, Target, http, plan};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    store: String,
    desired: BTreeMap<String, String>,
}

/// Propose the writes that make the store hold `desired`; what changes.
fn execute(input: Input) -> Result<serde_json::Value, Error> {
    let current: BTreeMap<String, String> = http::get(&input.store)?.json()?;
    let store = input.store.trim_end_matches('/');
    let mut changes = Vec::new();
    for (key, value) in &input.desired {
        if current.get(key) != Some(value) {
            plan::propose(&Request::new("PUT", &format!("{store}/{key}")).body(value.as_bytes()))?;
            changes.push(format!("put {key}"));
        }
    }
    for key in current.keys().filter(|k| !input.desired.contains_key(*k)) {
        plan::propose(&Request::new("DELETE", &format!("{store}/{key}")))?;
        changes.push(format!("delete {key}"));
    }
    leash_sdk::log::info(&format!("proposed {} writes", changes.len()));
    Ok(serde_json::json!({ "changes": changes }))
}

struct Planner;

impl Plugin for Planner {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        match &ctx.target {
            Target::Execute => leash_sdk::json_output(&execute(leash_sdk::json_input(&input)?)?),
            // Exactly the approved writes, in order, each once.
            Target::Apply => {
                let sent = plan::send_approved()?;
                leash_sdk::json_output(&serde_json::json!({ "applied": sent.len() }))
            }
            Target::Action(name) => Err(Error::invalid_input(format!("{{name}} has no action {name:?}"))),
        }
    }
}

leash_sdk::export!(Planner);
