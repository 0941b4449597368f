//! Delivers webhooks: POSTs a JSON event to a URL, once or several times,
//! authenticated by a secret the guest never holds. Every delivery is an
//! effect: fenced by the job's lease and recorded in its effect ledger.
//!
//! Input (JSON): `{"url": "https://...", "event": {...}, "count": 1,
//! "secret": "NAME", "prepare_ms": 0}` (all but `url` optional). With
//! `secret`, each request carries `Authorization: Bearer {secret:NAME}` for
//! the host to fill in. `prepare_ms` is time spent before the first
//! delivery (work that has no effect). Each delivery's body is
//! `{"delivery": n, "job": ID, "attempt": n, "event": ...}`. Output: `{"delivered": n, "statuses": [201, ...]}`. A delivery
//! that fails fails the job (`retryable` for a 5xx or a transport error,
//! `failed` for a refusal or a 4xx) after logging it.

// Shared with http-get, which reads the whole response; a webhook needs
// only the status.
#[allow(dead_code)]
#[path = "../../http-get/src/fetch.rs"]
mod fetch;

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    url: String,
    #[serde(default)]
    event: Value,
    #[serde(default = "one")]
    count: u32,
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    prepare_ms: u64,
}

fn one() -> u32 {
    1
}

struct Webhook;

impl Plugin for Webhook {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input(&input)?;
        let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        if let Some(secret) = &input.secret {
            headers.push(("authorization".to_owned(), format!("Bearer {{secret:{secret}}}")));
        }
        if input.prepare_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(input.prepare_ms));
        }
        let mut statuses = Vec::new();
        for n in 0..input.count {
            if leash_sdk::cancelled() {
                return Err(Error::failed(format!("cancelled after {n} deliveries")));
            }
            let body = json!({ "delivery": n + 1, "job": ctx.job_id, "attempt": ctx.attempt, "event": input.event })
                .to_string();
            let fetched = fetch::fetch("POST", &input.url, &headers, Some(body.as_bytes())).map_err(|e| {
                leash_sdk::log::warn(&format!("delivery {} to {} failed: {e}", n + 1, input.url));
                if e.contains("Denied") { Error::failed(e) } else { Error::retryable(e) }
            })?;
            match fetched.status {
                200..=299 => statuses.push(fetched.status),
                500..=599 => return Err(Error::retryable(format!("delivery {}: status {}", n + 1, fetched.status))),
                status => return Err(Error::failed(format!("delivery {}: status {status}", n + 1))),
            }
            leash_sdk::progress(u64::from(n + 1), u64::from(input.count), "delivered");
        }
        leash_sdk::json_output(&json!({ "delivered": statuses.len(), "statuses": statuses }))
    }
}

leash_sdk::export!(Webhook);
