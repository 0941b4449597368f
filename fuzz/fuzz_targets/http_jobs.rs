//! Arbitrary bodies for `POST /v1/jobs`.
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    common::post("/v1/jobs", body);
});
