//! Syncs a set of records to a store upstream, as a plan: its `execute`
//! phase reads what the store holds, outputs the diff and proposes one
//! write per changed record (the effects a person approves); its `apply`
//! phase sends exactly the approved writes, each once, each an effect in
//! the job's ledger.
//!
//! Plan input (JSON): `{"store": "http://host/records", "desired":
//! {"key": "value", ...}}`. The store answers `GET {store}` with a JSON
//! object of its records and takes `PUT {store}/{key}` (the value as the
//! body) and `DELETE {store}/{key}`.
//!
//! Execute output: `{"store": …, "changes": [{"op": "put", "key": …,
//! "value": …} | {"op": "delete", "key": …}], "unchanged": n}`, and one
//! proposal per change: `PUT {store}/{key}` with the value as its body, or
//! `DELETE {store}/{key}`. Apply output: `{"applied": n}`. Apply never
//! reads the store again, and cannot send anything but the approved
//! writes: the host holds it to them.

#[allow(dead_code)]
#[path = "../../http-get/src/fetch.rs"]
mod fetch;

use std::collections::BTreeMap;

use leash_sdk::http::Request;
use leash_sdk::{Context, Error, Plugin, Target, plan};
use serde::{Deserialize, Serialize};

/// Largest store listing read, bytes.
const MAX_LISTING: usize = 1 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Want {
    store: String,
    desired: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Change {
    Put { key: String, value: String },
    Delete { key: String },
}

#[derive(Serialize, Deserialize)]
struct Diff {
    store: String,
    changes: Vec<Change>,
    unchanged: usize,
}

fn failure(what: &str, e: String) -> Error {
    leash_sdk::log::warn(&format!("{what}: {e}"));
    if e.contains("Denied") { Error::failed(format!("{what}: {e}")) } else { Error::retryable(format!("{what}: {e}")) }
}

/// `execute`: what would change.
fn diff(want: Want) -> Result<Diff, Error> {
    let (fetched, body) = fetch::fetch_keeping("GET", &want.store, &[], None, MAX_LISTING)
        .map_err(|e| failure("reading the store", e))?;
    if fetched.status != 200 {
        return Err(Error::retryable(format!("reading the store: status {}", fetched.status)));
    }
    if fetched.body_bytes > MAX_LISTING as u64 {
        return Err(Error::failed(format!("the store's listing is over {MAX_LISTING} bytes")));
    }
    let current: BTreeMap<String, String> = serde_json::from_slice(&body)
        .map_err(|e| Error::failed(format!("the store's listing is not a JSON object of strings: {e}")))?;
    let mut changes = Vec::new();
    let mut unchanged = 0;
    for (key, value) in &want.desired {
        if current.get(key) == Some(value) {
            unchanged += 1;
        } else {
            changes.push(Change::Put { key: key.clone(), value: value.clone() });
        }
    }
    for key in current.keys().filter(|k| !want.desired.contains_key(*k)) {
        changes.push(Change::Delete { key: key.clone() });
    }
    Ok(Diff { store: want.store, changes, unchanged })
}

/// Propose the writes that make `diff`.
fn propose(diff: &Diff) -> Result<(), Error> {
    let store = diff.store.trim_end_matches('/');
    for change in &diff.changes {
        let request = match change {
            Change::Put { key, value } => Request::new("PUT", &format!("{store}/{key}"))
                .header("content-type", "text/plain")
                .body(value.as_bytes()),
            Change::Delete { key } => Request::new("DELETE", &format!("{store}/{key}")),
        };
        plan::propose(&request)?;
    }
    Ok(())
}

struct FileSync;

impl Plugin for FileSync {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        match &ctx.target {
            Target::Execute => {
                let diff = diff(leash_sdk::json_input(&input)?)?;
                propose(&diff)?;
                leash_sdk::json_output(&diff)
            }
            // Exactly what was approved, each once: the host refuses
            // anything else.
            Target::Apply => {
                let sent = plan::send_approved()?;
                leash_sdk::json_output(&serde_json::json!({ "applied": sent.len() }))
            }
            Target::Action(name) => Err(Error::invalid_input(format!("file-sync has no action {name:?}"))),
        }
    }
}

leash_sdk::export!(FileSync);
