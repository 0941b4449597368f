//! The guest SDK's input decoding on arbitrary bytes: a value or an
//! `invalid-input` error, never a panic.
#![no_main]

#[derive(Debug, Default, serde::Deserialize)]
#[allow(dead_code)]
struct Input {
    name: Option<String>,
    steps: Option<u64>,
    tags: Vec<String>,
}

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    let _ = leash_sdk::json_input::<serde_json::Value>(input);
    match leash_sdk::json_input_or_default::<Input>(input) {
        Ok(_) => {}
        Err(e) => assert!(matches!(e, leash_sdk::Error::InvalidInput(_)), "{e:?}"),
    }
});
