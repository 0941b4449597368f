//! Syncs a set of records to a store upstream, as a plan: its `execute`
//! phase reads what the store holds and outputs the diff (the change to
//! approve); its `apply` phase makes exactly that diff, one request per
//! record, each an effect in the job's ledger.
//!
//! Plan input (JSON): `{"store": "http://host/records", "desired":
//! {"key": "value", ...}}`. The store answers `GET {store}` with a JSON
//! object of its records and takes `PUT {store}/{key}` (the value as the
//! body) and `DELETE {store}/{key}`.
//!
//! Execute output: `{"store": …, "changes": [{"op": "put", "key": …,
//! "value": …} | {"op": "delete", "key": …}], "unchanged": n}`. Apply
//! output: `{"applied": n}`. Apply never reads the store again: it applies
//! the diff that was approved, not a newer one.

#[allow(dead_code)]
#[path = "../../http-get/src/fetch.rs"]
mod fetch;

use std::collections::BTreeMap;

use leash_sdk::plan::ApplyInput;
use leash_sdk::{Context, Error, Plugin, Target};
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
fn plan(want: Want) -> Result<Diff, Error> {
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

/// `apply`: exactly the approved diff.
fn apply(diff: Diff) -> Result<usize, Error> {
    let total = diff.changes.len() as u64;
    for (n, change) in diff.changes.iter().enumerate() {
        if leash_sdk::cancelled() {
            return Err(Error::failed(format!("cancelled after {n} of {total} changes")));
        }
        let (method, key, body) = match change {
            Change::Put { key, value } => ("PUT", key, Some(value.as_bytes())),
            Change::Delete { key } => ("DELETE", key, None),
        };
        let url = format!("{}/{key}", diff.store.trim_end_matches('/'));
        let fetched = fetch::fetch(method, &url, &[], body).map_err(|e| failure(&format!("{method} {key}"), e))?;
        if !(200..300).contains(&fetched.status) {
            return Err(Error::failed(format!("{method} {key}: status {}", fetched.status)));
        }
        leash_sdk::progress(n as u64 + 1, total, key);
    }
    Ok(diff.changes.len())
}

struct FileSync;

impl Plugin for FileSync {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        match &ctx.target {
            Target::Execute => leash_sdk::json_output(&plan(leash_sdk::json_input(&input)?)?),
            Target::Apply => {
                let input = ApplyInput::parse(&input)?;
                let applied = apply(input.execute_output_json()?)?;
                leash_sdk::json_output(&serde_json::json!({ "applied": applied }))
            }
            Target::Action(name) => Err(Error::invalid_input(format!("file-sync has no action {name:?}"))),
        }
    }
}

leash_sdk::export!(FileSync);
