//! Fetches a URL through `wasi:http/outgoing-handler` and returns the
//! status and a digest of the body. The host sends the request only if the
//! job's grant allows it.
//!
//! Input (JSON): `{"url": "https://...", "method": "GET", "headers":
//! {"name": "value"}, "body": "text", "log_body": false}` (all but `url`
//! optional; `log_body` logs the first KiB of the response). Output:
//! `{"status": 200, "body_bytes": n, "body_sha256": "...", "body_start":
//! "first KiB", "location": "..." or null}`; redirects are not followed.
//! A request that fails (denied, refused, timed out) fails the job with
//! the WASI error code's name.
//!
//! Two options pass the response on, as a careless plugin might (the
//! secret-redaction tests use them): `"echo_at": n` writes n dots and the
//! body's first KiB to stdout and stderr, then fails with the same text;
//! `"post_body_to": "http://.../"` then POSTs to that URL with the
//! percent-encoded first KiB appended to its path.

mod fetch;

use std::collections::BTreeMap;

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    url: String,
    #[serde(default = "get")]
    method: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    log_body: bool,
    #[serde(default)]
    echo_at: Option<usize>,
    #[serde(default)]
    post_body_to: Option<String>,
}

fn get() -> String {
    "GET".to_owned()
}

struct HttpGet;

impl Plugin for HttpGet {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input(&input)?;
        let headers: Vec<(String, String)> = input.headers.into_iter().collect();
        leash_sdk::log::info(&format!("{} {}", input.method, input.url));
        let fetched = fetch::fetch(&input.method, &input.url, &headers, input.body.as_deref().map(str::as_bytes))
            .map_err(|e| Error::failed(format!("{} {}: {e}", input.method, input.url)))?;
        if input.log_body {
            leash_sdk::log::info(&format!("response {}: {}", fetched.status, fetched.body_start));
        }
        if let Some(pad) = input.echo_at {
            let text = format!("{}{}", ".".repeat(pad), fetched.body_start);
            print!("{text}");
            eprint!("{text}");
            return Err(Error::failed(text));
        }
        if let Some(base) = input.post_body_to {
            let encoded: String = fetched
                .body_start
                .bytes()
                .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
                .collect();
            let posted = fetch::fetch("POST", &format!("{base}{encoded}"), &[], Some(b""))
                .map_err(|e| Error::failed(format!("POST {base}…: {e}")))?;
            return leash_sdk::json_output(&json!({ "status": fetched.status, "posted": posted.status }));
        }
        leash_sdk::json_output(&json!({
            "status": fetched.status,
            "body_bytes": fetched.body_bytes,
            "body_sha256": fetched.body_sha256,
            "body_start": fetched.body_start,
            "location": fetched.location,
        }))
    }
}

leash_sdk::export!(HttpGet);
