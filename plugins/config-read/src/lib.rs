//! Reads its configuration through `wasi:config/store`: the keys it is
//! asked for one by one, and everything it can see.
//!
//! Input (JSON, optional): `{"keys": ["name", ...]}`. Output: `{"get":
//! {"name": "value" or null, ...}, "all": {"name": "value", ...}}`.

mod wasi_config {
    wit_bindgen::generate!({ path: "../config-read/wit", world: "wasi:config/imports@0.2.0-rc.1" });
}

use std::collections::BTreeMap;

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;
use serde_json::json;
use wasi_config::wasi::config::store;

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Input {
    keys: Vec<String>,
}

fn failed(e: store::Error) -> Error {
    Error::failed(format!("wasi:config/store: {e:?}"))
}

struct ConfigRead;

impl Plugin for ConfigRead {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        let mut got = BTreeMap::new();
        for key in input.keys {
            let value = store::get(&key).map_err(failed)?;
            got.insert(key, value);
        }
        let all: BTreeMap<String, String> = store::get_all().map_err(failed)?.into_iter().collect();
        leash_sdk::json_output(&json!({ "get": got, "all": all }))
    }
}

leash_sdk::export!(ConfigRead);
