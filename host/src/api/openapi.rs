//! The OpenAPI 3.1 document of the `/v1` API, generated from the route and
//! body types ([`utoipa`]): served at `GET /v1/openapi.json`, and checked
//! into `docs/openapi.json` (a test keeps the two equal).
//!
//! Types that travel as text (ids, digests, targets, instants) get their
//! string schemas here; the rest derive theirs where they are defined.

use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{KnownFormat, RefOr};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use crate::clock::Timestamp;
use crate::job::approval::TargetPattern;
use crate::job::{Digest, EventId, JobId, PluginInfo, Target};

fn text(description: &str, pattern: Option<&str>, format: Option<SchemaFormat>) -> RefOr<Schema> {
    ObjectBuilder::new().schema_type(Type::String).description(Some(description)).pattern(pattern).format(format).into()
}

impl PartialSchema for JobId {
    fn schema() -> RefOr<Schema> {
        text("A job id: a canonical ULID.", Some("^[0-7][0-9A-HJKMNP-TV-Z]{25}$"), None)
    }
}
impl ToSchema for JobId {}

impl PartialSchema for Digest {
    fn schema() -> RefOr<Schema> {
        text("A plugin's sha256 digest.", Some("^sha256:[0-9a-f]{64}$"), None)
    }
}
impl ToSchema for Digest {}

impl PartialSchema for Target {
    fn schema() -> RefOr<Schema> {
        text("`execute`, `apply` or `action:<name>`.", Some("^(execute|apply|action:[a-z0-9_.-]{1,64})$"), None)
    }
}
impl ToSchema for Target {}

impl PartialSchema for TargetPattern {
    fn schema() -> RefOr<Schema> {
        text(
            "A gated target: `*` (every one), `execute`, `apply`, `action:*` or `action:<name>`.",
            Some(r"^(\*|all|execute|apply|action:(\*|[a-z0-9_.-]{1,64}))$"),
            None,
        )
    }
}
impl ToSchema for TargetPattern {}

impl PartialSchema for EventId {
    fn schema() -> RefOr<Schema> {
        text(
            "An event's place in the stream: send the last one back as `Last-Event-ID` to resume after it.",
            Some("^[0-9]{1,20}-[0-9]{1,20}$"),
            None,
        )
    }
}
impl ToSchema for EventId {}

impl PartialSchema for Timestamp {
    fn schema() -> RefOr<Schema> {
        text("A UTC instant, RFC 3339 with milliseconds.", None, Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
    }
}
impl ToSchema for Timestamp {}

/// Written by hand: its name and version are flattened from an optional
/// pair, which derived schemas cannot say (absent, not `null`).
impl PartialSchema for PluginInfo {
    fn schema() -> RefOr<Schema> {
        let name = text("Registry name; absent for bytes stored without one.", None, None);
        let version = text("Version; absent for bytes stored without a name.", None, None);
        let size = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(0))
            .description(Some("Component size, bytes."));
        ObjectBuilder::new()
            .description(Some("A stored plugin: its digest and, if registered, its name."))
            .property("name", name)
            .property("version", version)
            .property("digest", Digest::schema())
            .required("digest")
            .property("size_bytes", size)
            .required("size_bytes")
            .property("created_at", Timestamp::schema())
            .required("created_at")
            .property("grants", crate::job::Grants::schema())
            .property("approval", crate::job::ApprovalPolicy::schema())
            .property("requests", crate::job::grant::Requests::schema())
            .into()
    }
}
impl ToSchema for PluginInfo {}

/// Every route but `/healthz` takes `Authorization: Bearer <token>`.
struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(title = "leash", description = "Durable, leased jobs inside WebAssembly sandboxes: the HTTP API of `leash serve`."),
    paths(
        super::plugins::plugin_upload,
        super::plugins::plugin_list,
        super::plugins::plugin_show,
        super::plugins::plugin_grants,
        super::plugins::plugin_approval,
        super::pauses::plugin_pause,
        super::pauses::plugin_resume,
        super::pauses::pause_list,
        super::rate_limits::rate_limit_set,
        super::rate_limits::rate_limit_list,
        super::rate_limits::rate_limit_show,
        super::rate_limits::rate_limit_remove,
        super::schedules::schedule_add,
        super::schedules::schedule_list,
        super::schedules::schedule_show,
        super::schedules::schedule_remove,
        super::schedules::schedule_pause,
        super::schedules::schedule_resume,
        super::schedules::schedule_trigger,
        super::jobs::job_submit,
        super::jobs::job_batch,
        super::list::job_list,
        super::jobs::job_show,
        super::jobs::job_logs,
        super::jobs::job_why,
        super::jobs::job_attempts,
        super::jobs::job_effects,
        super::jobs::job_input,
        super::jobs::job_output,
        super::jobs::job_cancel,
        super::redrive::job_retry,
        super::redrive::jobs_retry,
        super::jobs::job_approve,
        super::jobs::job_reject,
        super::jobs::job_run,
        super::plans::plan_submit,
        super::plans::plan_list,
        super::plans::plan_show,
        super::plans::plan_approve,
        super::plans::plan_reject,
        super::plans::plan_cancel,
        super::events::events,
        super::health::health,
        super::health::workers,
        super::access::whoami,
        super::access::principal_list,
        super::access::principal_put,
        super::access::principal_remove,
        super::access::token_create,
        super::access::token_list,
        super::access::token_revoke,
        super::audit::audit_list,
        super::audit::audit_head,
        super::rules::rule_list,
        super::rules::rule_show,
        super::rules::rule_revoke,
        super::openapi_json,
    ),
    modifiers(&BearerToken),
    security(("bearer" = []))
)]
#[derive(Debug)]
pub struct ApiDoc;

