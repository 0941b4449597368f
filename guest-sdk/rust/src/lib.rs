//! Write leash plugins in Rust.
//!
//! A plugin is a WebAssembly component that implements the
//! `leash:plugin@0.1.1` world (see `wit/plugin.wit` and
//! `docs/plugin-contract.md`). This crate hides the generated bindings:
//! implement [`Plugin`], call [`export!`] once, and build with
//! `cargo build --release --target wasm32-wasip2`.
//!
//! ```no_run
//! use leash_sdk::{Context, Error, Plugin};
//!
//! #[derive(serde::Deserialize, Default)]
//! #[serde(default)]
//! struct Input {
//!     name: Option<String>,
//! }
//!
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
//!         let input: Input = leash_sdk::json_input_or_default(&input)?;
//!         let name = input.name.unwrap_or_else(|| "world".to_owned());
//!         leash_sdk::log::info(&format!("greeting {name} for job {}", ctx.job_id));
//!         leash_sdk::json_output(&serde_json::json!({ "greeting": format!("Hello, {name}!") }))
//!     }
//! }
//!
//! leash_sdk::export!(Hello);
//! # fn main() {}
//! ```
//!
//! The same program is `plugins/hello`, built and run by leash's tests.
//!
//! Expected failures go through [`Error`]; a panic becomes a trap that the
//! host reports as `trap`, with the panic message taken from stderr.
//!
//! [`http`] sends requests upstream, as the job's grant allows.
//!
//! This crate depends only on `wit-bindgen` and serde; it knows nothing of
//! the host.

use std::fmt;

pub mod http;

#[doc(hidden)]
#[allow(clippy::too_many_arguments, reason = "generated code: one parameter per lowered WIT value")]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        // `plugin` and outbound HTTP; a component imports only what its
        // code calls, so a plugin that never uses `http` imports no
        // wasi:http.
        world: "leash:plugin/plugin-http",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "export_world",
        default_bindings_module: "leash_sdk::bindings",
    });
}

use bindings::leash::plugin::host;
use bindings::leash::plugin::types;

/// What a job asks the plugin to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The plan's execute phase.
    Execute,
    /// The plan's apply phase.
    Apply,
    /// A named action.
    Action(String),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Execute => f.write_str("execute"),
            Target::Apply => f.write_str("apply"),
            Target::Action(name) => write!(f, "action:{name}"),
        }
    }
}

/// Facts about the running job.
#[derive(Debug, Clone)]
pub struct Context {
    /// The job's id (a ULID); empty for a one-shot `leash run`.
    pub job_id: String,
    /// The phase or action requested.
    pub target: Target,
    /// 1 for the first attempt, 2 for the first retry, and so on.
    pub attempt: u32,
    /// Wall-clock deadline in milliseconds since the Unix epoch (UTC).
    pub deadline_unix_ms: u64,
}

/// An expected failure. Returning one is not a crash: the host records it
/// as `guest_error` (or `invalid_input`) with this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The work failed and retrying will not help.
    Failed(String),
    /// The input was malformed or unacceptable.
    InvalidInput(String),
    /// A transient failure; running the job again may succeed.
    Retryable(String),
}

impl Error {
    /// A permanent failure with this message.
    pub fn failed(message: impl fmt::Display) -> Self {
        Error::Failed(message.to_string())
    }

    /// A rejection of the input with this message.
    pub fn invalid_input(message: impl fmt::Display) -> Self {
        Error::InvalidInput(message.to_string())
    }

