//! Every numeric field of `POST /v1/jobs` at and around its extremes: each
//! field is absent, a fuzzed integer, a boundary (0, 1, 2^32, 2^53, 2^63,
//! u64::MAX), negative, fractional or huge. Whatever is accepted must read
//! back (the job and a list page with it); whatever is refused is a 4xx.
#![no_main]

#[path = "common.rs"]
mod common;

const FIELDS: [&str; 6] = ["timeout_ms", "fuel", "memory_bytes", "output_bytes", "max_attempts", "queue_ttl_ms"];
const BOUNDARIES: [u64; 8] = [0, 1, u32::MAX as u64, 1 << 32, 1 << 53, (1 << 53) + 1, 1 << 63, u64::MAX];

libfuzzer_sys::fuzz_target!(|choices: [(u8, u64); 6]| {
    let mut body = serde_json::json!({ "plugin": "hello", "execution": "async" });
    for (field, (how, n)) in FIELDS.into_iter().zip(choices) {
        let value = match how % 7 {
            0 => continue,
            1 => serde_json::json!(n),
            2 => serde_json::json!(BOUNDARIES[n as usize % BOUNDARIES.len()]),
            3 => serde_json::json!(-((n % i64::MAX as u64) as i64) - 1),
            4 => serde_json::json!(n as f64 / 3.0),
            5 => serde_json::json!(f64::MAX),
            _ => serde_json::json!(BOUNDARIES[n as usize % BOUNDARIES.len()].saturating_sub(1)),
        };
        body[field] = value;
    }
    common::post("/v1/jobs", body.to_string().as_bytes());
});
