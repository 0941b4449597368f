//! A hostile guest: tries to reach what it was not granted over
//! `wasi:http`, and to overrun what it was. Reports each try instead of
//! failing, so one job shows every refusal. Follows redirects (up to five)
//! as ordinary HTTP clients do, so a redirect to a place it may not go is
//! tried too.
//!
//! Input (JSON): `{"tries": [{"url": "...", "method": "GET"}], "flood":
//! {"url": "...", "count": 10000, "method": "GET"}}` (both optional; the
//! methods default to GET). Output: `{"tries":
//! [{"url", "method", "status" | "error", "body_bytes"}], "flood": {"ok": n,
//! "errors": {"HttpRequestDenied": n, ...}}}`.

#[path = "../../http-get/src/fetch.rs"]
mod fetch;

use std::collections::BTreeMap;

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Try {
    url: String,
    #[serde(default = "get")]
    method: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Flood {
    url: String,
    count: u32,
    #[serde(default = "get")]
    method: String,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Input {
    tries: Vec<Try>,
    flood: Option<Flood>,
}

fn get() -> String {
    "GET".to_owned()
}

/// One try, following redirects; the report names every URL visited.
fn follow(method: &str, url: &str) -> Value {
    let mut visited = vec![url.to_owned()];
    loop {
        let here = visited.last().expect("one url at least").clone();
        match fetch::fetch(method, &here, &[], None) {
            Ok(f) => match f.location {
                Some(next) if (300..400).contains(&f.status) && visited.len() <= 5 => visited.push(next),
                _ => {
                    return json!({
                        "url": url, "method": method, "visited": visited, "status": f.status,
                        "body_bytes": f.body_bytes, "body_sha256": f.body_sha256, "body_start": f.body_start,
                    });
                }
            },
            Err(e) => return json!({ "url": url, "method": method, "visited": visited, "error": e }),
        }
    }
}

struct HttpEscape;

impl Plugin for HttpEscape {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        let tries: Vec<Value> = input.tries.iter().map(|t| follow(&t.method, &t.url)).collect();
        let flood = input.flood.map(|flood| {
            let (mut ok, mut errors) = (0u32, BTreeMap::<String, u32>::new());
            for _ in 0..flood.count {
                match fetch::fetch(&flood.method, &flood.url, &[], None) {
                    Ok(_) => ok += 1,
                    Err(e) => *errors.entry(e).or_default() += 1,
                }
            }
            json!({ "ok": ok, "errors": errors })
        });
        leash_sdk::json_output(&json!({ "tries": tries, "flood": flood }))
    }
}

leash_sdk::export!(HttpEscape);