/// The document as JSON, pretty-printed (as `docs/openapi.json` holds it).
pub fn document_json() -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    plain_references(&mut doc);
    serde_json::to_string_pretty(&doc).expect("the document serializes")
}

/// A field of a struct type with a default is written by utoipa as a
/// one-branch `oneOf` around the `$ref`, with the whole default object
/// beside it; client generators (openapi-python-client) cannot read that
/// and drop every schema that holds one. Written here as the plain
/// reference, with its description: the referenced schema's own fields
/// carry their defaults.
fn plain_references(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let single = map.get("oneOf").and_then(|o| o.as_array()).filter(|o| o.len() == 1).cloned();
            if let Some(branch) = single.and_then(|mut o| o.pop()).filter(|b| b.get("$ref").is_some()) {
                map.remove("oneOf");
                map.remove("default");
                if let serde_json::Value::Object(branch) = branch {
                    for (key, entry) in branch {
                        map.entry(key).or_insert(entry);
                    }
                }
            }
            map.values_mut().for_each(plain_references);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(plain_references),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/openapi.json` is the document the code generates. After an API
    /// change, regenerate it: `LEASH_WRITE_OPENAPI=1 cargo test -p leash --lib openapi`.
    #[test]
    fn the_checked_in_document_is_the_generated_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let generated = document_json() + "\n";
        if std::env::var_os("LEASH_WRITE_OPENAPI").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(checked_in == generated, "docs/openapi.json is stale: regenerate it with LEASH_WRITE_OPENAPI=1");
    }

    /// Nothing in the document that standard validators and client
    /// generators refuse: a default that is not the field's own type (a
    /// `Duration` written as `{"secs", "nanos"}`), a tuple schema
    /// (`prefixItems` with `items: false`), a one-branch `oneOf`. CI also
    /// runs openapi-spec-validator and generates clients from it
    /// (`tests/clients.sh`).
    #[test]
    fn the_document_has_nothing_client_generators_refuse() {
        let text = document_json();
        for needle in ["\"secs\"", "\"nanos\"", "prefixItems", "\"items\": false"] {
            assert!(!text.contains(needle), "the document holds {needle}");
        }
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        fn one_branch(value: &serde_json::Value) -> bool {
            match value {
                serde_json::Value::Object(map) => {
                    map.get("oneOf").and_then(|o| o.as_array()).is_some_and(|o| o.len() == 1)
                        || map.values().any(one_branch)
                }
                serde_json::Value::Array(items) => items.iter().any(one_branch),
                _ => false,
            }
        }
        assert!(!one_branch(&doc), "a one-branch oneOf");
        let limits = &doc["components"]["schemas"]["HttpLimits"]["properties"]["request_timeout_ms"];
        assert_eq!(limits["default"], 60_000, "{limits}");
    }

    /// utoipa takes only literals for bounds, so the document repeats the
    /// code's ceilings: this keeps the two in step.
    #[test]
    fn the_documented_bounds_are_the_codes_defaults() {
        use crate::job::{MAX_ATTEMPTS_CEILING, MAX_KEY_BYTES};
        use crate::runtime::{DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_QUEUE_TTL, DEFAULT_MAX_TIMEOUT};
        use crate::sandbox::DEFAULT_MEMORY_CEILING_BYTES;
        let doc: serde_json::Value = serde_json::from_str(&document_json()).unwrap();
        let body = &doc["components"]["schemas"]["SubmitRequest"]["properties"];
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        let bounds = [
            ("timeout_ms", "maximum", ms(DEFAULT_MAX_TIMEOUT)),
            ("memory_bytes", "maximum", DEFAULT_MEMORY_CEILING_BYTES),
            ("output_bytes", "maximum", DEFAULT_MAX_OUTPUT_BYTES),
            ("max_attempts", "maximum", u64::from(MAX_ATTEMPTS_CEILING)),
            ("queue_ttl_ms", "maximum", ms(DEFAULT_MAX_QUEUE_TTL)),
            ("concurrency_key", "maxLength", MAX_KEY_BYTES as u64),
            ("plan_id", "maxLength", MAX_KEY_BYTES as u64),
        ];
        for (field, bound, value) in bounds {
            assert_eq!(body[field][bound], value, "{field}.{bound}");
        }
        let limit = doc["paths"]["/v1/jobs"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "limit")
            .unwrap()
            .clone();
        assert_eq!(limit["schema"]["maximum"], super::super::MAX_PAGE);
    }

    #[test]
    fn every_route_of_the_router_is_documented() {
        let doc = ApiDoc::openapi();
        let paths: Vec<&String> = doc.paths.paths.keys().collect();
        for route in [
            "/v1/plugins",
            "/v1/plugins/{reference}",
            "/v1/jobs",
            "/v1/jobs/{id}",
            "/v1/jobs/{id}/logs",
            "/v1/jobs/{id}/why",
            "/v1/events",
            "/v1/jobs/{id}/output",
            "/v1/jobs/{id}/cancel",
            "/v1/jobs/{id}/approve",
            "/v1/jobs/{id}/reject",
            "/v1/jobs/{id}/run",
            "/v1/plugins/{reference}/approval",
            "/v1/plans",
            "/v1/plans/{id}",
            "/v1/plans/{id}/approve",
            "/v1/plans/{id}/reject",
            "/v1/plans/{id}/cancel",
            "/v1/health",
            "/v1/openapi.json",
            "/v1/whoami",
            "/v1/principals",
            "/v1/principals/{name}",
            "/v1/tokens",
            "/v1/tokens/{id}/revoke",
        ] {
            assert!(paths.iter().any(|p| *p == route), "{route} is not documented: {paths:?}");
        }
    }
}
