//! Plans: an `execute` phase that computes a change and proposes its
//! writes, and an `apply` phase that sends the approved ones.
//!
//! A plan's execute phase may read (safe methods) but not write: the host
//! refuses every effectful request it makes. It *proposes* each write
//! instead ([`propose`]); the host checks each against the job's grant as
//! if it were being sent and records it with the plan, where the person
//! approving the plan sees it. The apply phase may then send exactly the
//! approved proposals, each once; most apply phases are one call,
//! [`send_approved`].
//!
//! ```no_run
//! use leash_sdk::{http, plan, Context, Error, Plugin, Target};
//!
//! struct Sync;
//!
//! impl Plugin for Sync {
//!     fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, Error> {
//!         match ctx.target {
//!             Target::Execute => {
//!                 plan::propose(&http::Request::new("PUT", "https://store.example.com/records/a").body("1"))?;
//!                 leash_sdk::json_output(&serde_json::json!({ "changes": 1 }))
//!             }
//!             Target::Apply => {
//!                 let sent = plan::send_approved()?;
//!                 leash_sdk::json_output(&serde_json::json!({ "applied": sent.len() }))
//!             }
//!             Target::Action(_) => Err(Error::invalid_input("no actions")),
//!         }
//!     }
//! }
//!
//! leash_sdk::export!(Sync);
//! # fn main() {}
//! ```
use base64::Engine as _;

use super::Error;

use crate::bindings::leash::plugin::plan as wit;
use crate::http::{Request, Response};

/// Propose `request` as a write the apply phase makes once a person
/// approves the plan (the execute phase only). Its number, from 1; a
/// proposal the grant would refuse is [`Error::Failed`] with the host's
/// reason, and fails the phase even if the plugin carries on.
pub fn propose(request: &Request) -> Result<u32, Error> {
    let effect = wit::Effect {
        method: request.method().to_owned(),
        url: request.url().to_owned(),
        headers: request.headers().to_vec(),
        body: request.body_bytes().to_vec(),
    };
    wit::propose(&effect).map_err(|why| Error::failed(format!("proposal refused: {why}")))
}

/// The approved proposals not sent yet, in order, with their numbers (the
/// apply phase only; empty elsewhere). Each may be sent once, exactly as
/// proposed.
pub fn approved() -> Vec<(u32, Request)> {
    wit::approved()
        .into_iter()
        .map(|(n, e)| {
            let mut request = Request::new(&e.method, &e.url).body(e.body);
            for (name, value) in &e.headers {
                request = request.header(name, value);
            }
            (n, request)
        })
        .collect()
}

/// Send every approved proposal not sent yet, in order, and return the
/// responses by proposal number. A proposal answered with an error status
/// is [`Error::Failed`] (it counts as sent: it is not sent again); one
/// that got no response is [`Error::Retryable`] where sending it again may
/// work (a later attempt sends it with the same `Idempotency-Key`). Stops
/// early, failed, if the job is cancelled.
pub fn send_approved() -> Result<Vec<(u32, Response)>, Error> {
    let approved = approved();
    let total = approved.len() as u64;
    let mut sent = Vec::with_capacity(approved.len());
    for (i, (n, request)) in approved.into_iter().enumerate() {
        let shown = format!("proposal #{n} ({} {})", request.method(), request.url());
        let response = request.send().map_err(|e| {
            let message = format!("{shown}: {e}");
            if e.is_retryable() { Error::retryable(message) } else { Error::failed(message) }
        })?;
        if !response.ok() {
            return Err(Error::failed(format!(
                "{shown}: the upstream answered {}: {}",
                response.status,
                response.text()
            )));
        }
        sent.push((n, response));
        if crate::progress(i as u64 + 1, total, &shown) {
            return Err(Error::failed(format!("stopped after {} of {total} approved proposals", i + 1)));
        }
    }
    Ok(sent)
}

/// An apply phase's input: the plan's own input and what its execute
/// phase output (the change a person approved), as the host hands it
/// over (a JSON document, `leash_apply: 1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyInput {
    /// The plan.
    pub plan_id: String,
    /// The execute job whose output this is.
    pub execute_job_id: String,
    /// The plan's input bytes.
    pub input: Vec<u8>,
    /// The execute phase's output bytes.
    pub execute_output: Vec<u8>,
}

#[derive(serde::Deserialize)]
struct Wire {
    leash_apply: u32,
    plan_id: String,
    execute_job_id: String,
    input_base64: String,
    execute_output_base64: String,
}

impl ApplyInput {
    /// Read an apply phase's input; anything else is
    /// [`Error::InvalidInput`] (an apply job submitted by hand rather
    /// than by a plan, say).
    pub fn parse(input: &[u8]) -> Result<ApplyInput, Error> {
        let wire: Wire = serde_json::from_slice(input)
            .map_err(|e| Error::invalid_input(format!("not an apply input (is this job part of a plan?): {e}")))?;
        if wire.leash_apply != 1 {
            return Err(Error::invalid_input(format!("apply input version {} is not 1", wire.leash_apply)));
        }
        let decode = |field: &str, text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| Error::invalid_input(format!("apply input `{field}` is not base64: {e}")))
        };
        Ok(ApplyInput {
            input: decode("input_base64", &wire.input_base64)?,
            execute_output: decode("execute_output_base64", &wire.execute_output_base64)?,
            plan_id: wire.plan_id,
            execute_job_id: wire.execute_job_id,
        })
    }

    /// The plan's input, as JSON.
    pub fn input_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        super::json_input(&self.input)
    }

    /// What the execute phase output, as JSON.
    pub fn execute_output_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.execute_output)
            .map_err(|e| Error::invalid_input(format!("the execute output is not the JSON expected: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apply_input_reads_back_both_parts() {
        // As the host writes it (leash::job::ApplyInput).
        let wire = br#"{"leash_apply":1,"plan_id":"01P","execute_job_id":"01E","input":{"want":1},
            "input_base64":"eyJ3YW50IjoxfQ==","execute_output":null,"execute_output_base64":"/wA="}"#;
        let input = ApplyInput::parse(wire).unwrap();
        assert_eq!((input.plan_id.as_str(), input.execute_job_id.as_str()), ("01P", "01E"));
        assert_eq!(input.input, br#"{"want":1}"#);
        assert_eq!(input.execute_output, [0xff, 0x00]);
        assert_eq!(input.input_json::<serde_json::Value>().unwrap()["want"], 1);
        assert!(input.execute_output_json::<serde_json::Value>().is_err(), "binary output is not JSON");
        assert!(matches!(ApplyInput::parse(b"{\"name\":\"x\"}"), Err(Error::InvalidInput(_))));
        let newer =
            br#"{"leash_apply":2,"plan_id":"","execute_job_id":"","input_base64":"","execute_output_base64":""}"#;
        assert!(matches!(ApplyInput::parse(newer), Err(Error::InvalidInput(m)) if m.contains("version 2")));
    }
}