    /// A transient failure with this message.
    pub fn retryable(message: impl fmt::Display) -> Self {
        Error::Retryable(message.to_string())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Failed(m) => write!(f, "failed: {m}"),
            Error::InvalidInput(m) => write!(f, "invalid input: {m}"),
            Error::Retryable(m) => write!(f, "retryable: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// The one trait a plugin implements.
pub trait Plugin {
    /// Run one job on `input` and return the output bytes.
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error>;
}

/// Decode JSON input, rejecting malformed input as [`Error::InvalidInput`].
pub fn json_input<T: serde::de::DeserializeOwned>(input: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(input)
        .map_err(|e| Error::invalid_input(format!("input is not valid JSON for this plugin: {e}")))
}

/// Like [`json_input`], but empty input gives `T::default()`.
pub fn json_input_or_default<T: serde::de::DeserializeOwned + Default>(input: &[u8]) -> Result<T, Error> {
    if input.iter().all(u8::is_ascii_whitespace) { Ok(T::default()) } else { json_input(input) }
}

/// Encode a value as JSON output.
pub fn json_output<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(value).map_err(|e| Error::failed(format!("cannot encode output as JSON: {e}")))
}

pub mod plan;

/// Report progress: `done` of `total` units, with a short note. Returns
/// true when the plugin should stop (the job was cancelled or its worker is
/// shutting down); the host stops it by force after a grace period.
pub fn progress(done: u64, total: u64, note: &str) -> bool {
    host::progress(done, total, note)
}

/// True once the job has been asked to stop.
pub fn cancelled() -> bool {
    host::cancelled()
}

/// Structured logging to the host. Records past the host's cap are counted
/// and dropped; logging never fails.
pub mod log {
    use super::host;

    pub use super::host::Level;

    /// Log `message` with key/value fields.
    pub fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
        let fields: Vec<(String, String)> = fields.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        host::log(level, message, &fields);
    }

    /// Log at debug level.
    pub fn debug(message: &str) {
        log(Level::Debug, message, &[]);
    }

    /// Log at info level.
    pub fn info(message: &str) {
        log(Level::Info, message, &[]);
    }

    /// Log at warn level.
    pub fn warn(message: &str) {
        log(Level::Warn, message, &[]);
    }

    /// Log at error level.
    pub fn error(message: &str) {
        log(Level::Error, message, &[]);
    }
}

/// Export a type implementing [`Plugin`] as the component's `run` entry
/// point. Call it once, at the crate root of a `cdylib`.
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        const _: () = {
            struct LeashExport;

            impl $crate::bindings::Guest for LeashExport {
                fn run(
                    ctx: $crate::bindings::leash::plugin::types::JobContext,
                    input: ::std::vec::Vec<u8>,
                ) -> ::std::result::Result<::std::vec::Vec<u8>, $crate::bindings::leash::plugin::types::JobError>
                {
                    $crate::__run::<$plugin>(ctx, input)
                }
            }

    $crate::bindings::export_world!(LeashExport with_types_in $crate::bindings);
        };
    };
}

/// Declare what the plugin asks its host for outside the sandbox, as
/// JSON: `{"hosts": ["POST https://api.example.com", ...], "config":
/// ["key", ...], "secrets": ["NAME", ...]}` (every field optional; host
/// rules in the operator's grant syntax). It is embedded in the component
/// as the custom section `leash:requests`; a durable job of a registered
/// plugin that declares it gets only what is both declared and granted.
/// Without a declaration a job gets what the operator grants.
///
/// ```no_run
/// leash_sdk::requests!(r#"{"config": ["greeting"]}"#);
/// ```
#[macro_export]
macro_rules! requests {
    ($json:literal) => {
        #[used]
        #[unsafe(link_section = "leash:requests")]
        static __LEASH_REQUESTS: [u8; $json.len()] = {
            let bytes = $json.as_bytes();
            let mut out = [0u8; $json.len()];
            let mut i = 0;
            while i < bytes.len() {
                out[i] = bytes[i];
                i += 1;
            }
            out
        };
    };
}

#[doc(hidden)]
pub fn __run<P: Plugin>(ctx: types::JobContext, input: Vec<u8>) -> Result<Vec<u8>, types::JobError> {
    let ctx = Context {
        job_id: ctx.job_id,
        target: match ctx.target {
            types::Target::Execute => Target::Execute,
            types::Target::Apply => Target::Apply,
            types::Target::Action(name) => Target::Action(name),
        },
        attempt: ctx.attempt,
        deadline_unix_ms: ctx.deadline_unix_ms,
    };
    P::run(&ctx, input).map_err(|e| match e {
        Error::Failed(m) => types::JobError::Failed(m),
        Error::InvalidInput(m) => types::JobError::InvalidInput(m),
        Error::Retryable(m) => types::JobError::Retryable(m),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Default, Debug, PartialEq)]
    struct In {
        n: u32,
    }

    #[test]
    fn empty_input_decodes_to_default() {
        assert_eq!(json_input_or_default::<In>(b"  \n").unwrap(), In::default());
    }

    #[test]
    fn malformed_input_is_invalid_input_not_a_panic() {
        let err = json_input::<In>(b"{\"n\": \"x\"}").unwrap_err();
        assert!(matches!(err, Error::InvalidInput(ref m) if m.contains("not valid JSON")), "{err}");
    }

    #[test]
    fn json_output_round_trips() {
        let bytes = json_output(&serde_json::json!({"a": 1})).unwrap();
        assert_eq!(bytes, br#"{"a":1}"#);
    }
}
