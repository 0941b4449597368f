//! `config-read`, declaring what it asks for (`leash_sdk::requests!`): the
//! config keys `greeting` and `region`, `POST` to one host, one secret. A
//! durable job of it gets only what is both declared and granted.

#[path = "../../config-read/src/lib.rs"]
mod read;

leash_sdk::requests!(
    r#"{"config": ["greeting", "region"], "hosts": ["POST https://hooks.example.com"], "secrets": ["HOOK_TOKEN"]}"#
);
