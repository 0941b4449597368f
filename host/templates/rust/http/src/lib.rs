//! {{name}}: a leash plugin that fetches JSON. Input: `{"url": "..."}`;
//! output: `{"status": 200, "data": <the JSON it got>}`. An upstream
//! answering 5xx (or not answering) is a retryable error, so a durable job
//! with attempts left runs again; any other failure ends the job.

use std::time::Duration;

use leash_sdk::{Context, Error, Plugin, http};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    url: String,
}

struct Fetcher;

impl Plugin for Fetcher {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input(&input)?;
        leash_sdk::log::info(&format!("fetching {} (attempt {})", input.url, ctx.attempt));
        // True once the job is cancelled or its worker shuts down.
        if leash_sdk::progress(0, 1, "fetching") {
            return Err(Error::failed("cancelled before fetching"));
        }
        // No response at all is an `HttpError`; `?` makes it the job's
        // error (retryable when a later try may succeed).
        let response = http::Request::get(&input.url)
            .header("accept", "application/json")
            .timeout(Duration::from_secs(10))
            .send()?;
        if response.status >= 500 {
            return Err(Error::retryable(format!("{} answered {}", input.url, response.status)));
        }
        if !response.ok() {
            let start: String = response.text().chars().take(200).collect();
            return Err(Error::failed(format!("{} answered {}: {start}", input.url, response.status)));
        }
        let data: serde_json::Value = response.json()?;
        leash_sdk::progress(1, 1, "fetched");
        leash_sdk::log::info(&format!("{} answered {}", input.url, response.status));
        leash_sdk::json_output(&serde_json::json!({ "status": response.status, "data": data }))
    }
}

leash_sdk::export!(Fetcher);
