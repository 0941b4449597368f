//! Arbitrary config files: read, parsed and checked against the command
//! line's value parsers, or refused with a message — never a panic.
#![no_main]

use std::io::Write;

libfuzzer_sys::fuzz_target!(|text: &[u8]| {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text).unwrap();
    let path = file.path().to_owned();
    let args = ["leash", "worker", "--config", path.to_str().unwrap()].map(std::ffi::OsString::from).to_vec();
    let _ = leash::cli::Cli::parse_with_config(args);
});
