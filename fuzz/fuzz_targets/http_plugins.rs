//! Arbitrary bodies (component bytes) and names for `POST /v1/plugins`.
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    // The first byte picks a query; the rest is the upload.
    let (pick, body) = input.split_first().unwrap_or((&0, &[]));
    let path = match pick % 4 {
        0 => "/v1/plugins",
        1 => "/v1/plugins?name=fuzz",
        2 => "/v1/plugins?name=fuzz&version=1.0.0",
        _ => "/v1/plugins?name=Bad%2F..%2Fname",
    };
    common::post(path, body);
});
