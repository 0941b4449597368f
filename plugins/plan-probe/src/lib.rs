//! A plan that tries what a careless or hostile one might, for the tests
//! of the plan fence: its input says what each phase does.
//!
//! Input (the plan's, JSON): `{"writes": [{"method": "PUT", "url": …,
//! "body": …}, …], "execute": "propose" | "post" | "propose_quietly",
//! "apply": "all" | "tamper" | "first"}`.
//!
//! Execute: `propose` proposes each write (a refusal fails the phase);
//! `propose_quietly` proposes each and ignores refusals (the host fails
//! the phase anyway); `post` sends the first write itself instead; `send`
//! sends every write itself (as a plain job does). Output:
//! `{"proposed": [numbers], "sent": [what each direct request got]}`.
//!
//! Apply: `all` sends every approved proposal; `tamper` first sends each
//! approved proposal altered (a body with `!` added, then a URL with a
//! query added), then the approved ones as they are; `first` sends only
//! the first. Output: `{"tampered": [what each altered request got],
//! "applied": n}`.

use leash_sdk::http::Request;
use leash_sdk::plan::{self, ApplyInput};
use leash_sdk::{Context, Error, Plugin, Target};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Write {
    method: String,
    url: String,
    #[serde(default)]
    body: String,
}

#[derive(Deserialize)]
struct Probe {
    writes: Vec<Write>,
    #[serde(default)]
    execute: String,
    #[serde(default)]
    apply: String,
}

/// What a request got: its status, or its error code.
fn got(request: Request) -> String {
    match request.send() {
        Ok(response) => response.status.to_string(),
        Err(e) => e.code,
    }
}

fn request(write: &Write) -> Request {
    Request::new(&write.method, &write.url).body(write.body.as_bytes())
}

fn execute(probe: &Probe) -> Result<serde_json::Value, Error> {
    let mut proposed = Vec::new();
    let mut sent = Vec::new();
    match probe.execute.as_str() {
        "post" => sent.extend(probe.writes.first().map(|w| got(request(w)))),
        "send" => sent.extend(probe.writes.iter().map(|w| got(request(w)))),
        "propose_quietly" => proposed.extend(probe.writes.iter().filter_map(|w| plan::propose(&request(w)).ok())),
        _ => {
            for w in &probe.writes {
                proposed.push(plan::propose(&request(w))?);
            }
        }
    }
    Ok(json!({ "proposed": proposed, "sent": sent }))
}

fn apply(probe: &Probe) -> Result<serde_json::Value, Error> {
    let mut tampered = Vec::new();
    match probe.apply.as_str() {
        "first" => {
            let first = plan::approved().into_iter().next();
            let applied = first.map(|(_, r)| got(r)).into_iter().count();
            return Ok(json!({ "tampered": tampered, "applied": applied }));
        }
        "tamper" => {
            for (i, (_, r)) in plan::approved().into_iter().enumerate() {
                let mut body = r.body_bytes().to_vec();
                let url = r.url().to_owned();
                let altered = if i % 2 == 0 {
                    body.push(b'!');
                    Request::new(r.method(), &url).body(body)
                } else {
                    Request::new(r.method(), &format!("{url}?also=1")).body(body)
                };
                let altered = r.headers().iter().fold(altered, |q, (k, v)| q.header(k, v));
                tampered.push(got(altered));
            }
        }
        _ => {}
    }
    let applied = plan::send_approved()?.len();
    Ok(json!({ "tampered": tampered, "applied": applied }))
}

struct PlanProbe;

impl Plugin for PlanProbe {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        match &ctx.target {
            Target::Execute => leash_sdk::json_output(&execute(&leash_sdk::json_input(&input)?)?),
            Target::Apply => leash_sdk::json_output(&apply(&ApplyInput::parse(&input)?.input_json()?)?),
            Target::Action(name) => Err(Error::invalid_input(format!("plan-probe has no action {name:?}"))),
        }
    }
}

leash_sdk::export!(PlanProbe);
