//! One request through `leash_sdk::http`, as `plugins/python/fetch` and
//! `plugins/js/fetch` make it with their SDKs' helpers: the same input,
//! the same output, the same errors.
//!
//! Input (JSON): `{"url": "...", "method": "GET", "headers": {"name":
//! "value"}, "json": <a value to POST as JSON>, "timeout_ms": n}` (all but
//! `url` optional; with `json`, the request is `post_json`'s). Output:
//! `{"status": 200, "content_type": "..." or null, "text": "the body"}`. A
//! request that gets no response fails the job through the SDK's error.

use std::collections::BTreeMap;
use std::time::Duration;

use leash_sdk::{Context, Error, Plugin, http};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    url: String,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    json: Option<serde_json::Value>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

struct Fetch;

impl Plugin for Fetch {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input(&input)?;
        let response = match (&input.json, &input.method, input.headers.is_empty(), input.timeout_ms) {
            (Some(value), None, true, None) => http::post_json(&input.url, value)?,
            (None, None, true, None) => http::get(&input.url)?,
            _ => {
                let method = input.method.as_deref().unwrap_or(if input.json.is_some() { "POST" } else { "GET" });
                let mut request = http::Request::new(method, &input.url);
                for (name, value) in &input.headers {
                    request = request.header(name, value);
                }
                if let Some(value) = &input.json {
                    request = request.json(value)?;
                }
                if let Some(ms) = input.timeout_ms {
                    request = request.timeout(Duration::from_millis(ms));
                }
                request.send()?
            }
        };
        leash_sdk::json_output(&serde_json::json!({
            "status": response.status,
            "content_type": response.header("content-type"),
            "text": response.text(),
        }))
    }
}

leash_sdk::export!(Fetch);
